// Registering your own RPC backend: "LOOPBACK", a one-worker transport that
// hands each request to this worker's own pool. A real backend moves the
// Message (core/message.h) over its wire the same way, and reports each peer
// it talks to through metrics()->peer(id, name) (rpc/metrics.h): LOOPBACK
// has none.
//
//   bazel run //examples:custom_backend
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "rpc/backend_registry.h"
#include "rpc/call_table.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"

namespace rpc = switchboard::rpc;

namespace {

class LoopbackAgent final : public rpc::RpcAgent {
 public:
  LoopbackAgent(std::string name, int num_threads)
      : RpcAgent(rpc::WorkerInfo{std::move(name), 0}, num_threads),
        calls_(self().name, pool()) {}
  ~LoopbackAgent() override { shutdown(); }

  // Requests that arrive before this (none here) would wait for it.
  void start(RequestHandler handler) override { calls_.start(std::move(handler)); }

  // The call table gives the call an id, a future and its timeout; the
  // "wire" here hands the request straight to this worker's own table,
  // which runs the handler on the pool and gives back its reply (errors
  // included) to complete the call.
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override {
    if (to != self()) throw std::invalid_argument("LOOPBACK has one worker");
    rpc::CallTable::Added call = calls_.add({0, to.name, request.function, timeout});
    request.id = call.id;
    rpc::CallTable::Request incoming;
    incoming.message = std::move(request);
    incoming.from = self();
    incoming.reply = [this](rpc::Message reply) { calls_.complete(reply.id, std::move(reply)); };
    calls_.accept(std::move(incoming));
    return call.future;
  }

  rpc::WorkerInfo worker(const std::string& name) const override {
    if (name != self().name) throw switchboard::NotFoundError("no worker " + name);
    return self();
  }
  rpc::WorkerInfo worker(int id) const override { return worker(id == 0 ? self().name : ""); }
  std::vector<rpc::WorkerInfo> workers() const override { return {self()}; }

  // Waits until no call is in flight and no request is being handled.
  void join(Timeout timeout) override {
    calls_.drain(timeout, "join on LOOPBACK worker \"" + self().name + "\"");
  }

  // Pending calls fail with Error(kCancelled); running handlers finish.
  void shutdown() override {
    calls_.close();
    pool()->shutdown();
  }

 private:
  rpc::CallTable calls_;
};

}  // namespace

int main() {
  switchboard::init_logging("custom_backend");
  // 1. Register: a name, an options constructor and an agent initializer.
  rpc::BackendType loopback = rpc::register_backend(
      "LOOPBACK",
      [](std::chrono::milliseconds timeout, const std::string& init_method,
         const rpc::Extras& extras) {
        auto options = std::make_shared<rpc::RpcBackendOptions>();
        options->rpc_timeout = timeout;
        options->init_method = init_method;
        rpc::ExtrasReader reader("LOOPBACK", extras);
        options->num_worker_threads =
            static_cast<int>(reader.get_int("num_worker_threads").value_or(2));
        reader.finish();  // refuses extras nobody read, naming them
        return options;
      },
      [](const rpc::BackendInit& init) -> std::unique_ptr<rpc::RpcAgent> {
        if (init.world_size != 1) {
          throw std::invalid_argument("LOOPBACK serves exactly one worker");
        }
        return std::make_unique<LoopbackAgent>(init.name, init.options->num_worker_threads);
      });

  // 2. Use it by name, like a built-in. (LOOPBACK needs no rendezvous, so
  //    an in-memory store will do.)
  rpc::register_function("greet", [](std::string who) { return "hello, " + who; });
  auto options = rpc::construct_rpc_backend_options(loopback, std::chrono::seconds(5),
                                                    "env://", {{"num_worker_threads", "4"}});
  auto store = std::make_shared<switchboard::HashStore>();
  rpc::init_rpc("solo", "LOOPBACK", 0, 1, options, store);
  fmt::print("{}\n", rpc::rpc_sync<std::string>("solo", "greet", std::string("LOOPBACK")));
  // The call table's timeouts work for this backend too.
  rpc::register_function("nap", [] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
  try {
    rpc::rpc_sync<void>("solo", "nap", rpc::with_timeout(std::chrono::milliseconds(50)));
  } catch (const switchboard::TimeoutError& e) {
    fmt::print("{}\n", e.what());
  }
  // And so are its metrics: the call table counted both calls.
  const rpc::RpcMetrics metrics = rpc::get_metrics_snapshot();
  fmt::print("greet: {} sent, {} served; nap: {} timed out\n",
             metrics.functions.at("greet").calls_sent,
             metrics.functions.at("greet").requests_served,
             metrics.functions.at("nap").failures(rpc::FailureKind::kTimeout));
  rpc::shutdown();
  return 0;
}
