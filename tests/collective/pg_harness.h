// Ranks as threads for ProcessGroup tests.
//
// make_groups() builds one GlooProcessGroup per rank over one shared store,
// each rank constructing its group on its own thread (rendezvous needs them
// all at once), bound to 127.0.0.1. run_on() then runs a body on every
// rank's thread. Catch2 assertions are not thread-safe, so a body records
// failures in its RankLog and the main thread reports them with report().
//
// The first exception any rank throws is rethrown on the main thread once
// every rank returned. Every op is bounded by the group timeout, so ranks
// that have not returned long after it are a hang in the code under test: a
// watchdog then prints the stuck ranks and aborts the binary rather than
// letting the test run into Bazel's timeout silently.
//
// Thread safety: a RankLog belongs to one rank's thread; everything else is
// called from the test's main thread.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/tensor.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"

namespace sbtest {

using Groups = std::vector<std::unique_ptr<switchboard::collective::GlooProcessGroup>>;

// A group name no other group of this binary uses: "<base>-<n>".
inline std::string unique_group_name(std::string_view base) {
  static std::atomic<int> counter{0};
  return fmt::format("{}-{}", base, counter.fetch_add(1));
}

// How long the main thread lets ranks run whose ops are bounded by `timeout`.
inline std::chrono::milliseconds watchdog_for(std::chrono::milliseconds timeout) {
  return 2 * timeout + std::chrono::milliseconds(60'000);
}

// Runs body(rank) for rank 0..n-1, each on its own thread, and returns when
// all returned. Rethrows the exception the first failing rank threw (first
// in time). Aborts the binary if they have not all returned in `watchdog`.
inline void run_threads(int n, const std::function<void(int rank)>& body,
                        std::chrono::milliseconds watchdog) {
  // What the rank threads report (a struct: SB_GUARDED_BY applies to
  // members, not to local variables).
  struct Shared {
    explicit Shared(int n) : done(n, false) {}
    switchboard::Mutex mu;
    switchboard::CondVar all_done;
    std::vector<bool> done SB_GUARDED_BY(mu);
    int finished SB_GUARDED_BY(mu) = 0;
    std::exception_ptr first SB_GUARDED_BY(mu);
    int first_rank SB_GUARDED_BY(mu) = -1;
  } shared(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&shared, &body, rank] {
      std::exception_ptr error;
      try {
        body(rank);
      } catch (...) {
        error = std::current_exception();
      }
      switchboard::MutexLock lock(shared.mu);
      if (error && !shared.first) {
        shared.first = error;
        shared.first_rank = rank;
      }
      shared.done[rank] = true;
      ++shared.finished;
      shared.all_done.notify_all();
    });
  }
  std::exception_ptr first;
  int first_rank = -1;
  {
    switchboard::MutexLock lock(shared.mu);
    if (!shared.all_done.wait_for(shared.mu, watchdog, [&]() SB_REQUIRES(shared.mu) {
          return shared.finished == n;
        })) {
      std::string stuck;
      for (int rank = 0; rank < n; ++rank) {
        if (!shared.done[rank]) stuck += fmt::format(" {}", rank);
      }
      fmt::print(stderr, "pg_harness: ranks{} still running after {} ms: a hang\n", stuck,
                 watchdog.count());
      std::fflush(stderr);
      std::abort();
    }
    first = shared.first;  // every rank has reported: no more writes
    first_rank = shared.first_rank;
  }
  for (auto& thread : threads) thread.join();
  if (first) {
    UNSCOPED_INFO("rank " << first_rank << " threw first");
    std::rethrow_exception(first);
  }
}

// The options of a group named `name` bound to 127.0.0.1.
inline switchboard::collective::GlooOptions loopback_options(
    const std::string& name, std::chrono::milliseconds timeout) {
  switchboard::collective::GlooOptions options;
  options.group_name = name;
  options.timeout = timeout;
  options.hostname = "127.0.0.1";
  return options;
}

