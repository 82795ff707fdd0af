// Named collective groups over GLOO, ranks as threads of this process: each
// rank has its own CollectiveContext over one shared HashStore. Gloo binds
// 127.0.0.1 through the GLOO factory's SWITCHBOARD_GLOO_HOSTNAME variable.
#include "collective/groups.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "store/hash_store.h"
#include "store/store.h"
#include "store/tcp_store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace {

constexpr GroupTimeout kTimeout = 30s;

// Runs body(rank) on one thread per rank; rethrows the first rank's error.
void run_ranks(int n, const std::function<void(int)>& body) {
  switchboard::testing::rethrow_first(switchboard::testing::on_threads(n, body));
}

using Contexts = std::vector<std::unique_ptr<CollectiveContext>>;

// n contexts named "m0".."m<n-1>" over `store` (none when null). Called on
// the main thread before any rank thread starts, so setenv is safe here.
Contexts make_contexts(int n, std::shared_ptr<Store> store) {
  setenv("SWITCHBOARD_GLOO_HOSTNAME", "127.0.0.1", 1);
  Contexts contexts;
  for (int rank = 0; rank < n; ++rank) {
    contexts.push_back(std::make_unique<CollectiveContext>());
    contexts.back()->set_default_store(store);
    contexts.back()->set_member_name(fmt::format("m{}", rank));
  }
  return contexts;
}

Tensor floats(std::vector<float> values) { return Tensor::from_vector<float>(values); }

}  // namespace

TEST_CASE(
    "ranks initialize a named group and run allreduce, broadcast and allgather by name",
    "[collective][groups]") {
  const int n = 3;
  auto contexts = make_contexts(n, std::make_shared<HashStore>());
  std::vector<std::vector<float>> sums(n), maxes(n), bcast(n), gathered(n);
  run_ranks(n, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    ctx.init_collective_group(n, rank, "gloo", "main", kTimeout);
    Tensor t = floats({float(rank), 1});
    ctx.allreduce(t, "main");
    sums[rank] = t.to_vector<float>();
    Tensor m = floats({float(rank)});
    ctx.allreduce(m, "main", ReduceOp::kMax);
    maxes[rank] = m.to_vector<float>();
    Tensor b = floats({float(rank * 100)});
    ctx.broadcast(b, 2, "main");
    bcast[rank] = b.to_vector<float>();
    std::vector<Tensor> outs;
    for (int r = 0; r < n; ++r) outs.push_back(Tensor::zeros({1}, DType::kFloat32));
    ctx.allgather(outs, floats({float(rank + 7)}), "main");
    for (auto& o : outs) gathered[rank].push_back(o.to_vector<float>()[0]);
  });
  for (int rank = 0; rank < n; ++rank) {
    CHECK(sums[rank] == std::vector<float>{3, 3});
    CHECK(maxes[rank] == std::vector<float>{2});
    CHECK(bcast[rank] == std::vector<float>{200});
    CHECK(gathered[rank] == std::vector<float>{7, 8, 9});
    CHECK(contexts[rank]->is_group_initialized("main"));
    CHECK(contexts[rank]->get_rank("main") == rank);
    CHECK(contexts[rank]->get_collective_group_size("main") == n);
    CHECK(contexts[rank]->initialized_groups() == std::vector<std::string>{"main"});
  }
}

