// The collective backend registry: built-ins, a user's backend used by name
// through named groups, and the errors for duplicate, unknown and
// unavailable backends.
#include "collective/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "collective/groups.h"
#include "common/error.h"
#include "common/mutex.h"
#include "store/hash_store.h"
#include "store/store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace {

// The meeting point of one generation of a "threads" group: every rank
// hands in its bytes and gets the reduction of all of them back.
class Hub {
 public:
  explicit Hub(int size) : size_(size) {}

  std::vector<uint8_t> combine(const void* data, size_t nbytes, DType dtype, ReduceOp op,
                               std::chrono::milliseconds timeout) {
    MutexLock lock(mu_);
    const uint64_t round = round_;
    const auto* bytes = static_cast<const uint8_t*>(data);
    if (arrived_ == 0) {
      accumulator_.assign(bytes, bytes + nbytes);
    } else if (nbytes > 0) {
      reduce_elements(op, dtype, accumulator_.data(), accumulator_.data(), data,
                      nbytes / dtype_size(dtype));
    }
    if (++arrived_ == size_) {
      // The result stays until the next round completes, which needs every
      // rank, so each rank reads its round's result.
      result_ = std::move(accumulator_);
      accumulator_.clear();
      arrived_ = 0;
      ++round_;
      changed_.notify_all();
      return result_;
    }
    if (!changed_.wait_for(mu_, timeout,
                           [&]() SB_REQUIRES(mu_) { return round_ != round; })) {
      throw TimeoutError(
          fmt::format("threads backend: {} of {} ranks arrived within {} ms", arrived_,
                      size_, timeout.count()));
    }
    return result_;
  }

 private:
  const int size_;
  Mutex mu_;
  CondVar changed_;
  int arrived_ SB_GUARDED_BY(mu_) = 0;
  uint64_t round_ SB_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t> accumulator_ SB_GUARDED_BY(mu_);
  std::vector<uint8_t> result_ SB_GUARDED_BY(mu_);
};

// Hubs by id; rank 0 creates one per group generation and publishes its id
// through the group's store, the others look it up.
Mutex g_hubs_mu;
std::map<std::string, std::shared_ptr<Hub>> g_hubs SB_GUARDED_BY(g_hubs_mu);
std::atomic<int> g_next_hub{0};
std::atomic<int> g_threads_factory_calls{0};

std::shared_ptr<Hub> meet(const GroupInit& init) {
  if (init.rank == 0) {
    std::string id = fmt::format("hub-{}", g_next_hub.fetch_add(1));
    {
      MutexLock lock(g_hubs_mu);
      g_hubs[id] = std::make_shared<Hub>(init.size);
    }
    init.store.set("threads/hub", id);
  }
  std::string id = to_string(init.store.get("threads/hub"));
  MutexLock lock(g_hubs_mu);
  return g_hubs.at(id);
}

// A ProcessGroup whose ranks are threads of this process. Implements
// allreduce and barrier; every other op is unsupported.
class ThreadsGroup final : public ProcessGroup {
 public:
  ThreadsGroup(const GroupInit& init, std::shared_ptr<Hub> hub)
      : ProcessGroup(init.rank, init.size, init.group_name, init.timeout),
        hub_(std::move(hub)) {}

  std::string backend_name() const override { return "THREADS"; }

  Work allreduce(Tensor& tensor, ReduceOp op) override {
    checks::tensor(where("allreduce"), tensor, Device::Type::kCpu);
    checks::reduce_op(where("allreduce"), op, tensor.dtype());
    auto result =
        hub_->combine(tensor.data(), tensor.nbytes(), tensor.dtype(), op, timeout());
    std::memcpy(tensor.data(), result.data(), result.size());
    if (op == ReduceOp::kAvg) {
      divide_elements(tensor.dtype(), tensor.data(), tensor.numel(), size());
    }
    return Work::done(work_info("allreduce"));
  }
  Work barrier() override {
    hub_->combine(nullptr, 0, DType::kUInt8, ReduceOp::kSum, timeout());
    return Work::done(work_info("barrier"));
  }

  Work broadcast(Tensor&, int) override { unsupported("broadcast"); }
  Work reduce(Tensor&, int, ReduceOp) override { unsupported("reduce"); }
  Work allgather(std::vector<Tensor>&, const Tensor&) override {
    unsupported("allgather");
  }
  Work gather(std::vector<Tensor>&, const Tensor&, int) override {
    unsupported("gather");
  }
  Work scatter(Tensor&, const std::vector<Tensor>&, int) override {
    unsupported("scatter");
  }
  Work reduce_scatter(Tensor&, const std::vector<Tensor>&, ReduceOp) override {
    unsupported("reduce_scatter");
  }
  Work alltoall(std::vector<Tensor>&, const std::vector<Tensor>&) override {
    unsupported("alltoall");
  }
  Work alltoall_single(Tensor&, const Tensor&) override {
    unsupported("alltoall_single");
  }
  Work send(const Tensor&, int, int) override { unsupported("send"); }
  Work recv(Tensor&, int, int) override { unsupported("recv"); }

