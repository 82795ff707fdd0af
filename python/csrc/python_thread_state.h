// Python thread states for Switchboard's own threads, kept for the thread's
// life instead of made and freed on every call.
//
// Why: torch's RequestCallback, and the callbacks torch adds to an RPC's
// future, take the GIL with pybind11's gil_scoped_acquire. On a thread that
// has no Python thread state (every thread of Switchboard's pool), that
// makes one, and frees it when the acquisition ends: on every call, an
// allocation of the state and an mmap and munmap of its 16 KiB frame stack,
// whose unmapping interrupts every core the process runs on (a TLB
// shootdown). Measured through torch's API on 2 cores: SWITCHBOARD's
// rpc_async rate nearly doubled once the pool's threads kept their states
// (docs/benchmarks.md).
//
// keep_python_thread_state() gives the calling pool thread one state; both
// gil_scoped_acquire and PyGILState_Ensure find it (it is the thread's
// PyGILState state) and reuse it. The thread frees it as it leaves its pool
// (rpc::ThreadPool::at_thread_exit: it retires after the pool's idle
// timeout, or the pool shuts down), while the interpreter still runs. It
// takes the GIL for that, so a thread that shuts a pool down must not hold
// the GIL (SwitchboardAgent releases it around its shutdown: GilReleased);
// post() never waits for a thread that frees its state. After the
// interpreter finalized, the state is not touched: Python freed every
// thread state itself. A pool thread that leaves in the instant
// finalization begins could meet Python's rule that a thread taking the GIL
// during finalization never returns; only threads a pool left running past
// its shutdown deadline leave at such a time.
//
// Thread safety: all functions are thread-safe; each acts on the calling
// thread.
#pragma once

#include <cstdint>

struct _ts;  // PyThreadState, without including Python.h here

namespace switchboard::torch_rpc {

// On a thread of a Switchboard ThreadPool (rpc::ThreadPool::current()) that
// has no Python thread state, makes one and keeps it until the thread
// leaves its pool (above). Does nothing on any other thread, on a thread that already
// has a state (kept, or one Python made), and while the interpreter is not
// running or finalizing. Must not be called with the GIL held. Cheap after
// the first call on a thread (a thread-local check). Never throws.
void keep_python_thread_state() noexcept;

// The number of thread states this process keeps now (made by
// keep_python_thread_state and not yet freed): for tests.
int64_t kept_python_thread_states() noexcept;

// Releases the GIL for its scope when the calling thread holds it, and takes
// it back at the end; does nothing otherwise (and after finalization). What
// SwitchboardAgent's shutdown paths hold, so that pool threads can free
// their states while they are joined.
class GilReleased {
 public:
  GilReleased() noexcept;
  ~GilReleased();
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  _ts* saved_ = nullptr;
};

}  // namespace switchboard::torch_rpc
