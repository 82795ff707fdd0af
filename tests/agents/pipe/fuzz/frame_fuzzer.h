// The PIPE frame fuzz target's entry points, shared by the libFuzzer build
// (tests/agents/pipe/fuzz/fuzz_pipe_frame) and the brief fuzz run in the normal test
// suite (tests/agents/pipe/wire/frame_fuzz_smoke_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

// Runs one input (byte 0: control; the rest: a byte stream). Returns 0.
// Throws (libFuzzer: aborts) when a check fails or anything but ProtocolError
// escapes the codec.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Valid and nearly valid inputs to start from: each a control byte followed
// by frames made with the encoder.
std::vector<std::vector<uint8_t>> pipe_frame_fuzz_seeds();
