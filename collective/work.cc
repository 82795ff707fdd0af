#include "collective/work.h"

#include <fmt/format.h>

#include "common/error.h"

namespace switchboard::collective {

Work::Work(Info info) : state_(std::make_shared<State>()) {
  state_->info = std::move(info);
}

Work::Work(Info info, Driver drive) : Work(std::move(info)) {
  state_->drive = std::move(drive);
}

Work Work::done(Info info) {
  Work work(std::move(info));
  work.complete();
  return work;
}

void Work::wait() const { wait(state_->info.default_timeout); }

void Work::wait(Timeout timeout) const {
  const auto timed_out = [&] {
    const Info& info = state_->info;
    const std::string of =
        info.size > 0 ? fmt::format(" of {}", info.size) : std::string();
    const std::string detail = info.detail.empty() ? std::string() : " (" + info.detail + ")";
    return TimeoutError(
        fmt::format("{} in group \"{}\" (rank {}{}): timed out after {} ms{}", info.op,
                    info.group, info.rank, of, timeout.count(), detail));
  };
  if (state_->drive) {
    // One driver at a time; a second waiter blocks here until the first
    // returns, then finds the Work done (or drives it itself).
    std::unique_lock drive_lock(state_->drive_mu, std::defer_lock);
    if (timeout == kNoTimeout) {
      drive_lock.lock();
    } else if (!drive_lock.try_lock_for(timeout)) {
      throw timed_out();
    }
    if (!is_completed()) {
      bool finished = false;
      try {
        finished = state_->drive(timeout);
      } catch (...) {
        finish(std::current_exception());
      }
      if (finished) finish(nullptr);
      if (!finished && !is_completed()) throw timed_out();
    }
  }
  std::unique_lock lock(state_->mu);
  if (timeout == kNoTimeout) {
    state_->cv.wait(lock, [&] { return state_->done; });
  } else if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    throw timed_out();
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::is_completed() const {
  std::lock_guard lock(state_->mu);
  return state_->done;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(state_->mu);
  return state_->error;
}

const Work::Info& Work::info() const { return state_->info; }

void Work::complete() const { finish(nullptr); }

void Work::complete_from(int source) const {
  {
    std::lock_guard lock(state_->mu);
    if (state_->done) return;
    state_->source = source;
  }
  finish(nullptr);
}

int Work::source_rank() const {
  std::lock_guard lock(state_->mu);
  return state_->done ? state_->source : -1;
}

void Work::fail(std::exception_ptr error) const { finish(std::move(error)); }

void Work::finish(std::exception_ptr error) const {
  {
    std::lock_guard lock(state_->mu);
    if (state_->done) return;
    state_->done = true;
    state_->error = std::move(error);
  }
  state_->cv.notify_all();
}

}  // namespace switchboard::collective
