// StaticWorkers: the table of a static group's workers (each one's name and
// rank), exchanged once through the group's store, for agents whose group
// never changes (PROCESS_GROUP, and backends a user writes the same way).
//
//   StaticWorkers workers = StaticWorkers::exchange(
//       store, {"mybackend/names/", name, rank, world_size}, timeout,
//       std::chrono::steady_clock::now() + timeout);
//   int dst = workers.find(to);               // -1: not in this group
//   WorkerInfo w = workers.worker("trainer");  // NotFoundError if unknown
//   if (auto error = workers.check_request(dst, to, request, timeout))
//     return Future<Message>::failed(error);
//
// Every rank publishes its name under "<names_key><rank>" and reads every
// other rank's. Names must be unique within the group.
//
// Errors: exchange() throws TimeoutError naming the ranks that did not
// publish in time, and DuplicateNameError naming each name that more than
// one rank took, with those ranks. Lookups throw NotFoundError naming the
// name or id and what the group has. check_request() returns the error
// rather than throwing it (a backend's send() fails the call's future).
//
// Thread safety: immutable once exchanged; any number of threads may read.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"
#include "store/store.h"

namespace switchboard::rpc::backend {

class StaticWorkers {
 public:
  // Who this worker is, and under which store keys the group meets.
  struct Self {
    std::string names_key;  // the prefix of the per-rank keys
    std::string name;
    int rank = 0;
    int world_size = 1;
  };

  // Publishes `self.name`, waits for every rank's, and returns the table.
  // `timeout` is the group's: 0 waits forever, and otherwise the wait ends
  // at `deadline` (which the caller took from the same timeout, so that
  // one bound covers its whole rendezvous) and its message names `timeout`.
  static StaticWorkers exchange(Store& store, const Self& self,
                                std::chrono::milliseconds timeout,
                                std::chrono::steady_clock::time_point deadline);

  StaticWorkers() = default;

  int size() const { return static_cast<int>(workers_.size()); }
  // All workers, by rank.
  const std::vector<WorkerInfo>& all() const { return workers_; }
  std::vector<std::string> names() const;
  // `to`'s rank when a worker of this group has its id and name; else -1.
  int find(const WorkerInfo& to) const;
  WorkerInfo worker(const std::string& name) const;
  WorkerInfo worker(int id) const;
  // The name of rank `id`, which must be in range.
  const std::string& name(int id) const { return workers_[id].name; }

  // What is wrong with `request`, to send to `to` (`dst`: find(to)) with
  // `timeout`, or nullptr: NotFoundError when `to` is not a worker of this
  // group; std::invalid_argument, after "rpc to "<name>" function "<f>": ",
  // for a message that is not a request, a negative timeout, or what
  // `more` (the backend's own checks, e.g. of the tensors; run last, may be
  // empty) finds wrong.
  std::exception_ptr check_request(
      int dst, const WorkerInfo& to, const Message& request,
      std::chrono::milliseconds timeout,
      const std::function<std::optional<std::string>()>& more = {}) const;

 private:
  std::vector<WorkerInfo> workers_;  // by rank
  std::unordered_map<std::string, int> ranks_by_name_;
};

}  // namespace switchboard::rpc::backend