// A client of the TcpStoreServer on 127.0.0.1:`port` (the ranks that run
// as processes).
inline std::unique_ptr<switchboard::TcpStore> connect_store(const std::string& port) {
  switchboard::TcpStoreOptions options;
  options.timeout = std::chrono::seconds(60);
  return std::make_unique<switchboard::TcpStore>(
      "127.0.0.1", static_cast<uint16_t>(std::stoi(port)), options);
}

// What a Work's wait() threw: its kind and message, and how long it took.
struct Outcome {
  std::string kind;  // "TimeoutError", "ConnectionError", "Error(Code)", "none", ...
  std::string message;
  std::chrono::milliseconds elapsed{0};
};

inline Outcome wait_for_failure(
    const switchboard::collective::Work& work,
    std::optional<switchboard::collective::Work::Timeout> timeout = std::nullopt) {
  const auto start = std::chrono::steady_clock::now();
  Outcome outcome;
  try {
    if (timeout) {
      work.wait(*timeout);
    } else {
      work.wait();
    }
    outcome.kind = "none";
  } catch (const switchboard::TimeoutError& e) {
    outcome = {"TimeoutError", e.what()};
  } catch (const switchboard::ConnectionError& e) {
    outcome = {"ConnectionError", e.what()};
  } catch (const switchboard::Error& e) {
    outcome = {fmt::format("Error({})", switchboard::error_code_name(e.code())),
               e.what()};
  } catch (const std::exception& e) {
    outcome = {"std::exception", e.what()};
  }
  outcome.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  return outcome;
}

// One GlooProcessGroup per rank of a group named `name`, rendezvoused
// through `store`, bound to 127.0.0.1.
inline Groups make_groups(switchboard::Store& store, int n, const std::string& name,
                          std::chrono::milliseconds timeout) {
  const auto options = loopback_options(name, timeout);
  Groups groups(n);
  run_threads(
      n,
      [&](int rank) {
        groups[rank] = std::make_unique<switchboard::collective::GlooProcessGroup>(
            store, rank, n, options);
      },
      watchdog_for(timeout));
  return groups;
}

// The same over a fresh HashStore.
inline Groups make_groups(
    int n, const std::string& name,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(30'000)) {
  switchboard::HashStore store;
  return make_groups(store, n, name, timeout);
}

// Tensor elements as doubles (the test values are small and exact in every
// dtype). Bool elements are their raw byte, so a 2 where 1 belongs shows.
// CPU contiguous tensors only.
inline double element(const switchboard::Tensor& t, int64_t i) {
  using switchboard::DType;
  const char* p = static_cast<const char*>(t.data()) + i * t.element_size();
  auto load = [p](auto zero) {
    std::memcpy(&zero, p, sizeof(zero));
    return zero;
  };
  switch (t.dtype()) {
    case DType::kFloat16:
      return switchboard::half_to_float(load(uint16_t{}));
    case DType::kBFloat16:
      return switchboard::bfloat16_to_float(load(uint16_t{}));
    case DType::kFloat32:
      return load(float{});
    case DType::kFloat64:
      return load(double{});
    case DType::kInt8:
      return load(int8_t{});
    case DType::kUInt8:
      return load(uint8_t{});
    case DType::kInt32:
      return load(int32_t{});
    case DType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DType::kBool:
      return load(uint8_t{});
  }
  return 0;
}

inline void set_element(const switchboard::Tensor& t, int64_t i, double value) {
  using switchboard::DType;
  char* p = static_cast<char*>(t.data()) + i * t.element_size();
  auto store = [p](auto typed) { std::memcpy(p, &typed, sizeof(typed)); };
  switch (t.dtype()) {
    case DType::kFloat16:
      return store(switchboard::float_to_half(static_cast<float>(value)));
    case DType::kBFloat16:
      return store(switchboard::float_to_bfloat16(static_cast<float>(value)));
    case DType::kFloat32:
      return store(static_cast<float>(value));
    case DType::kFloat64:
      return store(value);
    case DType::kInt8:
      return store(static_cast<int8_t>(value));
    case DType::kUInt8:
      return store(static_cast<uint8_t>(value));
    case DType::kInt32:
      return store(static_cast<int32_t>(value));
    case DType::kInt64:
      return store(static_cast<int64_t>(value));
    case DType::kBool:
      return store(static_cast<uint8_t>(value != 0));
  }
}

inline std::vector<double> values_of(const switchboard::Tensor& t) {
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) values[i] = element(t, i);
  return values;
}

