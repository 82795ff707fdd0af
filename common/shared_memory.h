// SharedMemory: memory that processes of one host share, and futex waits on
// words in it. The same-host lane of PIPE connections
// (agents/pipe/transport/shm/) and the Gloo group's same-host collectives
// (collective/gloo_same_host.h) build on it.
//
//   // one process                              // another, same host and user
//   SharedMemory mine = SharedMemory::create(size, "label");
//   send mine.name() over an authenticated      SharedMemory theirs =
//   channel ("<pid>/<fd>")                          SharedMemory::open(name);
//
// The memory is an anonymous memory file (memfd_create) of the creator's,
// its pages reserved up front (posix_fallocate: no room shows as an error
// here, never as a SIGBUS later) and sealed against shrinking and growing.
// The creator keeps the file open; another process opens it through
// /proc/<creator's pid>/fd/<fd>, which the kernel allows only to a process
// that may read the creator's memory (the same user, unless the creator is
// not dumpable), and open() refuses a file without those seals. Nothing is
// ever left in /dev/shm or anywhere else: the memory goes with the last
// mapping, so a creator that dies leaves its peers' mappings valid.
//
// Thread safety: a SharedMemory is a value (move-only); its accessors are
// const. What the processes write into the memory is theirs to order.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace switchboard {

// open() found a file that a peer could resize under the mapping.
class SharedMemoryRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SharedMemory {
 public:
  // Makes, reserves, seals and maps a memory file of `size` (> 0) bytes,
  // zero-filled. `label` shows in /proc/<pid>/fd. Throws
  // std::invalid_argument for size 0, std::system_error naming the step
  // that failed.
  static SharedMemory create(size_t size, const char* label);
  // Maps the file another process made (`name`: its "<pid>/<fd>"), whole.
  // Throws std::invalid_argument for a name of another form,
  // std::system_error when it cannot be opened or mapped,
  // SharedMemoryRefused when it is not sealed against shrinking and growing.
  static SharedMemory open(const std::string& name);
  // Over memory the caller owns (tests, fuzzers): nothing is unmapped.
  static SharedMemory borrow(void* data, size_t size);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // create()'s: how another process opens it ("<pid>/<fd>"); empty otherwise.
  const std::string& name() const { return name_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owned_ = false;  // munmap on destruction
  int fd_ = -1;         // create()'s file, kept open for the others
};

// Sleeps while `*word` == `expected`, for at most `timeout` (a wake, a
// changed word, a signal or the timeout end it: callers recheck). The word
// may be shared with other processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                std::chrono::microseconds timeout);
// Wakes every thread, of any process, sleeping on `word`.
void futex_wake(std::atomic<uint32_t>* word);

}  // namespace switchboard