TEST_CASE("groups over overlapping rank sets are told apart by name",
          "[collective][groups]") {
  // World of 3: group "a" = ranks {0, 1, 2}; group "b" = {1, 2} (as b's 0, 1).
  const int n = 3;
  auto contexts = make_contexts(n, std::make_shared<HashStore>());
  std::vector<std::vector<float>> a_sums(n), b_sums(n), a_again(n), b_bcast(n);
  std::vector<int> b_rank(n), b_size(n);
  run_ranks(n, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    ctx.init_collective_group(3, rank, "GLOO", "a", kTimeout);
    if (rank >= 1) ctx.init_collective_group(2, rank - 1, "gloo", "b", kTimeout);
    Tensor a = floats({float(rank + 1)});
    Tensor b = floats({float(10 * rank)});
    ctx.allreduce(a, "a");
    if (rank >= 1) ctx.allreduce(b, "b");
    Tensor a2 = floats({float(rank)});
    ctx.allreduce(a2, "a", ReduceOp::kMin);
    Tensor b2 = floats({float(rank)});
    if (rank >= 1) ctx.broadcast(b2, 1, "b");  // b's rank 1 is world rank 2
    a_sums[rank] = a.to_vector<float>();
    b_sums[rank] = b.to_vector<float>();
    a_again[rank] = a2.to_vector<float>();
    b_bcast[rank] = b2.to_vector<float>();
    b_rank[rank] = ctx.get_rank("b");
    b_size[rank] = ctx.get_collective_group_size("b");
  });
  for (int rank = 0; rank < n; ++rank) {
    CHECK(a_sums[rank] == std::vector<float>{6});
    CHECK(a_again[rank] == std::vector<float>{0});
  }
  CHECK(b_sums[0] == std::vector<float>{0});  // untouched: not a member
  CHECK(b_sums[1] == std::vector<float>{30});
  CHECK(b_sums[2] == std::vector<float>{30});
  CHECK(b_bcast[1] == std::vector<float>{2});
  CHECK(b_bcast[2] == std::vector<float>{2});
  CHECK(b_rank == std::vector<int>{-1, 0, 1});
  CHECK(b_size == std::vector<int>{-1, 2, 2});
  CHECK_FALSE(contexts[0]->is_group_initialized("b"));
}

TEST_CASE("create_collective_group declares a group that members initialize on first use",
          "[collective][groups]") {
  auto store = std::make_shared<HashStore>();
  // m0..m2 are members (in rank order m2, m0, m1); m3 is not.
  auto contexts = make_contexts(4, store);
  const GroupSpec spec{"decl", 3, "gloo", {"m2", "m0", "m1"}, kTimeout};
  const std::vector<int> expected_rank = {1, 2, 0, -1};
  std::vector<std::vector<float>> sums(4);
  std::vector<int> ranks(4), sizes(4);
  std::vector<bool> initialized_before(4);
  std::string outsider_error;
  for (int i = 0; i < 4; ++i)
    initialized_before[i] = contexts[i]->is_group_initialized("decl");

  // The members may start before or after the spec is written: an op waits
  // for the spec either way.
  std::exception_ptr members_error;
  std::thread members([&] {
    try {
      run_ranks(4, [&](int i) {
        CollectiveContext& ctx = *contexts[i];
        Tensor t = floats({float(expected_rank[i] + 1)});
        if (i == 3) {
          try {
            ctx.allreduce(t, "decl");
          } catch (const std::invalid_argument& e) {
            outsider_error = e.what();
          }
        } else {
          ctx.allreduce(t, "decl");
        }
        sums[i] = t.to_vector<float>();
        ranks[i] = ctx.get_rank("decl");
        sizes[i] = ctx.get_collective_group_size("decl");
      });
    } catch (...) {
      members_error = std::current_exception();
    }
  });
  CollectiveContext driver;
  driver.create_collective_group(spec, store);
  members.join();
  if (members_error) std::rethrow_exception(members_error);

  for (int i = 0; i < 4; ++i) {
    CHECK_FALSE(initialized_before[i]);
    CHECK(ranks[i] == expected_rank[i]);
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(sums[i] == std::vector<float>{6});
    CHECK(sizes[i] == 3);
    CHECK(contexts[i]->is_group_initialized("decl"));
  }
  CHECK(sizes[3] == -1);
  CHECK(sums[3] == std::vector<float>{0});  // untouched
  CHECK(outsider_error ==
        "allreduce: this process (member \"m3\") is not a member of collective group "
        "\"decl\"");
  CHECK_FALSE(contexts[3]->is_group_initialized("decl"));
  CHECK_FALSE(driver.is_group_initialized("decl"));

  // Declaring the same spec again is fine; a different one is not.
  driver.create_collective_group(spec, store);
  GroupSpec other = spec;
  other.members = {"m0", "m1", "m2"};
  try {
    driver.create_collective_group(other, store);
    FAIL("a different spec replaced the existing one");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("\"decl\" already has a different spec") &&
                             Catch::Contains("members [\"m2\", \"m0\", \"m1\"]"));
  }
  CHECK(decode_group_spec(to_string(store->get("collective/specs/decl"))) ==
        GroupSpec{"decl", 3, "GLOO", {"m2", "m0", "m1"}, kTimeout});
}

