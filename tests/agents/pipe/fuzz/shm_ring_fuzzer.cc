// libFuzzer target for the same-host lane's ring (agents/pipe/transport/shm/shm_ring.h) under
// a hostile writer. The segment is a heap block of exactly the ring's size,
// so that AddressSanitizer reports any read or write outside it.
//
// Input: byte 0 picks the capacity (4 KiB to 64 KiB); byte 1 corrupts the
// header before the reader validates it (bit 0: magic, bit 1: capacity,
// bit 2: version); the rest is a list of operations, each an opcode byte
// and 8 value bytes:
//   0  the peer sets head to the value
//   1  the peer sets head to our position plus the value modulo 2 * capacity
//   2  the peer writes the next (value % 64) input bytes at data offset value
//   3  we read what readable() offers into a frame reader and consume it
//      (all, or value % (n + 1) bytes when bit 63 is set)
//   4  the peer sets tail to the value, then we write value % 300 bytes
//   5  the peer marks the ring closed
// Checks beyond "no crash, no sanitizer report": readable() offers only
// bytes inside the data area; only ShmRingCorrupt and the frame reader's
// ProtocolError escape.
#include "tests/agents/pipe/fuzz/shm_ring_fuzzer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "agents/pipe/transport/shm/shm_ring.h"
#include "agents/pipe/wire/frame.h"
#include "common/error.h"
#include "tests/agents/pipe/fuzz/fuzz_check.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;

namespace {


// Byte offsets of the header's fields, as the peer sees them (the layout
// of docs/wire_formats.md, "Same-host lane").
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
constexpr size_t kCapacityAt = 8;
constexpr size_t kHeadAt = 64;
constexpr size_t kTailAt = 128;
constexpr size_t kClosedAt = 192;

uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void poke64(uint8_t* base, size_t at, uint64_t v) {
  reinterpret_cast<std::atomic<uint64_t>*>(base + at)->store(v, std::memory_order_release);
}

void poke32(uint8_t* base, size_t at, uint32_t v) {
  reinterpret_cast<std::atomic<uint32_t>*>(base + at)->store(v, std::memory_order_release);
}

pipe::wire::FrameLimits small_limits() {
  pipe::wire::FrameLimits limits;
  limits.max_function_length = 256;
  limits.max_payload_bytes = 64 * 1024;
  limits.max_tensors = 16;
  limits.max_tensor_bytes = 1 << 20;
  return limits;
}

struct Free {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t capacity = size_t{4096} << (data[0] % 5);
  const size_t bytes = ShmRing::kHeaderBytes + capacity;
  std::unique_ptr<uint8_t, Free> block(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  FUZZ_CHECK(block != nullptr);
  uint8_t* base = block.get();
  std::memset(base, 0, bytes);
  ShmSegment segment = ShmSegment::borrow(base, bytes);
  ShmRing producer(segment, ShmRing::kProducer);
  if (data[1] & 1) poke32(base, kMagicAt, 0xdeadbeef);
  if (data[1] & 2) poke64(base, kCapacityAt, capacity * 2);
  if (data[1] & 4) poke32(base, kVersionAt, 7);
  std::unique_ptr<ShmRing> consumer;
  try {
    consumer = std::make_unique<ShmRing>(segment, ShmRing::kConsumer);
  } catch (const ShmRingCorrupt&) {
    FUZZ_CHECK((data[1] & 7) != 0);
    return 0;
  }
  FUZZ_CHECK((data[1] & 7) == 0);
  pipe::wire::FrameReader reader(small_limits(), nullptr);
  pipe::wire::InboundFrame frame;
  uint64_t ours = 0;  // the reader's position, as the fuzzer tracks it
  bool reader_failed = false;
  size_t at = 2;
  const std::vector<uint8_t> junk(300, 0xab);
  while (at + 9 <= size) {
    const uint8_t op = data[at];
    const uint64_t value = read64(data + at + 1);
    at += 9;
    try {
      switch (op % 6) {
        case 0:
          poke64(base, kHeadAt, value);
          break;
        case 1:
          poke64(base, kHeadAt, ours + value % (2 * capacity));
          break;
        case 2: {
          const size_t n = std::min<size_t>(value % 64, size - at);
          const size_t offset = value % capacity;
          const size_t first = std::min(n, capacity - offset);
          std::memcpy(base + ShmRing::kHeaderBytes + offset, data + at, first);
          std::memcpy(base + ShmRing::kHeaderBytes, data + at + first, n - first);
          at += n;
          break;
        }
        case 3: {
          auto [p, n] = consumer->readable();
          const uint8_t* area = base + ShmRing::kHeaderBytes;
          FUZZ_CHECK(n <= capacity);
          FUZZ_CHECK(n == 0 || (p >= area && p + n <= area + capacity));
          size_t take = (value >> 63) != 0 ? value % (n + 1) : n;
          // The lane hands what it read to the frame reader, as TCP would.
          size_t fed = 0;
          while (!reader_failed && fed < take) {
            try {
              auto [buffer, room] = reader.next_buffer();
              const size_t k = std::min(room, take - fed);
              std::memcpy(buffer, p + fed, k);
              reader.commit(k);
              fed += k;
              while (reader.pop(frame)) {
              }
            } catch (const ProtocolError&) {
              reader_failed = true;
            }
          }
          consumer->consume(take);
          ours += take;
          break;
        }
        case 4: {
          poke64(base, kTailAt, value);
          (void)producer.write_some(junk.data(), value % junk.size());
          break;
        }
        case 5:
          poke32(base, kClosedAt, 1);
          FUZZ_CHECK(consumer->closed());
          break;
      }
    } catch (const ShmRingCorrupt&) {
      // What the lane does: close the connection. Nothing is read after.
      return 0;
    }
  }
  return 0;
}
