// Clang's thread-safety annotations (-Wthread-safety), as macros that
// compile to nothing elsewhere. Use them with switchboard::Mutex
// (common/mutex.h): a member written under a mutex says so with
// SB_GUARDED_BY(mu_), and the compiler checks every access in the clang
// build that tools/test runs (bazel build --config=tsa).
#pragma once

#if defined(__clang__)
#define SB_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SB_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (Mutex).
#define SB_CAPABILITY(x) SB_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a lock for its lifetime (MutexLock).
#define SB_SCOPED_CAPABILITY SB_THREAD_ANNOTATION(scoped_lockable)
// The member may be read or written only while holding `x`.
#define SB_GUARDED_BY(x) SB_THREAD_ANNOTATION(guarded_by(x))
// The pointee may be accessed only while holding `x`.
#define SB_PT_GUARDED_BY(x) SB_THREAD_ANNOTATION(pt_guarded_by(x))
// The function must be called with `...` held (and returns with it held).
#define SB_REQUIRES(...) SB_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The function must be called without `...` held (it takes them itself).
#define SB_EXCLUDES(...) SB_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes `...` and returns holding them.
#define SB_ACQUIRE(...) SB_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// The function releases `...`, which the caller held.
#define SB_RELEASE(...) SB_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// The same for a shared (reader) hold of `...` (SharedMutex).
#define SB_REQUIRES_SHARED(...) SB_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define SB_ACQUIRE_SHARED(...) SB_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define SB_RELEASE_SHARED(...) SB_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// The function returns the capability `x` (an accessor of a mutex).
#define SB_RETURN_CAPABILITY(x) SB_THREAD_ANNOTATION(lock_returned(x))
// Declares, unchecked, that the caller holds `...` (for code the analysis
// cannot follow, e.g. a callback run under a lock its caller took).
#define SB_ASSERT_CAPABILITY(...) SB_THREAD_ANNOTATION(assert_capability(__VA_ARGS__))
// Turns the analysis off for one function; say why at each use.
#define SB_NO_THREAD_SAFETY_ANALYSIS SB_THREAD_ANNOTATION(no_thread_safety_analysis)
