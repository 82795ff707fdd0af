// PIPE dynamic groups, the joiner's side, against a member played by the
// test on a raw socket (agents/pipe/membership.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

#include "agents/pipe/agent.h"
#include "agents/pipe/announcement.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A listening socket on 127.0.0.1 that accepts one connection, reads what
// comes (the joiner's hello) and closes it without answering: a member
// that dies mid-join.
class DyingMember {
 public:
  DyingMember() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listen_fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_fd_, 1) == 0);
    socklen_t size = sizeof addr;
    REQUIRE(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &size) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      char buffer[256];
      (void)::recv(fd, buffer, sizeof buffer, 0);  // the hello
      ::close(fd);
    });
  }
  ~DyingMember() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST_CASE("a member lost while a worker joins counts as answered: the join does not wait "
          "out the timeout",
          "[pipe][dynamic]") {
  DyingMember ghost;
  auto store = std::make_shared<HashStore>();
  WorkerAnnouncement announcement;
  announcement.name = "ghost";
  announcement.address = "127.0.0.1";
  announcement.port = ghost.port();
  PrefixStore("pipe", store).set("dyn/members", encode_members({{0, announcement}}));

  PipeAgentOptions options;
  options.listen_address = "127.0.0.1";
  options.num_worker_threads = 2;
  options.rpc_timeout = 20s;
  const auto start = Clock::now();
  PipeAgent joiner(store, "w1", 1, std::nullopt, options);
  const auto took = Clock::now() - start;

  CHECK(took < 10s);  // it waited the whole rpc_timeout before
  CHECK(joiner.workers().size() == 1);  // the ghost is not a member
  const Bytes members = PrefixStore("pipe", store).get("dyn/members");
  const std::vector<Member> now = decode_members(members);
  REQUIRE(now.size() == 1);
  CHECK(now[0].announcement.name == "w1");
  joiner.shutdown();
}
