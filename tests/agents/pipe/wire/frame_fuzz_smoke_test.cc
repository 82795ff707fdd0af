// The brief fuzz run of the normal test suite: the PIPE frame fuzz target
// (tests/agents/pipe/fuzz/frame_fuzzer.cc, compiled here without libFuzzer)
// fed its seeds and 20,000 deterministic mutations of them. The long run
// with sanitizers and coverage guidance is tests/agents/pipe/fuzz/fuzz_pipe_frame.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "tests/agents/pipe/fuzz/frame_fuzzer.h"

namespace {

using Bytes = std::vector<uint8_t>;

std::string hex(const Bytes& bytes) {
  std::string out;
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

// Values that sit on the codec's boundaries (lengths, limits, signs).
constexpr uint32_t kInteresting[] = {
    0,      1,       2,       7,        8,          16,        24,     32,
    33,     64,      65,      255,      256,        257,       0x7fff, 0x8000,
    0xffff, 0x10000, 0x10001, 0x100000, 0x7fffffff, 0xffffffff};

class Mutator {
 public:
  explicit Mutator(const std::vector<Bytes>& seeds) : seeds_(seeds) {}

  Bytes next() {
    Bytes b = seeds_[below(seeds_.size())];
    for (size_t k = 0, n = 1 + below(4); k < n; ++k) mutate(b);
    return b;
  }

 private:
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  void mutate(Bytes& b) {
    if (b.empty()) b.push_back(0);
    switch (below(9)) {
      case 0:  // flip a bit
        b[below(b.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // a random byte
        b[below(b.size())] = static_cast<uint8_t>(rng_());
        break;
      case 2:  // a header-like field gets a boundary value
      case 3: {
        if (b.size() < 5) break;
        const uint32_t v = kInteresting[below(std::size(kInteresting))];
        const size_t at = below(b.size() - 4);
        for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      case 4: {  // insert random bytes
        const size_t at = below(b.size() + 1);
        Bytes extra(1 + below(16));
        for (auto& x : extra) x = static_cast<uint8_t>(rng_());
        b.insert(b.begin() + static_cast<ptrdiff_t>(at), extra.begin(), extra.end());
        break;
      }
      case 5: {  // erase a range
        const size_t at = below(b.size());
        const size_t n = std::min(b.size() - at, 1 + below(64));
        b.erase(b.begin() + static_cast<ptrdiff_t>(at),
                b.begin() + static_cast<ptrdiff_t>(at + n));
        break;
      }
      case 6: {  // splice in part of another seed
        const Bytes& other = seeds_[below(seeds_.size())];
        const size_t from = 1 + below(other.size() - 1);
        b.insert(b.end(), other.begin() + static_cast<ptrdiff_t>(from), other.end());
        break;
      }
      case 7:  // truncate
        b.resize(1 + below(b.size()));
        break;
      default:  // another chunking and allocator
        b[0] = static_cast<uint8_t>(rng_());
        break;
    }
  }

  const std::vector<Bytes>& seeds_;
  std::mt19937_64 rng_{0x5b1e5eed};
};

// Runs one input; on anything escaping, fails naming the input in hex (save
// it with xxd -r -p to reproduce under tests/agents/pipe/fuzz/fuzz_pipe_frame's binary).
void run(const Bytes& input) {
  try {
    LLVMFuzzerTestOneInput(input.data(), input.size());
  } catch (const std::exception& e) {
    FAIL("escaped: " << e.what() << "\ninput: " << hex(input));
  }
}

}  // namespace

TEST_CASE("the PIPE frame fuzz target survives its seeds and 20,000 mutations",
          "[pipe_frame][fuzz]") {
  const std::vector<Bytes> seeds = pipe_frame_fuzz_seeds();
  REQUIRE(seeds.size() >= 8);
  for (const Bytes& seed : seeds) run(seed);
  Mutator mutator(seeds);
  for (int i = 0; i < 20'000; ++i) run(mutator.next());
  run({});
  run({0x01});
}
