// The shared-memory ring's fuzz target: a hostile peer process, played by
// the input, writes whatever it likes into the ring's header and data
// while this side reads (and writes) through ShmRing. Shared by the
// libFuzzer build (tests/agents/pipe/fuzz/fuzz_shm_ring) and the brief run in the normal
// test suite (tests/agents/pipe/transport/shm/ring_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

// Runs one input. Returns 0. Throws (libFuzzer: aborts) when a check fails
// or anything but ShmRingCorrupt or a frame ProtocolError escapes.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
