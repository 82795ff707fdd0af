// FileStore: a Store shared by processes (and threads) through one file, as
// PyTorch's c10d FileStore is. Every process that opens the same path on a
// local file system sees the same keys (flock() over NFS is not reliable).
//
// How it works: the file is an append-only log of records. Each FileStore
// caches the keys and the offset it has read up to. Every operation takes an
// exclusive flock() on the file, reads the records appended since its last
// look, applies its change and appends it, then unlocks. Blocking calls
// (get, wait, multi_get) poll: they refresh, then sleep 1 ms growing to
// 10 ms between refreshes, never past their deadline.
//
// File format (integers little-endian): the 8-byte magic "SBSTORE1", then
// records of
//   u8 op | u64 key length | key | u64 value length | value
// where op is 1 set (value replaces), 2 delete (value empty), 3 append
// (value is appended) or 4 bookkeeping (an internal counter, kept apart from
// the user's keys and counted by neither num_keys() nor check()). One
// operation's records are written with one write loop under the lock. A
// partial record left at the end by a writer that died mid-write is ignored
// and cut off by the next locked reader. The log is never compacted: it
// grows with every write until the file is removed. The format is not
// PyTorch's; the two cannot share a file.
//
// Cleanup, as in c10d: the constructor increments a user count kept in the
// file and the destructor decrements it; the user who brings it to 0 removes
// the file, so a later FileStore on the path starts empty. With num_workers,
// removal also waits until num_workers FileStores in all (counting every
// destroyed instance) have been destroyed, so a worker that finishes early
// cannot remove the file before slower workers have opened it. A process
// that dies without running the destructor leaves the file behind.
//
// Thread safety: every method is thread-safe; a mutex orders the threads of
// one instance and flock() orders instances and processes.
// Ownership: the store owns copies of all keys and values and its file
// descriptor; the file belongs to all its users together (see Cleanup).
// Errors: I/O failures throw Error naming the path and the errno text, with
// code kNotFound (a directory on the path is missing), kResourceExhausted
// (disk full, too many open files) or kFailedPrecondition (anything else,
// including a file that is not a FileStore log). Timeouts throw TimeoutError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/mutex.h"
#include "store/store.h"

namespace switchboard {

class FileStore : public Store {
 public:
  // Opens `path`, creating it when missing, and counts this user in it.
  // `num_workers`, when given, must be positive (else std::invalid_argument)
  // and delays removal of the file as described under Cleanup. Throws Error
  // naming the path when the file cannot be opened, locked or read, or holds
  // something other than a FileStore log.
  explicit FileStore(std::string path,
                     std::optional<int> num_workers = std::nullopt);
  // Counts this user out and removes the file when it was the last (see
  // Cleanup). Never throws; failures are reported on stderr.
  ~FileStore() override;

  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  using Store::set;
  using Store::wait;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  // All pairs are written as one atomic operation.
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values) override;
  // Atomic: appends a record holding only `value`.
  void append(const std::string& key, const Bytes& value) override;

  const std::string& path() const { return path_; }

 private:
  // Opens path_ and counts this user in. Returns false (fd closed) when the
  // file was removed by its last user between open() and flock().
  bool try_open() SB_EXCLUDES(mutex_);
  // Runs `body` holding mutex_ and the file lock, after a refresh (annotate
  // a `body` lambda that uses the members SB_REQUIRES(mutex_)).
  template <typename Body>
  auto locked(Body&& body) SB_EXCLUDES(mutex_);
  // Polls until every key exists; returns their values. Throws TimeoutError
  // naming the missing keys once `timeout` passes (kNoTimeout: never).
  std::vector<Bytes> wait_for(const std::vector<std::string>& keys, Timeout timeout,
                              const char* op) SB_EXCLUDES(mutex_);

  // The rest need mutex_ and the file lock held.
  void refresh_locked() SB_REQUIRES(mutex_);
  void read_magic_locked(uint64_t size) SB_REQUIRES(mutex_);
  void commit_locked(const std::string& records) SB_REQUIRES(mutex_);
  int64_t add_counter_locked(const std::string& name, int64_t delta) SB_REQUIRES(mutex_);
  size_t apply_records(std::string_view data) SB_REQUIRES(mutex_);
  void apply_record(uint8_t op, std::string_view key, std::string_view value, uint64_t at)
      SB_REQUIRES(mutex_);

  const std::string path_;
  const std::optional<int> num_workers_;
  int fd_ = -1;
  Mutex mutex_;
  std::unordered_map<std::string, Bytes> map_ SB_GUARDED_BY(mutex_);
  std::unordered_map<std::string, int64_t> counters_ SB_GUARDED_BY(mutex_);
  uint64_t offset_ SB_GUARDED_BY(mutex_) = 0;  // file bytes applied to map_
};

}  // namespace switchboard
