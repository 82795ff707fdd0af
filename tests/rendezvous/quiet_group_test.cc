// rendezvous/quiet_group.h without an agent: idle workers (a LocalCalls
// that is always idle) over a HashStore, a `gone` that the test controls.
// What a worker that is gone does to the others' wait: they still wait for
// each other, then fail naming it.
#include "rendezvous/quiet_group.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/error.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

using namespace switchboard;
using rendezvous::LocalCalls;
using rendezvous::QuietGroup;

namespace {

class IdleCalls final : public LocalCalls {
 public:
  explicit IdleCalls(std::string name) : name_(std::move(name)) {}
  Idle wait_idle(std::optional<Clock::time_point>) override { return Idle::kIdle; }
  Activity activity() const override { return {}; }
  bool closed() const override { return false; }
  std::string agent_name() const override { return name_; }

 private:
  std::string name_;
};

// What the waiting workers asked `gone`, in order, for the test to wait on.
class GoneLog {
 public:
  // Rank 2 is gone ("shut down"); the others are not.
  std::optional<std::string> ask(int asker, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    if (asker == 0 && rank == 2) rank0_found_w2_ = true;
    if (asker == 0 && rank == 1 && rank0_found_w2_) rank0_waits_for_w1_after_w2_ = true;
    cv_.notify_all();
    return rank == 2 ? std::optional<std::string>("shut down") : std::nullopt;
  }
  void rank0_returned() {
    std::lock_guard<std::mutex> lock(mu_);
    rank0_returned_ = true;
    cv_.notify_all();
  }
  // Waits until rank 0 either asked about w1 again after finding w2 gone
  // (it goes on waiting for w1) or returned; says which.
  bool rank0_still_waits_for_w1() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return rank0_waits_for_w1_after_w2_ || rank0_returned_; });
    return rank0_waits_for_w1_after_w2_ && !rank0_returned_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool rank0_found_w2_ = false;
  bool rank0_waits_for_w1_after_w2_ = false;
  bool rank0_returned_ = false;
};

QuietGroup group_of(int rank, LocalCalls& calls, Store& store, GoneLog& log) {
  QuietGroup group;
  group.calls = &calls;
  group.store = &store;
  group.prefix = "join/0/";
  group.rank = rank;
  group.names = {"w0", "w1", "w2"};
  group.gone = [&log, rank](int r) { return log.ask(rank, r); };
  group.who = "join on rpc worker \"w" + std::to_string(rank) + "\"";
  return group;
}

std::string error_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ConnectionError& e) {
    return std::string("ConnectionError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
}

}  // namespace

TEST_CASE("a worker gone without joining does not end the others' wait: those left wait "
          "for each other, then each fails naming it",
          "[rendezvous][quiet]") {
  HashStore store;
  IdleCalls calls0("w0");
  IdleCalls calls1("w1");
  GoneLog log;
  std::exception_ptr error0;
  bool w1_reported_before_w0_returned = false;
  std::thread rank0([&] {
    try {
      rendezvous::wait_for_quiet_group(group_of(0, calls0, store, log));
    } catch (...) {
      error0 = std::current_exception();
    }
    // w1's last key of the wait: rank 0 may host the store, so it must not
    // leave before w1 is done with it.
    w1_reported_before_w0_returned = store.check({"join/0/1/read/1"});
    log.rank0_returned();
  });
  // w1 has not started its wait: rank 0 must keep waiting for it rather
  // than fail at once because w2 is gone.
  const bool waited = log.rank0_still_waits_for_w1();
  std::exception_ptr error1;
  try {
    rendezvous::wait_for_quiet_group(group_of(1, calls1, store, log));
  } catch (...) {
    error1 = std::current_exception();
  }
  rank0.join();
  CHECK(waited);
  CHECK(w1_reported_before_w0_returned);
  REQUIRE(error0 != nullptr);
  REQUIRE(error1 != nullptr);
  CHECK(error_of(error0) ==
        "ConnectionError: join on rpc worker \"w0\": workers [\"w2\"] shut down without joining");
  CHECK(error_of(error1) ==
        "ConnectionError: join on rpc worker \"w1\": workers [\"w2\"] shut down without joining");
}

TEST_CASE("the wait's timeout bounds its store calls: a store server that went away fails "
          "the wait by then, not after the store's own timeout",
          "[rendezvous][quiet]") {
  // The store's own timeout (the connect retries' too) is an hour: the
  // wait must give up at its own 300 ms. (Rank 0 hosts the store in PIPE's
  // static groups; here it left while w1 still waited.)
  auto server = std::make_unique<TcpStoreServer>();
  TcpStoreOptions options;
  options.timeout = std::chrono::hours(1);
  TcpStore store("127.0.0.1", server->port(), options);
  server->stop();
  // The call that finds the server gone fails at once and closes the
  // connection: the wait's calls must connect again, and would retry for
  // the store's hour.
  CHECK_THROWS_AS(store.check({"anything"}), ConnectionError);
  IdleCalls calls("w1");
  QuietGroup group;
  group.calls = &calls;
  group.store = &store;
  group.prefix = "join/0/";
  group.rank = 1;
  group.names = {"w0", "w1"};
  group.timeout = std::chrono::milliseconds(300);
  group.who = "join on rpc worker \"w1\"";
  try {
    rendezvous::wait_for_quiet_group(group);
    FAIL("the wait returned without a store");
  } catch (const ConnectionError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1"));
  }
}