TEST_CASE("a group spec survives encoding and bad specs are refused",
          "[collective][groups]") {
  GroupSpec spec{"g", 2, "Gloo", {"host-a:1", "x=y"}, 1234ms};
  GroupSpec decoded = decode_group_spec(encode_group_spec(spec));
  spec.backend = "GLOO";
  CHECK(decoded == spec);
  CHECK_THROWS_AS(encode_group_spec({"g", 3, "GLOO", {"a", "b"}, kTimeout}),
                  std::invalid_argument);
  CHECK_THROWS_AS(encode_group_spec({"g", 2, "GLOO", {"a", "a"}, kTimeout}),
                  std::invalid_argument);
  CHECK_THROWS_AS(encode_group_spec({"a/b", 1, "GLOO", {"a"}, kTimeout}),
                  std::invalid_argument);
  CHECK_THROWS_AS(decode_group_spec("garbage"), std::invalid_argument);
  CHECK_THROWS_AS(decode_group_spec(""), std::invalid_argument);
}

TEST_CASE("destroy then init again under the same name starts a new generation",
          "[collective][groups]") {
  auto store = std::make_shared<HashStore>();
  auto contexts = make_contexts(3, store);
  std::vector<std::vector<float>> first(2), second(2), third(3);
  std::vector<bool> destroyed(2), destroyed_twice(2, true);
  run_ranks(2, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    ctx.init_collective_group(2, rank, "gloo", "again", kTimeout);
    Tensor t = floats({float(rank + 1)});
    ctx.allreduce(t, "again");
    first[rank] = t.to_vector<float>();
    destroyed[rank] = ctx.destroy_collective_group("again");
    destroyed_twice[rank] = ctx.destroy_collective_group("again");
    ctx.init_collective_group(2, rank, "gloo", "again", kTimeout);
    Tensor u = floats({float(10 * (rank + 1))});
    ctx.allreduce(u, "again");
    second[rank] = u.to_vector<float>();
    ctx.destroy_collective_group("again");
  });
  // A third generation with a different world size.
  run_ranks(3, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    ctx.init_collective_group(3, rank, "gloo", "again", kTimeout);
    Tensor t = floats({float(rank)});
    ctx.allreduce(t, "again");
    third[rank] = t.to_vector<float>();
  });
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(first[rank] == std::vector<float>{3});
    CHECK(destroyed[rank]);
    CHECK_FALSE(destroyed_twice[rank]);
    CHECK(second[rank] == std::vector<float>{30});
  }
  for (int rank = 0; rank < 3; ++rank) CHECK(third[rank] == std::vector<float>{3});
  // The generation counters of groups.h.
  CHECK(to_string(store->get("collective/again/inits/2/0")) == "2");
  CHECK(to_string(store->get("collective/again/inits/2/1")) == "2");
  CHECK(to_string(store->get("collective/again/inits/3/2")) == "1");
}

TEST_CASE("initializing a group twice is an error naming it", "[collective][groups]") {
  auto contexts = make_contexts(1, std::make_shared<HashStore>());
  CollectiveContext& ctx = *contexts[0];
  ctx.init_collective_group(1, 0, "gloo", "twice", kTimeout);
  CHECK_THROWS_MATCHES(
      ctx.init_collective_group(1, 0, "gloo", "twice", kTimeout), std::invalid_argument,
      Catch::Message(
          "init_collective_group: collective group \"twice\" is already initialized "
          "in this process (rank 0 of 1); call destroy_collective_group(\"twice\") "
          "first"));
  CHECK(ctx.is_group_initialized("twice"));
  CHECK_THROWS_AS(ctx.init_collective_group(0, 0, "gloo", "bad"), std::invalid_argument);
  CHECK_THROWS_AS(ctx.init_collective_group(2, 2, "gloo", "bad"), std::invalid_argument);
  CHECK_THROWS_AS(ctx.init_collective_group(1, 0, "gloo", "a/b"), std::invalid_argument);
  CHECK_THROWS_AS(ctx.init_collective_group(1, 0, "gloo", ""), std::invalid_argument);
}

