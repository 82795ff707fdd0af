// Registering your own RPC backend: "LOOPBACK", a one-worker transport that
// hands each request to this worker's own pool. A real backend moves the
// Message (rpc/message.h) over its wire the same way.
//
//   bazel run //examples:custom_backend
#include <fmt/format.h>

#include "common/error.h"
#include "common/logging.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"

namespace rpc = switchboard::rpc;

namespace {

class LoopbackAgent final : public rpc::RpcAgent {
 public:
  LoopbackAgent(std::string name, int num_threads)
      : RpcAgent(rpc::WorkerInfo{std::move(name), 0}, num_threads) {}
  ~LoopbackAgent() override { shutdown(); }

  void start(RequestHandler handler) override { handler_ = std::move(handler); }

  // Serves the request on the pool; the response completes the future.
  // (No timeouts here: a real agent fails the future after `timeout`.)
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout /*timeout*/) override {
    rpc::Promise<rpc::Message> reply(pool());
    if (to != self()) throw std::invalid_argument("LOOPBACK has one worker");
    pool()->post([this, reply, request = std::move(request)] {
      handler_(request, self()).add_callback([reply, id = request.id](const auto& done) {
        rpc::Message response = done.value();
        response.id = id;
        reply.set_value(std::move(response));
      });
    });
    return reply.get_future();
  }

  rpc::WorkerInfo worker(const std::string& name) const override {
    if (name != self().name) throw switchboard::NotFoundError("no worker " + name);
    return self();
  }
  rpc::WorkerInfo worker(int id) const override { return worker(id == 0 ? self().name : ""); }
  std::vector<rpc::WorkerInfo> workers() const override { return {self()}; }
  void join(Timeout) override {}
  void shutdown() override { pool()->shutdown(); }

 private:
  RequestHandler handler_;
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
  rpc::shutdown();
  return 0;
}
