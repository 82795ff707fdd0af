#include "python/csrc/python_thread_state.h"

#include <Python.h>

#include <atomic>
#include <utility>

#include "rpc/thread_pool.h"

namespace switchboard::torch_rpc {

namespace {

std::atomic<int64_t> kept_count{0};

bool interpreter_running() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

PyThreadState* current_thread_state() {
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked();
#else
  return _PyThreadState_UncheckedGet();
#endif
}

// The calling pool thread's kept state (null: none).
thread_local PyThreadState* tl_kept = nullptr;

// On the pool thread, as it leaves its pool (ThreadPool::at_thread_exit).
void free_kept_state() {
  PyThreadState* state = std::exchange(tl_kept, nullptr);
  if (state == nullptr) return;
  kept_count.fetch_sub(1, std::memory_order_relaxed);
  // After finalization Python freed every thread state itself.
  if (!interpreter_running()) return;
  PyEval_RestoreThread(state);
  // The state's count is 1 (ours): this clears and deletes it, and
  // releases the GIL.
  PyGILState_Release(PyGILState_UNLOCKED);
}

}  // namespace

void keep_python_thread_state() noexcept {
  if (tl_kept != nullptr || rpc::ThreadPool::current() == nullptr) return;
  if (!interpreter_running() || PyGILState_GetThisThreadState() != nullptr) return;
  try {
    if (!rpc::ThreadPool::at_thread_exit(free_kept_state)) return;
  } catch (...) {
    return;  // no memory for the hook: torch makes a state per call, as without
  }
  PyGILState_Ensure();  // makes the state (count 1) and takes the GIL
  tl_kept = PyEval_SaveThread();
  kept_count.fetch_add(1, std::memory_order_relaxed);
}

int64_t kept_python_thread_states() noexcept {
  return kept_count.load(std::memory_order_relaxed);
}

GilReleased::GilReleased() noexcept {
  if (Py_IsInitialized() && current_thread_state() != nullptr) {
    saved_ = PyEval_SaveThread();
  }
}

GilReleased::~GilReleased() {
  if (saved_ != nullptr) PyEval_RestoreThread(saved_);
}

}  // namespace switchboard::torch_rpc
