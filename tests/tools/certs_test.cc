// `certs`, run as a process: a CA and certificates a PIPE worker accepts
// (checked with the same context code the agent uses, through two workers
// that call each other), keys only their owner can read, and refusals.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using sbtest::Subprocess;

namespace {

std::string fresh_dir() {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(root && *root ? root : "/tmp") + "/certs-XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern + "/job";
}

int mode_of(const std::string& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return static_cast<int>(info.st_mode & 0777);
}

struct Run {
  int status;
  std::string output;
};

Run certs(const std::vector<std::string>& args) {
  // Its errors go to stderr: read both streams as one.
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                sbtest::runfile("tools/certs/certs")};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess child(argv);
  Run run;
  run.output = child.read_all();
  run.status = child.wait();
  return run;
}

}  // namespace

TEST_CASE("certs makes a CA and certificates two PIPE workers accept", "[tools][certs]") {
  const std::string dir = fresh_dir();
  const Run run = certs({"--dir", dir, "n0", "n1"});
  INFO(run.output);
  REQUIRE(run.status == 0);
  CHECK_THAT(run.output, Catch::Contains("SWITCHBOARD_TLS_CERT_FILE=" + dir + "/n0.pem"));
  CHECK_THAT(run.output, Catch::Contains("SWITCHBOARD_TLS_CA_FILE=" + dir + "/ca.pem"));
  CHECK(mode_of(dir) == 0700);
  for (const char* key : {"/ca.key", "/n0.key", "/n1.key"}) CHECK(mode_of(dir + key) == 0600);

  auto store = std::make_shared<HashStore>();
  rpc::RpcContext contexts[2];
  for (auto& c : contexts) c.register_function("twice", [](int64_t x) { return 2 * x; });
  testing::on_threads(2, [&](int r) {
    const std::string name = r == 0 ? "n0" : "n1";
    contexts[r].init_rpc(
        name, "PIPE", r, 2,
        rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), std::chrono::seconds(30),
                                           "env://",
                                           {{"listen_address", "127.0.0.1"},
                                            {"tls_cert_file", dir + "/" + name + ".pem"},
                                            {"tls_key_file", dir + "/" + name + ".key"},
                                            {"tls_ca_file", dir + "/ca.pem"}}),
        store);
  });
  CHECK(contexts[0].rpc_sync<int64_t>("n1", "twice", int64_t{21}) == 42);
  testing::on_threads(2, [&](int r) { contexts[r].shutdown(); });
}

TEST_CASE("certs refuses a directory that has a CA, and names that are not plain",
          "[tools][certs]") {
  const std::string dir = fresh_dir();
  REQUIRE(certs({"--dir", dir, "a"}).status == 0);
  Run again = certs({"--dir", dir, "b"});
  CHECK(again.status == 1);
  CHECK_THAT(again.output, Catch::Contains("ca.pem exists"));
  CHECK_FALSE(std::filesystem::exists(dir + "/b.pem"));

  const std::string other = fresh_dir();
  Run bad = certs({"--dir", other, "../escape"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, Catch::Contains("\"../escape\" is not a plain name"));
  CHECK_FALSE(std::filesystem::exists(other));
}
