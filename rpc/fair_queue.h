// FairQueue<T>: items waiting per key, served in turn. pop() takes the
// oldest item of the key whose turn it is, and that key goes to the back
// of the turns while it has items left: a key with many items waiting gets
// one in turn with every other key that waits, not all of its backlog
// first. The call table queues the requests each caller sends this way
// (rpc/call_table.h), one pool task per request.
//
// Thread safety: every member function is thread-safe; T is moved in and
// out under the queue's lock (its move must not call back into the queue).
#pragma once

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"

namespace switchboard::rpc {

template <typename T>
class FairQueue {
 public:
  // Adds `item` behind the items of `key` (a key with none joins the
  // turns, last).
  void push(int key, T item) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::deque<T>& mine = waiting_[key];
    if (mine.empty()) turns_.push_back(key);
    mine.push_back(std::move(item));
  }

  // The oldest item of the key whose turn it is; nullopt when none waits.
  std::optional<T> pop() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (turns_.empty()) return std::nullopt;
    const int key = turns_.front();
    turns_.pop_front();
    auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second.empty()) return std::nullopt;
    std::optional<T> next(std::move(it->second.front()));
    it->second.pop_front();
    if (it->second.empty()) {
      waiting_.erase(it);
    } else {
      turns_.push_back(key);
    }
    return next;
  }

  // Takes back the newest item of `key`; nullopt when it has none.
  std::optional<T> take_newest(int key) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second.empty()) return std::nullopt;
    std::optional<T> newest(std::move(it->second.back()));
    it->second.pop_back();
    if (it->second.empty()) {
      waiting_.erase(it);
      std::erase(turns_, key);
    }
    return newest;
  }

 private:
  Mutex mu_;
  std::unordered_map<int, std::deque<T>> waiting_ SB_GUARDED_BY(mu_);
  std::deque<int> turns_ SB_GUARDED_BY(mu_);  // keys with items, in turn order
};

}  // namespace switchboard::rpc
