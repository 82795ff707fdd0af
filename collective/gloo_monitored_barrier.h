// The body of GlooProcessGroup::monitored_barrier (torch's
// monitored_barrier): rank 0 hears from every other rank within `timeout`,
// then tells each rank that arrived whether all did. Internal to
// //collective:gloo; runs on the group's op thread.
//
// Errors: TimeoutError naming the ranks that did not arrive (all of them
// with `wait_all_ranks`, else the first), on rank 0 and on every rank that
// arrived; what Gloo throws when a connection fails.
// Ownership: receives that were given up on stay posted in Gloo; their
// buffers go to `kept`, which must outlive the group's connections.
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

void run_monitored_barrier(const std::shared_ptr<gloo::rendezvous::Context>& context,
                           uint32_t tag, std::chrono::milliseconds timeout,
                           bool wait_all_ranks, const std::string& where,
                           std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& kept);

}  // namespace switchboard::collective
