#include "common/shared_memory.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <system_error>
#include <utility>

namespace switchboard {

SharedMemory SharedMemory::create(size_t size, const char* label) {
  if (size == 0) throw std::invalid_argument("shared memory: a size of 0 bytes");
  const int fd = ::memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "memfd_create");
  auto fail = [fd](int error, const char* what) {
    ::close(fd);
    throw std::system_error(error, std::generic_category(), what);
  };
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) fail(errno, "ftruncate");
  // The pages now, or an error now: a tmpfs out of room would otherwise
  // kill the process with SIGBUS at the first write that needs one.
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); error != 0) {
    fail(error, "posix_fallocate of the shared memory");
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail(errno, "sealing the shared memory");
  }
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) fail(errno, "mmap of the shared memory");
  SharedMemory memory;
  memory.data_ = data;
  memory.size_ = size;
  memory.name_ = fmt::format("{}/{}", ::getpid(), fd);
  memory.owned_ = true;
  memory.fd_ = fd;
  return memory;
}

SharedMemory SharedMemory::open(const std::string& name) {
  const size_t slash = name.find('/');
  const bool digits =
      slash != std::string::npos && slash > 0 && slash + 1 < name.size() &&
      name.size() <= 24 &&
      std::all_of(name.begin(), name.end(),
                  [](char c) { return c == '/' || std::isdigit(c) != 0; }) &&
      name.find('/', slash + 1) == std::string::npos;
  if (!digits) {
    throw std::invalid_argument(
        fmt::format("shared memory: \"{}\" is not a segment name (<pid>/<fd>)", name));
  }
  const std::string path =
      fmt::format("/proc/{}/fd/{}", name.substr(0, slash), name.substr(slash + 1));
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + path);
  // Sealed: its creator can neither shrink it under our mapping (a SIGBUS
  // here) nor grow it.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    ::close(fd);
    throw SharedMemoryRefused(fmt::format(
        "shared memory {}: not sealed against shrinking and growing (seals {})", path,
        seals));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::system_error(error, std::generic_category(), "fstat " + path);
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw SharedMemoryRefused(fmt::format("shared memory {}: 0 bytes", path));
  }
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  ::close(fd);
  if (data == MAP_FAILED)
    throw std::system_error(error, std::generic_category(), "mmap " + path);
  SharedMemory memory;
  memory.data_ = data;
  memory.size_ = size;
  memory.owned_ = true;
  return memory;
}

SharedMemory SharedMemory::borrow(void* data, size_t size) {
  SharedMemory memory;
  memory.data_ = data;
  memory.size_ = size;
  return memory;
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    this->~SharedMemory();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    owned_ = std::exchange(other.owned_, false);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  if (owned_ && data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  owned_ = false;
  fd_ = -1;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                std::chrono::microseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1'000'000) * 1000);
  // Not FUTEX_PRIVATE: the word may be shared with another process.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts,
            nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1 << 30, nullptr,
            nullptr, 0);
}

}  // namespace switchboard
