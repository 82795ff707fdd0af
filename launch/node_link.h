// NodeLink: how the launchers of one multi-node job meet in the job's
// store (launch/supervisor.h). Internal to //launch.
//
// Errors: what TcpStore throws (ConnectionError, AuthenticationError for
// another secret, TimeoutError). Not thread-safe: the launcher's own.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/auth.h"
#include "launch/options.h"
#include "rendezvous/rounds.h"
#include "store/tcp_store.h"

namespace switchboard::launch {

// The launchers of a multi-node job, through the job's store: keys under
// "launch/<job id>/". Each launcher announces its node, records the job's
// first failure (compare_set, so one wins) and says when its workers are
// done; node 0, which hosts the store, keeps it up until every node is.
// Each attempt (restart policy) has keys of its own under
// "launch/<job id>/attempt/<n>/" (rendezvous::launch_attempt_prefix):
//   failed      its first worker failure (compare_set, so one wins)
//   stopped/<R> node R has reaped every worker of the attempt after it failed
//   done/<R>    every worker of node R exited 0 in the attempt
class NodeLink {
 public:
  NodeLink(const LaunchOptions& options, uint16_t port,
           std::shared_ptr<const Secret> secret)
      : store_(options.master_addr, port, store_options(options, std::move(secret))),
        job_id_(options.job_id),
        prefix_(rendezvous::launch_prefix(options.job_id)),
        node_rank_(options.node_rank),
        nnodes_(options.nnodes) {}

  void announce() { store_.set(node_key(node_rank_), to_bytes(host_name())); }

  // Node ranks that have not announced themselves yet.
  std::vector<int> missing() {
    std::vector<int> out;
    for (int node = 0; node < nnodes_; ++node) {
      if (!store_.check({node_key(node)})) out.push_back(node);
    }
    return out;
  }

  std::optional<std::string> failure() {
    if (!store_.check({prefix_ + "failed"})) return std::nullopt;
    return to_string(store_.get(prefix_ + "failed"));
  }

  // Records `what` as the job's failure unless one is recorded; returns the
  // one that is (the first).
  std::string report_failure(const std::string& what) {
    const Bytes now = store_.compare_set(prefix_ + "failed", {}, to_bytes(what));
    return now.empty() ? what : to_string(now);
  }

  void report_done() {
    store_.set(fmt::format("{}done/{}", prefix_, node_rank_), to_bytes("1"));
    store_.add(prefix_ + "done", 1);
  }
  int64_t nodes_done() { return store_.add(prefix_ + "done", 0); }
  bool node_done(int node) { return store_.check({fmt::format("{}done/{}", prefix_, node)}); }

  // Records `what` as attempt `attempt`'s first worker failure unless one is
  // recorded; returns the one that is.
  std::string report_attempt_failure(int attempt, const std::string& what) {
    const Bytes now =
        store_.compare_set(attempt_key(attempt, "failed"), {}, to_bytes(what));
    return now.empty() ? what : to_string(now);
  }
  std::optional<std::string> attempt_failure(int attempt) {
    const std::string key = attempt_key(attempt, "failed");
    if (!store_.check({key})) return std::nullopt;
    return to_string(store_.get(key));
  }

  // This node's workers of `attempt` are all reaped after the attempt failed;
  // whether every node's are.
  void report_stopped(int attempt) {
    store_.set(attempt_key(attempt, fmt::format("stopped/{}", node_rank_)),
               to_bytes("1"));
  }
  bool all_stopped(int attempt) { return store_.check(every_node(attempt, "stopped")); }

  // Every worker of this node exited 0 in `attempt`; whether every node's did.
  void report_succeeded(int attempt) {
    store_.set(attempt_key(attempt, fmt::format("done/{}", node_rank_)), to_bytes("1"));
  }
  bool all_succeeded(int attempt) { return store_.check(every_node(attempt, "done")); }

  // This launcher is alive: a counter the others watch change.
  void heartbeat() { store_.add(fmt::format("{}alive/{}", prefix_, node_rank_), 1); }
  int64_t heartbeats_of(int node) {
    return store_.add(fmt::format("{}alive/{}", prefix_, node), 0);
  }

 private:
  static TcpStoreOptions store_options(const LaunchOptions& options,
                                       std::shared_ptr<const Secret> secret) {
    TcpStoreOptions o;
    o.timeout = std::chrono::milliseconds(5000);  // each request; joining retries
    o.secret = std::move(secret);
    return o;
  }
  static std::string host_name() {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    return name;
  }
  std::string node_key(int node) const { return fmt::format("{}node/{}", prefix_, node); }
  std::string attempt_key(int attempt, const std::string& name) const {
    return rendezvous::launch_attempt_prefix(job_id_, attempt) + name;
  }
  // "<what>/<R>" of attempt `attempt` for every node R: one check() for all.
  std::vector<std::string> every_node(int attempt, const std::string& what) const {
    std::vector<std::string> keys;
    for (int node = 0; node < nnodes_; ++node) {
      keys.push_back(attempt_key(attempt, fmt::format("{}/{}", what, node)));
    }
    return keys;
  }

  TcpStore store_;
  const std::string job_id_;
  const std::string prefix_;
  const int node_rank_;
  const int nnodes_;
};

}  // namespace switchboard::launch