TEST_CASE("an op on a group nobody initialized or declared times out naming the spec key",
          "[collective][groups]") {
  auto contexts = make_contexts(1, std::make_shared<HashStore>());
  CollectiveContext& ctx = *contexts[0];
  ctx.set_spec_wait_timeout(50ms);
  Tensor t = floats({1});
  CHECK_THROWS_MATCHES(ctx.allreduce(t, "ghost"), TimeoutError,
                       Catch::Predicate<TimeoutError>([](const TimeoutError& e) {
                         std::string what = e.what();
                         return what.find("\"ghost\"") != std::string::npos &&
                                what.find("\"collective/specs/ghost\"") !=
                                    std::string::npos;
                       }));
  CHECK(ctx.get_rank("ghost") == -1);
  CHECK(ctx.get_collective_group_size("ghost") == -1);
  CHECK_FALSE(ctx.is_group_initialized("ghost"));
}

TEST_CASE(
    "without a store, groups rendezvous at MASTER_ADDR:MASTER_PORT, naming what is "
    "missing",
    "[collective][groups]") {
  auto contexts = make_contexts(2, nullptr);
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  CHECK_THROWS_MATCHES(
      contexts[0]->init_collective_group(2, 0, "gloo", "env", kTimeout),
      std::invalid_argument,
      Catch::Predicate<std::invalid_argument>([](const std::exception& e) {
        return std::string(e.what()).find(
                   "environment variables MASTER_ADDR and MASTER_PORT are not "
                   "set") != std::string::npos;
      }));
  CHECK(contexts[0]->get_rank("env") == -1);  // nothing known, no error

  setenv("MASTER_ADDR", "127.0.0.1", 1);
  CHECK_THROWS_MATCHES(
      contexts[0]->init_collective_group(2, 0, "gloo", "env", kTimeout),
      std::invalid_argument,
      Catch::Predicate<std::invalid_argument>([](const std::exception& e) {
        return std::string(e.what()).find(
                   "environment variable MASTER_PORT is not set") != std::string::npos;
      }));
  setenv("MASTER_PORT", "notaport", 1);
  CHECK_THROWS_WITH(contexts[0]->init_collective_group(2, 0, "gloo", "env", kTimeout),
                    Catch::Contains("\"notaport\""));
  CHECK_FALSE(contexts[0]->is_group_initialized("env"));

  TcpStoreOptions options;
  options.is_master = true;
  options.timeout = kTimeout;
  TcpStore master("127.0.0.1", 0, options);
  setenv("MASTER_PORT", std::to_string(master.port()).c_str(), 1);
  std::vector<std::vector<float>> sums(2);
  run_ranks(2, [&](int rank) {
    contexts[rank]->init_collective_group(2, rank, "gloo", "env", kTimeout);
    Tensor t = floats({float(rank + 1)});
    contexts[rank]->allreduce(t, "env");
    sums[rank] = t.to_vector<float>();
  });
  CHECK(sums[0] == std::vector<float>{3});
  CHECK(sums[1] == std::vector<float>{3});
  CHECK(to_string(master.get("collective/env/inits/2/1")) == "1");
  for (auto& ctx : contexts) ctx->destroy_collective_group("env");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
}

