// Mutual TLS on PIPE connections (agents/pipe/transport/tls/): workers with
// certificates from the job's CA call each other, tensors included; a
// worker whose certificate another CA signed, whose certificate expired,
// or that speaks plain TCP does not get in, and the group keeps working;
// files that cannot be used are refused at construction, naming them.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/agent.h"
#include "common/error.h"
#include "core/tensor.h"
#include "rpc/future.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/agents/pipe/test_util.h"
#include "tests/util/scoped_env.h"
#include "tests/util/test_certs.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace std::chrono_literals;
using pipe_test::kGuard;
using pipe_test::request;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;
using sbtest::ScopedEnv;
using sbtest::TestCa;
using sbtest::TlsFiles;

namespace {

PipeTlsOptions tls_of(const TlsFiles& files, const std::string& ca_file) {
  return {files.cert_file, files.key_file, ca_file};
}

PipeAgentOptions options_with(PipeTlsOptions tls, std::chrono::milliseconds timeout = 30s) {
  PipeAgentOptions options;
  options.listen_address = "127.0.0.1";
  options.num_worker_threads = 2;
  options.rpc_timeout = timeout;
  options.tls = std::move(tls);
  return options;
}

// Echoes the payload and the tensors.
void serve_echo(PipeAgent& agent) {
  agent.start([](Message m, const WorkerInfo&) {
    Message reply;
    reply.type = MessageType::kResponse;
    reply.payload = std::move(m.payload);
    reply.tensors = std::move(m.tensors);
    return Future<Message>::ready(std::move(reply));
  });
}

// Two dynamic members "m0" and "m1" with certificates of `ca`.
struct TlsGroup {
  explicit TlsGroup(TestCa& ca)
      : store(std::make_shared<HashStore>()),
        m0(store, "m0", 0, std::nullopt, options_with(tls_of(ca.issue("m0"), ca.ca_file()))),
        m1(store, "m1", 1, std::nullopt, options_with(tls_of(ca.issue("m1"), ca.ca_file()))) {
    serve_echo(m0);
    serve_echo(m1);
  }
  // A joiner with `tls`: the error its construction threw ("none" when it
  // joined).
  std::string join(const std::string& name, int rank, PipeTlsOptions tls) {
    return pipe_test::thrown_by([&] {
      PipeAgent joiner(store, name, rank, std::nullopt, options_with(std::move(tls), 5s));
    });
  }
  std::shared_ptr<HashStore> store;
  PipeAgent m0;
  PipeAgent m1;
};

}  // namespace

TEST_CASE("workers with certificates of the job's CA form a static group over TLS and "
          "echo tensors",
          "[pipe][tls]") {
  TestCa ca("job");
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<PipeAgent>> agents(2);
  std::vector<TlsFiles> files{ca.issue("w0"), ca.issue("w1")};
  testing::on_threads(2, [&](int r) {
    agents[r] = std::make_unique<PipeAgent>(store, fmt::format("w{}", r), r, 2,
                                            options_with(tls_of(files[r], ca.ca_file())));
  });
  for (auto& agent : agents) serve_echo(*agent);
  // Large enough to take many TLS records and many writes.
  std::vector<float> values(3 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 4093);
  for (int from = 0; from < 2; ++from) {
    INFO("from w" << from);
    Message m = request("echo");
    m.tensors.push_back(Tensor::from_vector(values, {static_cast<int64_t>(values.size())}));
    Future<Message> reply =
        agents[from]->send(agents[from]->worker(fmt::format("w{}", 1 - from)), m, kGuard);
    REQUIRE(reply.wait_for(kGuard));
    REQUIRE_FALSE(reply.has_error());
    REQUIRE(reply.value().tensors.size() == 1);
    const Tensor& back = reply.value().tensors[0];
    REQUIRE(back.numel() == static_cast<int64_t>(values.size()));
    CHECK(std::equal(values.begin(), values.end(), back.data_as<float>()));
  }
}

TEST_CASE("a joiner whose certificate another CA signed, or expired, or that has none, "
          "cannot join; the group is unchanged",
          "[pipe][tls][dynamic]") {
  TestCa ca("job");
  TestCa rogue("rogue");
  TlsGroup group(ca);

  const std::string foreign = group.join("j", 2, tls_of(rogue.issue("j"), rogue.ca_file()));
  INFO(foreign);
  // Refused, not unreachable: the members stay in the group.
  CHECK_THAT(foreign, Catch::StartsWith("AuthenticationError"));
  CHECK_THAT(foreign, Catch::Contains("cannot join the dynamic group"));
  CHECK_THAT(foreign, Catch::Contains("TLS handshake failed"));
  // The joiner checks the member's certificate against its own CA first.
  CHECK_THAT(foreign, Catch::Contains("certificate verify failed"));

  // With the job's CA file but a rogue certificate: the member refuses it.
  const std::string impostor = group.join("k", 3, tls_of(rogue.issue("k"), ca.ca_file()));
  INFO(impostor);
  CHECK_THAT(impostor, Catch::StartsWith("AuthenticationError"));

  const std::string expired = group.join("e", 4, tls_of(ca.issue("e", true), ca.ca_file()));
  INFO(expired);
  CHECK_THAT(expired, Catch::StartsWith("AuthenticationError"));

  // A worker without TLS is told so before it tries.
  const std::string plain = group.join("p", 5, PipeTlsOptions{});
  INFO(plain);
  CHECK_THAT(plain, Catch::StartsWith("invalid_argument"));
  CHECK_THAT(plain, Catch::Contains("worker \"m0\" uses TLS and worker \"p\" does not"));

  CHECK(group.m0.workers().size() == 2);
  CHECK(pipe_test::echo_round_trip(group.m0, "m1"));
  CHECK(pipe_test::echo_round_trip(group.m1, "m0"));
  // A joiner with a certificate of the job's CA gets in.
  PipeAgent good(group.store, "good", 6, std::nullopt,
                 options_with(tls_of(ca.issue("good"), ca.ca_file())));
  serve_echo(good);
  CHECK(pipe_test::echo_round_trip(good, "m0"));
  CHECK(pipe_test::echo_round_trip(group.m1, "good"));
  CHECK(group.m0.workers().size() == 3);
}