 private:
  std::shared_ptr<Hub> hub_;
};

// Registers "threads" (lower case on purpose) once per process.
void register_threads_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_collective_backend("threads", [](const GroupInit& init) {
      g_threads_factory_calls.fetch_add(1);
      return std::make_unique<ThreadsGroup>(init, meet(init));
    });
  });
}

// Runs body(rank) on one thread per rank; rethrows the first rank's error.
void run_ranks(int n, const std::function<void(int)>& body) {
  switchboard::testing::rethrow_first(switchboard::testing::on_threads(n, body));
}

std::vector<std::unique_ptr<CollectiveContext>> make_contexts(
    int n, std::shared_ptr<Store> store) {
  std::vector<std::unique_ptr<CollectiveContext>> contexts;
  for (int rank = 0; rank < n; ++rank) {
    contexts.push_back(std::make_unique<CollectiveContext>());
    contexts.back()->set_default_store(store);
    contexts.back()->set_member_name(fmt::format("rank{}", rank));
  }
  return contexts;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

TEST_CASE("the built-ins GLOO and NCCL are registered without the user doing anything",
          "[collective][registry]") {
  auto names = registered_collective_backends();
  CHECK(contains(names, "GLOO"));
  CHECK(contains(names, "NCCL"));
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(is_collective_backend_registered("gloo"));
  CHECK(is_collective_backend_available("Gloo"));
}

TEST_CASE("NCCL is unavailable in a binary that does not link it, saying why",
          "[collective][registry]") {
  std::string why;
  CHECK_FALSE(is_collective_backend_available("nccl", &why));
  CHECK(why == "NCCL backend not linked into this binary (depend on //collective:nccl)");

  CollectiveContext context;
  context.set_default_store(std::make_shared<HashStore>());
  try {
    context.init_collective_group(1, 0, "NCCL", "gpu");
    FAIL("init_collective_group over NCCL succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK(
        std::string(e.what()) ==
        "collective backend \"NCCL\" is not available here: NCCL backend not linked into "
        "this binary (depend on //collective:nccl)");
  }
  CHECK_FALSE(context.is_group_initialized("gpu"));
}

TEST_CASE(
    "a registered backend runs collectives through named groups, by any case of its name",
    "[collective][registry]") {
  register_threads_backend();
  CHECK(contains(registered_collective_backends(), "THREADS"));
  const int n = 3;
  auto store = std::make_shared<HashStore>();
  auto contexts = make_contexts(n, store);
  const char* spellings[] = {"threads", "Threads", "THREADS"};
  std::vector<std::vector<float>> sums(n), avgs(n);
  std::vector<int> ranks(n), sizes(n);
  std::vector<std::string> backends(n);
  run_ranks(n, [&](int rank) {
    CollectiveContext& ctx = *contexts[rank];
    ctx.init_collective_group(n, rank, spellings[rank], "custom", 10s);
    Tensor t = Tensor::from_vector<float>({float(rank + 1), float(10 * rank)});
    ctx.allreduce(t, "custom");
    sums[rank] = t.to_vector<float>();
    Tensor a = Tensor::from_vector<float>({float(rank)});
    ctx.allreduce(a, "custom", ReduceOp::kAvg);
    avgs[rank] = a.to_vector<float>();
    ctx.barrier("custom");
    ranks[rank] = ctx.get_rank("custom");
    sizes[rank] = ctx.get_collective_group_size("custom");
    backends[rank] = ctx.get_group("custom")->backend_name();
  });
  for (int rank = 0; rank < n; ++rank) {
    CHECK(sums[rank] == std::vector<float>{6, 30});
    CHECK(avgs[rank] == std::vector<float>{1});
    CHECK(ranks[rank] == rank);
    CHECK(sizes[rank] == n);
    CHECK(backends[rank] == "THREADS");
  }
}

TEST_CASE("an op the custom backend does not implement fails naming it",
          "[collective][registry]") {
  register_threads_backend();
  CollectiveContext ctx;
  ctx.set_default_store(std::make_shared<HashStore>());
  ctx.init_collective_group(1, 0, "threads", "partial", 10s);
  Tensor t = Tensor::from_vector<float>({1});
  CHECK_THROWS_WITH(ctx.broadcast(t, 0, "partial"), Catch::Contains("broadcast"));
  CHECK(ctx.destroy_collective_group("partial"));
}

TEST_CASE("registering a name twice is an error naming the backend",
          "[collective][registry]") {
  register_threads_backend();
  auto factory = [](const GroupInit&) -> std::unique_ptr<ProcessGroup> {
    return nullptr;
  };
  CHECK_THROWS_MATCHES(
      register_collective_backend("Threads", factory), RegistryError,
      Catch::Message("collective backend \"THREADS\" is already registered"));
  CHECK_THROWS_MATCHES(
      register_collective_backend("gloo", factory), RegistryError,
      Catch::Message("collective backend \"GLOO\" is already registered"));
  CHECK_THROWS_AS(register_collective_backend("", factory), std::invalid_argument);
  CHECK_THROWS_AS(register_collective_backend("empty_factory", nullptr),
                  std::invalid_argument);
  CHECK_FALSE(is_collective_backend_registered("empty_factory"));
}

TEST_CASE("an unknown backend is an error naming it and the registered ones",
          "[collective][registry]") {
  std::string why;
  CHECK_FALSE(is_collective_backend_available("nosuch", &why));
  CHECK_THAT(why,
             Catch::StartsWith("unknown collective backend \"NOSUCH\" (registered: ") &&
                 Catch::Contains("\"GLOO\"") && Catch::Contains("\"NCCL\""));

  auto store = std::make_shared<HashStore>();
  CollectiveContext ctx;
  ctx.set_default_store(store);
  CHECK_THROWS_MATCHES(ctx.init_collective_group(1, 0, "NoSuch", "g"), RegistryError,
                       Catch::Predicate<RegistryError>([](const RegistryError& e) {
                         return std::string(e.what()).find("\"NOSUCH\"") !=
                                std::string::npos;
                       }));
  CHECK_FALSE(ctx.is_group_initialized("g"));
  CHECK(store->num_keys() == 0);  // checked before the store was touched

  GroupSpec spec{"declared", 1, "nosuch", {"rank0"}, 10s};
  CHECK_THROWS_AS(ctx.create_collective_group(spec), RegistryError);
}

TEST_CASE(
    "an unavailable backend is an error with its reason, and its factory is not called",
    "[collective][registry]") {
  static std::atomic<int> calls{0};
  static std::once_flag once;
  std::call_once(once, [] {
    register_collective_backend(
        "frobnicated",
        [](const GroupInit& init) -> std::unique_ptr<ProcessGroup> {
          calls.fetch_add(1);
          return nullptr;
        },
        [](std::string* why_not) {
          *why_not = "no frobnicator attached";
          return false;
        });
    register_collective_backend(
        "throwing_check",
        [](const GroupInit&) -> std::unique_ptr<ProcessGroup> { return nullptr; },
        [](std::string*) -> bool { throw std::runtime_error("driver exploded"); });
  });

  std::string why;
  CHECK(is_collective_backend_registered("FROBNICATED"));
  CHECK_FALSE(is_collective_backend_available("frobnicated", &why));
  CHECK(why == "no frobnicator attached");
  CHECK_FALSE(is_collective_backend_available("throwing_check", &why));
  CHECK_THAT(why, Catch::Contains("driver exploded"));

  register_threads_backend();
  CollectiveContext ctx;
  ctx.set_default_store(std::make_shared<HashStore>());
  try {
    ctx.init_collective_group(1, 0, "Frobnicated", "g", 10s);
    FAIL("init_collective_group over an unavailable backend succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK(std::string(e.what()) ==
          "collective backend \"FROBNICATED\" is not available here: no frobnicator "
          "attached");
  }
  CHECK(calls.load() == 0);
  // The failed init left nothing behind: the name can be initialized again.
  CHECK_FALSE(ctx.is_group_initialized("g"));
  ctx.init_collective_group(1, 0, "threads", "g", 10s);
  CHECK(ctx.get_rank("g") == 0);
}

TEST_CASE("a factory that builds the wrong rank is reported as a backend bug",
          "[collective][registry]") {
  static std::once_flag once;
  std::call_once(once, [] {
    register_collective_backend("off_by_one", [](const GroupInit& init) {
      GroupInit shifted{init.store, init.rank + 1, init.size + 1, init.group_name,
                        init.timeout};
      return std::make_unique<ThreadsGroup>(shifted, std::make_shared<Hub>(shifted.size));
    });
  });
  CollectiveContext ctx;
  ctx.set_default_store(std::make_shared<HashStore>());
  try {
    ctx.init_collective_group(1, 0, "off_by_one", "g", 10s);
    FAIL("init_collective_group accepted a group of the wrong rank");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK_THAT(e.what(),
               Catch::Contains("\"OFF_BY_ONE\"") && Catch::Contains("rank 1 of 2"));
  }
  CHECK_FALSE(ctx.is_group_initialized("g"));
}
