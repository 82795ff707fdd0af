#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "store/call_bound.h"

namespace switchboard {
namespace {

constexpr std::string_view kMagic = "SBSTORE1";
constexpr size_t kHeaderSize = 1 + 8 + 8;  // op, key length, value length

enum Op : uint8_t { kSet = 1, kDelete = 2, kAppend = 3, kCounter = 4 };

// Bookkeeping counters (op kCounter), invisible to the user's keys.
const std::string kUsers = "users";
const std::string kFinished = "finished";

ErrorCode errno_code(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return ErrorCode::kNotFound;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return ErrorCode::kResourceExhausted;
    default:
      return ErrorCode::kFailedPrecondition;
  }
}

Error io_error(const std::string& path, const char* call, int err) {
  return Error(errno_code(err), fmt::format("FileStore {}: {} failed: {}", path,
                                            call, std::strerror(err)));
}

// Holds an exclusive flock() on `fd` for one operation.
class FileLock {
 public:
  FileLock(int fd, const std::string& path) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) throw io_error(path, "flock", errno);
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// Whether `path` still names the file open as `fd` (the last user may have
// removed it, and another process may have created a new one).
bool same_file(int fd, const std::string& path) {
  struct stat by_fd {}, by_path {};
  if (::fstat(fd, &by_fd) != 0) throw io_error(path, "fstat", errno);
  if (::stat(path.c_str(), &by_path) != 0) {
    if (errno == ENOENT) return false;
    throw io_error(path, "stat", errno);
  }
  return by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino;
}

uint64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw io_error(path, "fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

// Reads up to `length` bytes at `offset`; shorter only at end of file.
std::string read_at(int fd, const std::string& path, uint64_t offset,
                    uint64_t length) {
  std::string data(length, '\0');
  size_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd, data.data() + done, length - done,
                        static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error(path, "read", errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

void write_at(int fd, const std::string& path, uint64_t offset,
              std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw io_error(path, "write", errno);
    done += static_cast<size_t>(n);
  }
}

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

uint64_t get_u64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  }
  return value;
}

std::string_view view(const Bytes& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

void encode(std::string& out, Op op, std::string_view key, std::string_view value) {
  out.push_back(static_cast<char>(op));
  put_u64(out, key.size());
  out.append(key);
  put_u64(out, value.size());
  out.append(value);
}

std::string encode(Op op, std::string_view key, std::string_view value) {
  std::string out;
  out.reserve(kHeaderSize + key.size() + value.size());
  encode(out, op, key, value);
  return out;
}

}  // namespace

FileStore::FileStore(std::string path, std::optional<int> num_workers)
    : path_(std::move(path)), num_workers_(num_workers) {
  if (num_workers_ && *num_workers_ <= 0) {
    throw std::invalid_argument(fmt::format(
        "FileStore {}: num_workers must be positive, got {}", path_, *num_workers_));
  }
  while (!try_open()) {
  }
}

bool FileStore::try_open() {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(path_, "open", errno);
  bool registered = false;
  try {
    MutexLock guard(mutex_);
    FileLock lock(fd_, path_);
    if (same_file(fd_, path_)) {
      refresh_locked();
      add_counter_locked(kUsers, 1);
      registered = true;
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
  if (!registered) ::close(fd_);
  return registered;
}

FileStore::~FileStore() {
  try {
    MutexLock guard(mutex_);
    FileLock lock(fd_, path_);
    refresh_locked();
    int64_t finished = add_counter_locked(kFinished, 1);
    int64_t users = add_counter_locked(kUsers, -1);
    bool all_finished = !num_workers_ || finished >= *num_workers_;
    if (users <= 0 && all_finished && same_file(fd_, path_) &&
        ::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      throw io_error(path_, "unlink", errno);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "FileStore {}: cleanup failed: {}\n", path_, e.what());
  }
  ::close(fd_);
}

template <typename Body>
auto FileStore::locked(Body&& body) {
  MutexLock guard(mutex_);
  FileLock lock(fd_, path_);
  refresh_locked();
  return body();
}

void FileStore::refresh_locked() {
  uint64_t size = file_size(fd_, path_);
  if (size < offset_) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("FileStore {}: the file shrank from {} to {} bytes; "
                            "something other than FileStore rewrote it",
                            path_, offset_, size));
  }
  if (offset_ == 0) {
    read_magic_locked(size);
    size = std::max<uint64_t>(size, offset_);
  }
  if (size == offset_) return;
  std::string data = read_at(fd_, path_, offset_, size - offset_);
  offset_ += apply_records(data);
  // With the lock held, a partial record is a dead writer's: cut it off so
  // the next record starts where it did.
  if (offset_ < size && ::ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {
    throw io_error(path_, "ftruncate", errno);
  }
}

void FileStore::read_magic_locked(uint64_t size) {
  std::string head = read_at(fd_, path_, 0, std::min<uint64_t>(size, kMagic.size()));
  if (head != kMagic.substr(0, head.size())) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("FileStore {}: not a FileStore file (no \"{}\" header)",
                            path_, kMagic));
  }
  // An empty file, or one whose creator died while writing the header.
  if (head.size() < kMagic.size()) write_at(fd_, path_, 0, kMagic);
  offset_ = kMagic.size();
}

void FileStore::commit_locked(const std::string& records) {
  try {
    write_at(fd_, path_, offset_, records);
  } catch (...) {
    (void)::ftruncate(fd_, static_cast<off_t>(offset_));
    throw;
  }
  offset_ += apply_records(records);
}

