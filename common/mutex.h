// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable
// with clang's thread-safety annotations (common/thread_annotations.h), so
// that members marked SB_GUARDED_BY(mu_) are checked by the compiler.
//
//   class Counter {
//    public:
//     void add() SB_EXCLUDES(mu_) { MutexLock lock(mu_); ++n_; cv_.notify_all(); }
//     void wait_for(int n) SB_EXCLUDES(mu_) {
//       MutexLock lock(mu_);
//       cv_.wait(mu_, [&]() SB_REQUIRES(mu_) { return n_ >= n; });
//     }
//    private:
//     Mutex mu_;
//     CondVar cv_;
//     int n_ SB_GUARDED_BY(mu_) = 0;
//   };
//
// Thread safety: as std::mutex and std::condition_variable. A CondVar's
// waits must be given the Mutex the caller holds; they return holding it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace switchboard {

class SB_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() SB_ACQUIRE() { mu_.lock(); }
  void unlock() SB_RELEASE() { mu_.unlock(); }
  // For code that needs the std::mutex itself (CondVar); holding it is
  // holding this Mutex.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds `mu` from construction to destruction; unlock()/lock() in between
// let a scope drop the lock around a call that must not run under it.
class SB_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) SB_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() SB_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() SB_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() SB_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A reader-writer lock: many readers (ReaderMutexLock) or one writer
// (WriterMutexLock). A member read under a reader lock and written under
// the writer lock is SB_GUARDED_BY it.
class SB_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() SB_ACQUIRE() { mu_.lock(); }
  void unlock() SB_RELEASE() { mu_.unlock(); }
  void lock_shared() SB_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() SB_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds `mu` shared from construction to destruction.
class SB_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) SB_ACQUIRE_SHARED(mu) : mu_(mu) {
    mu_.lock_shared();
  }
  ~ReaderMutexLock() SB_RELEASE() { mu_.unlock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds `mu` exclusively from construction to destruction.
class SB_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) SB_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterMutexLock() SB_RELEASE() { mu_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

class CondVar {
 public:
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

  // Waits until notified (or spuriously woken); `mu` is released while
  // waiting and held again on return.
  void wait(Mutex& mu) SB_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }

  // Waits until `done()` is true; `done` runs with `mu` held (annotate a
  // lambda that reads guarded members with SB_REQUIRES(mu): the analysis
  // cannot see that the `mu` here is that one, hence its exemption here).
  template <typename Predicate>
  void wait(Mutex& mu, Predicate done) SB_REQUIRES(mu) SB_NO_THREAD_SAFETY_ANALYSIS {
    while (!done()) wait(mu);
  }

  // Waits until `done()` or `deadline`; returns done().
  template <typename Clock, typename Duration, typename Predicate>
  bool wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline,
                  Predicate done) SB_REQUIRES(mu) SB_NO_THREAD_SAFETY_ANALYSIS {
    while (!done()) {
      if (wait_until(mu, deadline) == std::cv_status::timeout) return done();
    }
    return true;
  }

  // Waits until notified or `deadline`.
  template <typename Clock, typename Duration>
  std::cv_status wait_until(Mutex& mu,
                            const std::chrono::time_point<Clock, Duration>& deadline)
      SB_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    const std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status;
  }

  template <typename Rep, typename Period, typename Predicate>
  bool wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout,
                Predicate done) SB_REQUIRES(mu) SB_NO_THREAD_SAFETY_ANALYSIS {
    return wait_until(mu, std::chrono::steady_clock::now() + timeout, std::move(done));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace switchboard
