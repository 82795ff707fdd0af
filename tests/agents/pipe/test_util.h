// Helpers shared by the PIPE agent's tests (pipe_agent_test.cc,
// pipe_device_test.cc, pipe_dynamic_test.cc): outcomes of futures, PIPE
// options on 127.0.0.1, store clients, and child-process lines.
//
// Thread safety: plain functions; outcome_of() and expect_line() use
// Catch2 and belong on the test's own thread.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "agents/builtin_backends.h"
#include "core/tensor.h"
#include "common/error.h"
#include "rpc/backend_registry.h"
#include "rpc/future.h"
#include "core/remote_error.h"
#include "store/tcp_store.h"
#include "tests/util/subprocess.h"

namespace switchboard::pipe_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rpc::Future;
using sbtest::Subprocess;


// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 60s;

inline std::string worker_name(int rank) { return fmt::format("w{}", rank); }

// How a future ended: the error's kind and message, and when.
struct Outcome {
  std::string kind;  // "none", "ConnectionError", "TimeoutError", "RemoteError", ...
  std::string message;
  Clock::time_point at;
};

inline std::string kind_of(std::exception_ptr error, std::string& message) {
  try {
    std::rethrow_exception(error);
  } catch (const ConnectionError& e) {
    message = e.what();
    return "ConnectionError";
  } catch (const TimeoutError& e) {
    message = e.what();
    return "TimeoutError";
  } catch (const AuthenticationError& e) {
    message = e.what();
    return "AuthenticationError";
  } catch (const rpc::RemoteError& e) {
    message = e.what();
    return "RemoteError";
  } catch (const Error& e) {
    message = e.what();
    return fmt::format("Error({})", error_code_name(e.code()));
  } catch (const std::invalid_argument& e) {
    message = e.what();
    return "invalid_argument";
  } catch (const std::exception& e) {
    message = e.what();
    return "std::exception";
  }
}

template <typename T>
Outcome outcome_of(const Future<T>& future) {
  Outcome outcome;
  if (!future.wait_for(kGuard)) {
    outcome.kind = "still pending";
    outcome.at = Clock::now();
    return outcome;
  }
  outcome.at = Clock::now();
  outcome.kind = future.has_error() ? kind_of(future.error(), outcome.message) : "none";
  return outcome;
}

// What `run` threw, as "Kind: message" with kind_of()'s kinds ("none" when
// it returned).
inline std::string thrown_by(const std::function<void()>& run) {
  try {
    run();
  } catch (...) {
    std::string message;
    const std::string kind = kind_of(std::current_exception(), message);
    return kind + ": " + message;
  }
  return "none";
}

// PIPE options for the tests: loopback, a small pool, plus `more`.
inline std::shared_ptr<rpc::RpcBackendOptions> pipe_options(const rpc::Extras& more = {},
                                                     std::chrono::milliseconds timeout = 30s) {
  rpc::Extras extras{{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}};
  for (const auto& [key, value] : more) extras[key] = value;
  return rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), timeout, "env://",
                                            extras);
}

inline agents::PipeRpcBackendOptions& typed(const std::shared_ptr<rpc::RpcBackendOptions>& options) {
  return dynamic_cast<agents::PipeRpcBackendOptions&>(*options);
}

inline TcpStoreOptions client_options() {
  TcpStoreOptions options;
  options.timeout = kGuard;
  return options;
}

inline void say(const std::string& line) {
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

// Reads the child's stdout until `line` (log lines share stdout and are
// skipped); fails the test on EOF or after kGuard.
inline void expect_line(Subprocess& child, const std::string& line) {
  const auto deadline = Clock::now() + kGuard;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now());
    const std::string got = child.read_line(std::max(left, std::chrono::seconds(1)));
    if (got == line) return;
    UNSCOPED_INFO("child: " << got);
  }
}

// A CUDA tensor over host memory: the agent must refuse it before ever
// reading its bytes.
inline Tensor fake_cuda_tensor() {
  auto host = std::make_shared<std::vector<float>>(4, 1.5f);
  return Tensor::from_blob(host->data(), {4}, DType::kFloat32, Device::cuda(0), host);
}

// A request message for `function` carrying `payload`.
inline rpc::Message request(const std::string& function,
                            std::vector<uint8_t> payload = {1, 2, 3}) {
  rpc::Message m;
  m.type = rpc::MessageType::kRequest;
  m.function = function;
  m.payload = std::move(payload);
  return m;
}

// Whether `from` gets its payload back from worker `to`, which echoes
// (request() carries {1, 2, 3}).
template <typename Agent>
bool echo_round_trip(Agent& from, const std::string& to) {
  Future<rpc::Message> reply = from.send(from.worker(to), request("echo"), kGuard);
  return reply.wait_for(kGuard) && !reply.has_error() &&
         reply.value().payload == std::vector<uint8_t>{1, 2, 3};
}

// A TCP socket connected to 127.0.0.1:port (the test fails otherwise); the
// caller closes it.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0);
  return fd;
}

}  // namespace switchboard::pipe_test
