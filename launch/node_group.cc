#include "launch/node_group.h"

#include <fmt/format.h>

#include <vector>

#include "common/error.h"
#include "launch/child.h"

namespace switchboard::launch {

namespace {

// How often a launcher says it is alive (and node 0 looks at the others).
constexpr std::chrono::seconds kHeartbeatInterval{1};

}  // namespace

bool NodeGroup::join(uint16_t port,
                     const std::function<bool(std::chrono::milliseconds)>& wait) {
  const TimePoint deadline = Clock::now() + options_.join_timeout;
  const std::string at = fmt::format("{}:{}", options_.master_addr, port);
  std::string last_error;
  while (!link_) {
    try {
      link_ = std::make_unique<NodeLink>(options_, port, secret_);
    } catch (const AuthenticationError& e) {
      // Another secret than the job's: trying again cannot help.
      fmt::print(stderr, "launch: node {}: cannot reach the job's store at {}: {}\n",
                 options_.node_rank, at, e.what());
      return false;
    } catch (const std::exception& e) {
      last_error = e.what();
      if (Clock::now() >= deadline) {
        fmt::print(stderr,
                   "launch: node {}: cannot reach the job's store at {} within {} ({})\n",
                   options_.node_rank, at, seconds(options_.join_timeout), last_error);
        return false;
      }
      if (!wait(options_.monitor_interval)) return false;
    }
  }
  try {
    link_->announce();
    fmt::print(stderr, "launch: node {} of {}: waiting for the other nodes at {}\n",
               options_.node_rank, options_.nnodes, at);
    for (;;) {
      if (auto failure = link_->failure()) {
        first_failure_ = *failure;
        fmt::print(stderr, "launch: node {}: the job failed before it started\n",
                   options_.node_rank);
        return false;
      }
      const std::vector<int> missing = link_->missing();
      if (missing.empty()) return true;
      if (Clock::now() >= deadline) {
        report_failure(
            fmt::format("node(s) {} did not arrive within {} (seen from node {})",
                        fmt::join(missing, ", "), seconds(options_.join_timeout),
                        options_.node_rank));
        return false;
      }
      if (!wait(options_.monitor_interval)) return false;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "launch: node {}: the job's store at {} failed: {}\n",
               options_.node_rank, at, e.what());
    link_.reset();
    return false;
  }
}

void NodeGroup::lose() {
  link_.reset();
  nodes_done_ = true;
}

void NodeGroup::report_failure(const std::string& what) {
  if (!link_) {
    if (first_failure_.empty()) first_failure_ = what;
    return;
  }
  try {
    first_failure_ = link_->report_failure(what);
  } catch (const std::exception& e) {
    if (first_failure_.empty()) first_failure_ = what;
    fmt::print(stderr, "launch: node {}: cannot record the failure in the store: {}\n",
               options_.node_rank, e.what());
    link_.reset();
  }
}

std::optional<std::string> NodeGroup::recorded_failure() {
  std::optional<std::string> failure = link_->failure();
  if (failure) first_failure_ = *failure;
  return failure;
}

bool NodeGroup::due(TimePoint now) {
  if (!link_ || (next_due_ && now < *next_due_)) return false;
  next_due_ = now + options_.monitor_interval;
  return true;
}

std::optional<NodeGroup::TimePoint> NodeGroup::next_due(TimePoint now) const {
  if (!link_) return std::nullopt;
  return next_due_.value_or(now);
}

// Node 0 watches by its own clock (no clocks are compared): without this, a
// launcher killed with SIGKILL (or its host lost) would leave node 0
// waiting for its "done" for ever.
std::optional<std::string> NodeGroup::beat(TimePoint now, bool watch) {
  if (next_heartbeat_ && now < *next_heartbeat_) return std::nullopt;
  next_heartbeat_ = now + kHeartbeatInterval;
  link_->heartbeat();
  if (!watch) return std::nullopt;
  for (int node = 1; node < options_.nnodes; ++node) {
    if (link_->node_done(node)) continue;
    const int64_t beats = link_->heartbeats_of(node);
    auto [it, first] = heartbeats_.try_emplace(node, beats, now);
    if (!first && it->second.first != beats) it->second = {beats, now};
    if (now - it->second.second < options_.node_timeout) continue;
    return fmt::format(
        "node {} stopped responding (its launcher has not updated the store for {})",
        node, seconds(options_.node_timeout));
  }
  return std::nullopt;
}

void NodeGroup::report_done() {
  if (reported_done_) return;
  link_->report_done();
  reported_done_ = true;
}

bool NodeGroup::nodes_done(TimePoint now, bool failed) {
  if (nodes_done_) return true;
  const int64_t done = link_->nodes_done();
  if (done >= options_.nnodes) {
    nodes_done_ = true;
  } else if (failed) {
    // Nodes that never arrived will not say they are done; wait for those
    // that did, the grace period at most.
    const auto arrived = static_cast<int64_t>(options_.nnodes) -
                         static_cast<int64_t>(link_->missing().size());
    if (done >= arrived) nodes_done_ = true;
    if (!grace_until_)
      grace_until_ = now + options_.stop_timeout + std::chrono::seconds(2);
    if (now >= *grace_until_) nodes_done_ = true;
  }
  return nodes_done_;
}

}  // namespace switchboard::launch