TEST_CASE("every op is reachable by group name", "[collective][groups]") {
  const int n = 2;
  auto contexts = make_contexts(n, std::make_shared<HashStore>());
  struct Results {
    std::vector<float> reduced, gathered, scattered, reduce_scattered, alltoall,
        alltoall_single, received;
    std::string multigpu_error;
  };
  std::vector<Results> results(n);
  run_ranks(n, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    Results& out = results[rank];
    ctx.init_collective_group(n, rank, "gloo", "ops", kTimeout);
    const float r = float(rank);

    Tensor red = floats({r + 1});
    ctx.reduce(red, 1, "ops");
    out.reduced = red.to_vector<float>();

    std::vector<Tensor> gathered;
    if (rank == 0) gathered = {floats({0}), floats({0})};
    ctx.gather(gathered, floats({r + 5}), 0, "ops");
    for (auto& g : gathered) out.gathered.push_back(g.to_vector<float>()[0]);

    Tensor scattered = floats({0});
    std::vector<Tensor> pieces;
    if (rank == 1) pieces = {floats({40}), floats({41})};
    ctx.scatter(scattered, pieces, 1, "ops");
    out.scattered = scattered.to_vector<float>();

    Tensor rs = floats({0});
    ctx.reduce_scatter(rs, {floats({r}), floats({10 * r + 1})}, "ops");
    out.reduce_scattered = rs.to_vector<float>();

    std::vector<Tensor> a2a_out = {floats({0}), floats({0})};
    ctx.alltoall(a2a_out, {floats({10 * r}), floats({10 * r + 1})}, "ops");
    for (auto& o : a2a_out) out.alltoall.push_back(o.to_vector<float>()[0]);

    Tensor single_out = floats({0, 0});
    ctx.alltoall_single(single_out, floats({100 * r, 100 * r + 1}), "ops");
    out.alltoall_single = single_out.to_vector<float>();

    ctx.barrier("ops");
    Tensor p2p = floats({0});
    if (rank == 0) {
      ctx.send(floats({77}), 1, "ops", 3);
    } else {
      ctx.recv(p2p, 0, "ops", 3);
    }
    out.received = p2p.to_vector<float>();

    std::vector<Tensor> devices = {floats({1})};
    try {
      ctx.allreduce_multigpu(devices, "ops");
    } catch (const std::invalid_argument& e) {
      out.multigpu_error = e.what();
    }
  });
  CHECK(results[1].reduced == std::vector<float>{3});
  CHECK(results[0].gathered == std::vector<float>{5, 6});
  CHECK(results[0].scattered == std::vector<float>{40});
  CHECK(results[1].scattered == std::vector<float>{41});
  CHECK(results[0].reduce_scattered == std::vector<float>{1});   // 0 + 1
  CHECK(results[1].reduce_scattered == std::vector<float>{12});  // 1 + 11
  CHECK(results[0].alltoall == std::vector<float>{0, 10});
  CHECK(results[1].alltoall == std::vector<float>{1, 11});
  CHECK(results[0].alltoall_single == std::vector<float>{0, 100});
  CHECK(results[1].alltoall_single == std::vector<float>{1, 101});
  CHECK(results[1].received == std::vector<float>{77});
  for (int rank = 0; rank < n; ++rank) {
    CHECK_THAT(results[rank].multigpu_error, Catch::Contains("GLOO"));
  }
}

TEST_CASE("the free functions use the process's global context", "[collective][groups]") {
  setenv("SWITCHBOARD_GLOO_HOSTNAME", "127.0.0.1", 1);
  auto store = std::make_shared<HashStore>();
  CollectiveContext::global().set_default_store(store);
  init_collective_group(1, 0, "gloo", "solo", kTimeout);
  CHECK(is_group_initialized("solo"));
  CHECK(get_rank("solo") == 0);
  CHECK(get_collective_group_size("solo") == 1);
  Tensor t = floats({2, 3});
  allreduce(t, "solo", ReduceOp::kProduct);
  broadcast(t, 0, "solo");
  barrier("solo");
  CHECK(t.to_vector<float>() == std::vector<float>{2, 3});

  create_collective_group({"solo-declared", 1, "gloo", {"me"}, kTimeout});
  CollectiveContext::global().set_member_name("me");
  Tensor u = floats({4});
  allreduce(u, "solo-declared");
  CHECK(get_rank("solo-declared") == 0);

  CHECK(destroy_collective_group("solo"));
  CHECK(destroy_collective_group("solo-declared"));
  CHECK_FALSE(destroy_collective_group("solo"));
  CHECK_FALSE(is_group_initialized("solo"));
  CollectiveContext::global().set_default_store(nullptr);
}
