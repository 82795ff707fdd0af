// Store: the rendezvous key-value store every Switchboard group starts from.
//
// Keys are strings (opaque bytes); values are byte vectors. Every blocking
// call has a timeout: the store's default (set_timeout) or one passed
// explicitly. A missing key is never answered with an empty value: get()
// blocks until the key exists and otherwise throws TimeoutError naming it.
//
// Implementations: HashStore (one process), FileStore (processes sharing a
// file), PrefixStore (a namespace over any store) and TcpStore (a client of
// TcpStoreServer or of PyTorch's TCPStore).
//
// Thread safety: every method of every implementation is safe to call from
// several threads at once; each operation is atomic.
//
// Errors: TimeoutError (waited past the timeout; names the keys),
// NotFoundError, ConnectionError (TcpStore: the server went away),
// Error(kFailedPrecondition) (add on a non-integer value),
// std::invalid_argument (caller bugs, e.g. multi_set with mismatched sizes).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace switchboard {

class StoreMetrics;

using Bytes = std::vector<uint8_t>;

// Conversions between text and Bytes; no encoding is applied.
Bytes to_bytes(std::string_view text);
std::string to_string(const Bytes& bytes);

// Subclasses override the virtual overloads and add `using Store::set;` and
// `using Store::wait;` so the convenience overloads stay visible.
class Store {
 public:
  using Timeout = std::chrono::milliseconds;

  // The default for every blocking call (PyTorch's is also 300 s).
  static constexpr Timeout kDefaultTimeout{300'000};
  // Passing kNoTimeout waits forever, as in PyTorch.
  static constexpr Timeout kNoTimeout{0};

  virtual ~Store() = default;

  // Creates or replaces `key`. Wakes every get()/wait() blocked on it.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  void set(const std::string& key, std::string_view value) {
    set(key, to_bytes(value));
  }

  // Returns the value of `key`, blocking until it exists or timeout()
  // passes (then TimeoutError naming the key).
  virtual Bytes get(const std::string& key) = 0;

  // Adds `delta` to the integer stored under `key` (a missing key counts as
  // 0) and returns the new value. Values are stored as ASCII decimal, as
  // PyTorch does. Throws Error(kFailedPrecondition) naming the key and the
  // value when the key holds something that is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // PyTorch's compare-and-set. Writes `desired` when the key is absent and
  // `expected` is empty, or present and equal to `expected`, and returns
  // `desired`. Otherwise writes nothing and returns the current value, or
  // `expected` when the key is absent.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  // Blocks until every key exists. Throws TimeoutError naming the keys still
  // missing when `timeout` (default: timeout()) passes first.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, Timeout timeout) = 0;

  // True when every key exists (true for an empty list); never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Removes `key`; returns whether it existed. Does not wake waiters.
  virtual bool delete_key(const std::string& key) = 0;

  // The number of keys in the whole store.
  virtual int64_t num_keys() = 0;

  // get() of every key, with one timeout for all of them.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys);

  // set() of every pair; keys.size() must equal values.size().
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<Bytes>& values);

  // Appends `value` to the value under `key` (creating it when missing).
  virtual void append(const std::string& key, const Bytes& value);

  // What this store counted about its operations (store/store_metrics.h),
  // shared so that it may be read while the store works; null for stores
  // that count nothing (HashStore, FileStore). TcpStore counts; PrefixStore
  // answers with the store it wraps.
  virtual std::shared_ptr<const StoreMetrics> metrics() const { return nullptr; }

  // The default timeout of get() and wait(). Not synchronized with calls in
  // flight: a call already blocked keeps the timeout it started with.
  virtual void set_timeout(Timeout timeout) { timeout_ms_ = timeout.count(); }
  Timeout timeout() const { return Timeout(timeout_ms_.load()); }

 private:
  std::atomic<Timeout::rep> timeout_ms_{kDefaultTimeout.count()};
};

// Formats a key list for error messages: ["a", "b"].
std::string format_keys(const std::vector<std::string>& keys);

// Parses an ASCII integer the way PyTorch's TCPStore does (std::stoll:
// leading whitespace, optional sign, digits, stops at the first non-digit).
// Returns false when there are no digits or the number is out of range.
bool parse_store_integer(const Bytes& value, int64_t* out);

}  // namespace switchboard
