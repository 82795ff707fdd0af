#include "python/csrc/python_thread_state.h"

#include <Python.h>

#include <atomic>

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

// The calling thread's kept state; freed by the destructor when the thread
// exits (see the header).
class KeptState {
 public:
  ~KeptState() {
    if (state_ == nullptr || !interpreter_running()) return;
    PyEval_RestoreThread(state_);
    // The state's count is 1 (ours): this clears and deletes it, and
    // releases the GIL.
    PyGILState_Release(PyGILState_UNLOCKED);
    kept_count.fetch_sub(1, std::memory_order_relaxed);
  }

  void keep() {
    if (decided_) return;
    decided_ = true;
    if (rpc::ThreadPool::current() == nullptr || !interpreter_running() ||
        PyGILState_GetThisThreadState() != nullptr) {
      return;
    }
    PyGILState_Ensure();  // makes the state (count 1) and takes the GIL
    state_ = PyEval_SaveThread();
    kept_count.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  bool decided_ = false;
  PyThreadState* state_ = nullptr;
};

thread_local KeptState kept;

}  // namespace

void keep_python_thread_state() noexcept { kept.keep(); }

int64_t kept_python_thread_states() noexcept {
  return kept_count.load(std::memory_order_relaxed);
}

GilReleased::GilReleased() noexcept {
  if (Py_IsInitialized() && current_thread_state() != nullptr)
    saved_ = PyEval_SaveThread();
}

GilReleased::~GilReleased() {
  if (saved_ != nullptr) PyEval_RestoreThread(saved_);
}

}  // namespace switchboard::torch_rpc