// A CPU tensor whose element i (in row-major order) is value(i).
inline switchboard::Tensor filled(switchboard::DType dtype,
                                  const switchboard::Tensor::Shape& shape,
                                  const std::function<double(int64_t)>& value) {
  switchboard::Tensor t = switchboard::Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) set_element(t, i, value(i));
  return t;
}

// "[1, 2, 3]", at most 24 values.
inline std::string render(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size() && i < 24; ++i) {
    out += fmt::format("{}{}", i == 0 ? "" : ", ", values[i]);
  }
  return out + (values.size() > 24 ? ", ...]" : "]");
}

// What one rank saw go wrong, reported later on the main thread.
class RankLog {
 public:
  explicit RankLog(int rank) : rank_(rank) {}

  void fail(std::string_view what) {
    failures_.push_back(fmt::format("rank {}: {}", rank_, what));
  }
  void expect(bool ok, std::string_view what) {
    if (!ok) fail(what);
  }

  // Records a failure unless `got` holds exactly `want`.
  void expect_values(const switchboard::Tensor& got, const std::vector<double>& want,
                     std::string_view what) {
    std::vector<double> values = values_of(got);
    if (values == want) return;
    size_t bad = 0;
    while (bad < values.size() && bad < want.size() && values[bad] == want[bad]) ++bad;
    fail(fmt::format("{}: first difference at element {}; got {}, expected {}", what, bad,
                     render(values), render(want)));
  }

  // Records a failure unless `call` throws Exception whose message contains
  // every fragment.
  template <typename Exception, typename Call>
  void expect_throws(Call&& call, std::string_view what,
                     const std::vector<std::string>& fragments) {
    try {
      call();
    } catch (const Exception& e) {
      const std::string message = e.what();
      for (const auto& fragment : fragments) {
        if (message.find(fragment) == std::string::npos) {
          fail(fmt::format("{}: message \"{}\" does not name \"{}\"", what, message,
                           fragment));
        }
      }
      return;
    } catch (const std::exception& e) {
      fail(fmt::format("{}: threw the wrong exception type: {}", what, e.what()));
      return;
    }
    fail(fmt::format("{}: did not throw", what));
  }

  const std::vector<std::string>& failures() const { return failures_; }

 private:
  int rank_;
  std::vector<std::string> failures_;
};

using RankBody =
    std::function<void(switchboard::collective::GlooProcessGroup& pg, RankLog& log)>;

// Runs body on every rank of `groups` (one thread each) and returns every
// rank's failures, rank by rank.
inline std::vector<std::string> run_on(Groups& groups, const RankBody& body) {
  const int n = static_cast<int>(groups.size());
  std::vector<RankLog> logs;
  for (int rank = 0; rank < n; ++rank) logs.emplace_back(rank);
  run_threads(
      n, [&](int rank) { body(*groups[rank], logs[rank]); },
      watchdog_for(groups[0]->timeout()));
  std::vector<std::string> failures;
  for (const auto& log : logs) {
    failures.insert(failures.end(), log.failures().begin(), log.failures().end());
  }
  return failures;
}

// Reports failures as failed checks of the calling (main) thread; at most
// 40 are listed, then their count.
inline void report(const std::vector<std::string>& failures) {
  for (size_t i = 0; i < failures.size() && i < 40; ++i) FAIL_CHECK(failures[i]);
  INFO(failures.size() << " failures in all");
  CHECK(failures.empty());
}

}  // namespace sbtest
