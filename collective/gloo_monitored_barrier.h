// The body of GlooProcessGroup::monitored_barrier (torch's
// monitored_barrier): rank 0 hears from every other rank within `timeout`,
// then tells each rank that arrived whether all did. Internal to
// //collective:gloo; runs on the group's op thread.
//
// Errors: TimeoutError naming the ranks that did not arrive (all of them
// with `wait_all_ranks`, else the first), on rank 0 and on every rank that
// arrived; what Gloo throws when a connection fails.
// Ownership: receives that were given up on stay posted in Gloo; they go
// to `kept` with the bytes they write to, which must outlive the group's
// connections.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Context;
}
namespace gloo::transport {
class UnboundBuffer;
}

namespace switchboard::collective {

// A receive that stays posted in Gloo, and the bytes it writes to.
struct PostedRecv {
  std::unique_ptr<uint8_t[]> bytes;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // destroyed first
};

void run_monitored_barrier(const std::shared_ptr<gloo::rendezvous::Context>& context,
                           uint32_t tag, std::chrono::milliseconds timeout,
                           bool wait_all_ranks, const std::string& where,
                           std::vector<PostedRecv>& kept);

}  // namespace switchboard::collective