TEST_CASE("a static group where one worker has no TLS fails at once, naming both",
          "[pipe][tls]") {
  TestCa ca("job");
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  const TlsFiles w0 = ca.issue("w0");
  testing::on_threads(2, [&](int r) {
    errors[r] = pipe_test::thrown_by([&] {
      PipeAgent agent(store, fmt::format("w{}", r), r, 2,
                      options_with(r == 0 ? tls_of(w0, ca.ca_file()) : PipeTlsOptions{}));
    });
  });
  for (const std::string& error : errors) {
    INFO(error);
    CHECK_THAT(error, Catch::StartsWith("invalid_argument"));
    CHECK_THAT(error, Catch::Contains("worker \"w0\" uses TLS and worker \"w1\" does not"));
  }
}

TEST_CASE("a connection that never starts its TLS handshake is closed", "[pipe][tls]") {
  TestCa ca("job");
  auto store = std::make_shared<HashStore>();
  PipeAgentOptions options = options_with(tls_of(ca.issue("w0"), ca.ca_file()));
  options.heartbeat_timeout = 300ms;  // the bound on a handshake too
  PipeAgent w0(store, "w0", 0, 1, options);
  serve_echo(w0);
  const int fd = pipe_test::connect_loopback(w0.listen_port());
  // Nothing is sent; the agent closes it (EOF), it does not wait forever.
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, static_cast<int>(kGuard.count())) == 1);
  char byte = 0;
  CHECK(::recv(fd, &byte, 1, 0) <= 0);
  ::close(fd);
}

TEST_CASE("TLS files that cannot be used are refused at construction, named", "[pipe][tls]") {
  TestCa ca("job");
  const TlsFiles mine = ca.issue("w0");
  const TlsFiles other = ca.issue("w1");
  auto construct = [&](PipeTlsOptions tls) {
    return pipe_test::thrown_by([&] {
      PipeAgent agent(std::make_shared<HashStore>(), "w0", 0, 1, options_with(std::move(tls)));
    });
  };
  std::string error = construct({mine.cert_file, "", ""});
  CHECK_THAT(error, Catch::StartsWith("invalid_argument"));
  CHECK_THAT(error, Catch::Contains("SWITCHBOARD_TLS_KEY_FILE, SWITCHBOARD_TLS_CA_FILE"));

  error = construct({mine.cert_file, mine.key_file, ca.directory() + "/missing.pem"});
  CHECK_THAT(error, Catch::Contains("TLS CA file \"" + ca.directory() + "/missing.pem\""));

  error = construct({mine.cert_file, other.key_file, ca.ca_file()});
  CHECK_THAT(error, Catch::Contains("does not match the certificate"));

  REQUIRE(::chmod(mine.key_file.c_str(), 0644) == 0);
  error = construct({mine.cert_file, mine.key_file, ca.ca_file()});
  CHECK_THAT(error, Catch::Contains("has mode 644"));

  // A key file given where the certificate belongs is not a certificate.
  error = construct({other.key_file, other.key_file, ca.ca_file()});
  CHECK_THAT(error, Catch::Contains("TLS certificate file"));
}

TEST_CASE("init_rpc takes TLS from the SWITCHBOARD_TLS variables or the options' extras",
          "[pipe][tls]") {
  TestCa ca("job");
  const TlsFiles w0 = ca.issue("w0");
  const TlsFiles w1 = ca.issue("w1");
  auto store = std::make_shared<HashStore>();
  rpc::RpcContext c0;
  rpc::RpcContext c1;
  for (rpc::RpcContext* c : {&c0, &c1}) {
    c->register_function("add", [](int64_t a, int64_t b) { return a + b; });
  }
  {
    // w0 from the environment (read at construction, on this thread).
    ScopedEnv cert(PipeTlsOptions::kCertVariable, w0.cert_file);
    ScopedEnv key(PipeTlsOptions::kKeyVariable, w0.key_file);
    ScopedEnv ca_file(PipeTlsOptions::kCaVariable, ca.ca_file());
    testing::on_threads(2, [&](int r) {
      if (r == 0) {
        c0.init_rpc("w0", "PIPE", 0, 2, pipe_test::pipe_options(), store);
      } else {
        c1.init_rpc("w1", "PIPE", 1, 2,
                    pipe_test::pipe_options({{"tls_cert_file", w1.cert_file},
                                             {"tls_key_file", w1.key_file},
                                             {"tls_ca_file", ca.ca_file()}}),
                    store);
      }
    });
  }
  CHECK(c0.rpc_sync<int64_t>("w1", "add", int64_t{2}, int64_t{3}) == 5);
  CHECK(c1.rpc_sync<int64_t>("w0", "add", int64_t{4}, int64_t{5}) == 9);
  testing::on_threads(2, [&](int r) { (r == 0 ? c0 : c1).shutdown(); });
}