int64_t FileStore::add_counter_locked(const std::string& name, int64_t delta) {
  int64_t value = counters_[name] + delta;
  commit_locked(encode(kCounter, name, std::to_string(value)));
  return value;
}

size_t FileStore::apply_records(std::string_view data) {
  size_t pos = 0;
  while (data.size() - pos >= kHeaderSize) {
    uint8_t op = static_cast<uint8_t>(data[pos]);
    uint64_t key_size = get_u64(data.data() + pos + 1);
    size_t left = data.size() - pos - kHeaderSize;
    if (key_size > left) break;
    uint64_t value_size = get_u64(data.data() + pos + 9 + key_size);
    if (value_size > left - key_size) break;
    std::string_view key = data.substr(pos + 9, key_size);
    std::string_view value = data.substr(pos + kHeaderSize + key_size, value_size);
    apply_record(op, key, value, offset_ + pos);
    pos += kHeaderSize + key_size + value_size;
  }
  return pos;
}

void FileStore::apply_record(uint8_t op, std::string_view key,
                             std::string_view value, uint64_t at) {
  std::string name(key);
  int64_t count = 0;
  switch (op) {
    case kSet:
      map_[name] = Bytes(value.begin(), value.end());
      return;
    case kDelete:
      map_.erase(name);
      return;
    case kAppend: {
      Bytes& stored = map_[name];
      stored.insert(stored.end(), value.begin(), value.end());
      return;
    }
    case kCounter:
      if (!parse_store_integer(to_bytes(value), &count)) break;
      counters_[name] = count;
      return;
  }
  throw Error(ErrorCode::kFailedPrecondition,
              fmt::format("FileStore {}: corrupt record (op {}) at offset {}",
                          path_, op, at));
}

std::vector<Bytes> FileStore::wait_for(const std::vector<std::string>& keys,
                                       Timeout timeout, const char* op) {
  using Clock = std::chrono::steady_clock;
  timeout = StoreCallBound::bounded(timeout);
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    {
      MutexLock guard(mutex_);
      // Unchanged size: nothing new to read, so skip the file lock.
      if (file_size(fd_, path_) != offset_) {
        FileLock lock(fd_, path_);
        refresh_locked();
      }
      std::vector<std::string> missing;
      std::vector<Bytes> values;
      for (const auto& key : keys) {
        auto it = map_.find(key);
        if (it == map_.end()) missing.push_back(key);
        else if (missing.empty()) values.push_back(it->second);
      }
      if (missing.empty()) return values;
      if (timeout != kNoTimeout && Clock::now() >= deadline) {
        throw TimeoutError(fmt::format("FileStore {} {}: keys {} still missing after {} ms",
                                       path_, op, format_keys(missing), timeout.count()));
      }
    }
    auto sleep = pause;
    if (timeout != kNoTimeout) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      sleep = std::clamp(left, std::chrono::milliseconds(0), pause);
    }
    std::this_thread::sleep_for(sleep);
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
}

void FileStore::set(const std::string& key, const Bytes& value) {
  locked([&]() SB_REQUIRES(mutex_) { commit_locked(encode(kSet, key, view(value))); });
}

Bytes FileStore::get(const std::string& key) {
  return std::move(wait_for({key}, timeout(), "get").front());
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return locked([&]() SB_REQUIRES(mutex_) {
    auto it = map_.find(key);
    int64_t current = 0;
    if (it != map_.end() && !parse_store_integer(it->second, &current)) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("FileStore {} add(\"{}\", {}): value \"{}\" is not an integer",
                              path_, key, delta, to_string(it->second)));
    }
    // Wraps on overflow, as PyTorch's TCPStore does.
    int64_t result = static_cast<int64_t>(static_cast<uint64_t>(current) +
                                          static_cast<uint64_t>(delta));
    commit_locked(encode(kSet, key, std::to_string(result)));
    return result;
  });
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected,
                             const Bytes& desired) {
  return locked([&]() SB_REQUIRES(mutex_) {
    auto it = map_.find(key);
    if (it == map_.end() && !expected.empty()) return expected;
    if (it != map_.end() && it->second != expected) return it->second;
    commit_locked(encode(kSet, key, view(desired)));
    return desired;
  });
}

void FileStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  (void)wait_for(keys, timeout, "wait");
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return locked([&]() SB_REQUIRES(mutex_) {
    for (const auto& key : keys) {
      if (map_.count(key) == 0) return false;
    }
    return true;
  });
}

bool FileStore::delete_key(const std::string& key) {
  return locked([&]() SB_REQUIRES(mutex_) {
    if (map_.find(key) == map_.end()) return false;
    commit_locked(encode(kDelete, key, {}));
    return true;
  });
}

int64_t FileStore::num_keys() {
  return locked([&]() SB_REQUIRES(mutex_) { return static_cast<int64_t>(map_.size()); });
}

std::vector<Bytes> FileStore::multi_get(const std::vector<std::string>& keys) {
  return wait_for(keys, timeout(), "multi_get");
}

void FileStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument(fmt::format(
        "multi_set: {} keys but {} values", keys.size(), values.size()));
  }
  std::string records;
  for (size_t i = 0; i < keys.size(); ++i) encode(records, kSet, keys[i], view(values[i]));
  locked([&]() SB_REQUIRES(mutex_) { commit_locked(records); });
}

void FileStore::append(const std::string& key, const Bytes& value) {
  locked([&]() SB_REQUIRES(mutex_) { commit_locked(encode(kAppend, key, view(value))); });
}

}  // namespace switchboard
