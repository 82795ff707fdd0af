#include "python/csrc/torch_agent.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/rpc/message.h>
#include <torch/csrc/distributed/rpc/utils.h>

#include <stdexcept>
#include <utility>

#include "agents/builtin_backends.h"
#include "agents/pipe/address.h"
#include "common/auth.h"
#include "common/error.h"
#include "python/csrc/python_thread_state.h"
#include "python/csrc/torch_message.h"
#include "python/csrc/torch_store.h"
#include "rendezvous/rounds.h"
#include "rpc/backend_registry.h"

namespace switchboard::torch_rpc {

namespace trpc = torch::distributed::rpc;

namespace {

using Milliseconds = std::chrono::milliseconds;

Milliseconds to_ms(float seconds) {
  return Milliseconds(static_cast<int64_t>(static_cast<double>(seconds) * 1000.0));
}

bool is_loopback(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

// PIPE's options from the torch-side configuration; resolves the listen
// address and applies the security rule (torch_agent.h).
std::shared_ptr<rpc::RpcBackendOptions> pipe_options(const AgentConfig& config) {
  rpc::Extras extras{{"num_worker_threads", std::to_string(config.num_worker_threads)}};
  if (config.heartbeat_interval_ms > 0)
    extras["heartbeat_interval_ms"] = std::to_string(config.heartbeat_interval_ms);
  if (config.heartbeat_timeout_ms >= 0)
    extras["heartbeat_timeout_ms"] = std::to_string(config.heartbeat_timeout_ms);
  if (config.shm) extras["shm"] = *config.shm ? "1" : "0";
  if (!config.tls_cert_file.empty() || !config.tls_key_file.empty() ||
      !config.tls_ca_file.empty()) {
    extras["tls_cert_file"] = config.tls_cert_file;
    extras["tls_key_file"] = config.tls_key_file;
    extras["tls_ca_file"] = config.tls_ca_file;
  }
  const std::string address =
      agents::pipe::resolve_listen_address(config.listen_address, config.store_host);
  extras["listen_address"] = address;
  // file:// and tcp:// are torch's: the rendezvous runs through the store
  // torch made, so Switchboard's own init_method is not used.
  auto options = rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), to_ms(config.rpc_timeout_seconds), "env://", extras);
  auto& pipe = dynamic_cast<agents::PipeRpcBackendOptions&>(*options);
  pipe.secret = config.secret_file.empty()
                    ? Secret::from_environment()
                    : std::make_shared<const Secret>(Secret::from_file(config.secret_file));
  if (!pipe.secret && !is_loopback(address) && !config.insecure) {
    throw std::invalid_argument(fmt::format(
        "SWITCHBOARD backend: worker \"{}\" would listen on {}, beyond loopback, without a "
        "job secret: torch RPC payloads are pickles, so anyone who can reach that address "
        "could run code in this process. Give a secret (secret_file=..., or "
        "SWITCHBOARD_SECRET_FILE), listen on loopback (listen_address=\"127.0.0.1\"), or "
        "pass insecure=True to accept the risk",
        config.name, address));
  }
  for (const auto& [worker, map] : config.device_maps) {
    std::vector<std::pair<std::string, std::string>> pairs(map.begin(), map.end());
    pipe.set_device_map(worker, pairs);
  }
  if (!config.devices.empty()) pipe.set_devices(config.devices);
  return options;
}

// The text of a Switchboard call's failure as torch users expect it.
std::string failure_text(std::exception_ptr error, const std::string& to, Milliseconds timeout) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    // In torch's form for a timeout (makeRPCError: "RPCErr:1:..."), which
    // its RRef code reads: a remote() that timed out marks its RRef timed
    // out instead of throwing from the future's callback.
    return trpc::makeRPCError(
        fmt::format("RPC ran for more than set timeout ({} ms) and will now be marked with an "
                    "error (to \"{}\": {})",
                    timeout.count(), to, e.what()),
        trpc::RPCErrorType::TIMEOUT);
  } catch (const std::exception& e) {
    return fmt::format("RPC to \"{}\" failed: {}", to, e.what());
  } catch (...) {
    return fmt::format("RPC to \"{}\" failed", to);
  }
}

}  // namespace

SwitchboardAgent::SwitchboardAgent(const c10::intrusive_ptr<c10d::Store>& store,
                                   AgentConfig config,
                                   std::unique_ptr<trpc::RequestCallback> callback)
    : RpcAgent(trpc::WorkerInfo(config.name, static_cast<int64_t>(config.rank)),
               std::move(callback),
               to_ms(config.rpc_timeout_seconds)),
      config_(std::move(config)),
      store_(store) {
  context_.register_raw_function(kTorchFunction, [this](const rpc::Message& request) {
    return serve(request);
  });
  context_.on_join([this](const rpc::WorkerInfo& info) { remember(info); });
  context_.on_leave([this](const rpc::WorkerInfo& info) { forget(info.name); });
  // torch's agents fail init with RuntimeError (and say "is not unique"
  // of a name taken twice): so do we, keeping Switchboard's own words.
  try {
    context_.init_rpc(
        config_.name, "PIPE", config_.rank,
        config_.world_size ? config_.world_size : std::optional<int>(rpc::kDynamicGroup),
        pipe_options(config_), std::make_shared<TorchStore>(store));
  } catch (const DuplicateNameError& e) {
    throw std::runtime_error(fmt::format(
        "SWITCHBOARD agent \"{}\": the worker name is not unique: {}", config_.name, e.what()));
  } catch (const GroupKindMismatchError& e) {
    throw std::runtime_error(fmt::format(
        "SWITCHBOARD agent \"{}\": RPC group mixes statically and dynamically initialized "
        "members which is not supported. {}",
        config_.name, e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("SWITCHBOARD agent \"{}\": {}", config_.name, e.what()));
  }
  for (const rpc::WorkerInfo& info : context_.get_worker_infos()) remember(info);
}

SwitchboardAgent::~SwitchboardAgent() {
  GilReleased unlocked;  // the pool's threads take it as they exit
  try {
    if (context_.initialized()) context_.shutdown(false);
  } catch (const std::exception& e) {
    spdlog::warn("SWITCHBOARD agent \"{}\": shutdown at destruction: {}", config_.name,
                 e.what());
  }
}

void SwitchboardAgent::remember(const rpc::WorkerInfo& info) {
  MutexLock lock(mu_);
  infos_.try_emplace(info.name, info.name, static_cast<int64_t>(info.id));
  members_[info.name] = true;
  names_by_id_[info.id] = info.name;
}

void SwitchboardAgent::forget(const std::string& name) {
  MutexLock lock(mu_);
  members_[name] = false;
}

const trpc::WorkerInfo& SwitchboardAgent::getWorkerInfo(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = infos_.find(name);
  TORCH_CHECK(it != infos_.end(), "SWITCHBOARD agent \"", config_.name,
              "\" could not find destination worker \"", name, "\" in its group");
  return it->second;
}

const trpc::WorkerInfo& SwitchboardAgent::getWorkerInfo(trpc::worker_id_t id) const {
  MutexLock lock(mu_);
  auto it = names_by_id_.find(id);
  TORCH_CHECK(it != names_by_id_.end(), "SWITCHBOARD agent \"", config_.name,
              "\" could not find destination worker id ", id, " in its group");
  return infos_.at(it->second);
}

std::vector<trpc::WorkerInfo> SwitchboardAgent::getWorkerInfos() const {
  MutexLock lock(mu_);
  std::vector<trpc::WorkerInfo> out;
  for (const auto& [id, name] : names_by_id_) {
    auto member = members_.find(name);
    if (member != members_.end() && member->second) out.push_back(infos_.at(name));
  }
  return out;
}

void SwitchboardAgent::startImpl() { started_.set_value(); }

rpc::Future<rpc::Message> SwitchboardAgent::serve(const rpc::Message& request) {
  if (!started_.get_future().done()) {
    // Before start(): the request waits for it (RpcAgent's contract).
    return started_.get_future().then(
        [this, request](const rpc::Future<void>& started) {
          if (std::exception_ptr error = started.error()) std::rethrow_exception(error);
          return serve(request);
        });
  }
  keep_python_thread_state();  // torch's callback takes the GIL on it
  const int64_t id = static_cast<int64_t>(request.id);
  c10::intrusive_ptr<trpc::Message> message = decode(request, id);
  ++activity_->server;
  rpc::Promise<rpc::Message> reply;
  c10::intrusive_ptr<trpc::JitFuture> done;
  try {
    done = (*cb_)(*message, {});
  } catch (...) {
    --activity_->server;
    throw;
  }
  done->addCallback([activity = activity_, reply, id](trpc::JitFuture& future) {
    --activity->server;
    try {
      c10::intrusive_ptr<trpc::Message> response =
          future.hasError()
              ? trpc::createExceptionResponse(future.tryRetrieveErrorMessage(), id)
              : future.value().toCustomClass<trpc::Message>();
      reply.set_value(encode(*response, rpc::MessageType::kResponse));
    } catch (...) {
      reply.set_error(std::current_exception());
    }
  });
  return reply.get_future();
}

c10::intrusive_ptr<trpc::JitFuture> SwitchboardAgent::send(
    const trpc::WorkerInfo& to, c10::intrusive_ptr<trpc::Message> message,
    float rpc_timeout_seconds, const trpc::DeviceMap& /*device_map*/) {
  auto future = c10::make_intrusive<trpc::JitFuture>(at::AnyClassType::get(), getDevices());
  const Milliseconds timeout = rpc_timeout_seconds == trpc::kUnsetRpcTimeout
                                   ? rpcTimeout_.load()
                                   : to_ms(rpc_timeout_seconds);
  try {
    TORCH_CHECK(message->isRequest(), "SWITCHBOARD agent \"", config_.name,
                "\" sends requests only; got message type ", message->type());
    TORCH_CHECK(!stopped_.load(), "SWITCHBOARD agent \"", config_.name,
                "\" is shut down: cannot send to \"", to.name_, "\"");
    rpc::Message request = encode(*message, rpc::MessageType::kRequest);
    request.function = kTorchFunction;
    rpc::Future<rpc::Message> reply = context_.send(to.name_, std::move(request), timeout);
    ++activity_->client;
    reply.add_callback([activity = activity_, future, name = to.name_, timeout](
                           const rpc::Future<rpc::Message>& r) {
      activity->call_ended();
      keep_python_thread_state();  // torch's callbacks on `future` take the GIL
      if (std::exception_ptr error = r.error()) {
        future->setError(
            std::make_exception_ptr(std::runtime_error(failure_text(error, name, timeout))));
        return;
      }
      try {
        const rpc::Message& response = r.value();
        if (response.type == rpc::MessageType::kError) {
          throw std::runtime_error(fmt::format(
              "\"{}\" could not serve the torch message: {}", name,
              std::string(response.payload.begin(), response.payload.end())));
        }
        c10::intrusive_ptr<trpc::Message> m = decode(response, static_cast<int64_t>(response.id));
        if (m->type() == trpc::MessageType::EXCEPTION) {
          future->setError(std::make_exception_ptr(
              std::runtime_error(std::string(m->payload().begin(), m->payload().end()))));
        } else {
          future->markCompleted(c10::IValue(m));
        }
      } catch (const std::exception& e) {
        future->setError(std::make_exception_ptr(std::runtime_error(
            fmt::format("RPC to \"{}\": a bad response: {}", name, e.what()))));
      }
    });
  } catch (const std::exception& e) {
    future->setError(std::make_exception_ptr(std::runtime_error(e.what())));
  }
  return future;
}

void SwitchboardAgent::join(bool shutdown, float timeout) {
  GilReleased unlocked;
  const std::optional<Milliseconds> bound =
      timeout > 0 ? std::optional<Milliseconds>(to_ms(timeout)) : std::nullopt;
  if (shutdown && !is_static_group()) {
    // A dynamic group's worker leaves it (PIPE's graceful shutdown).
    stopped_ = true;
    if (context_.initialized()) context_.shutdown(true, bound);
    return;
  }
  TORCH_CHECK(is_static_group(), "SWITCHBOARD agent \"", config_.name,
              "\": join(shutdown=False) needs a static group");
  wait_until_no_calls(bound);
  // No call is in flight anywhere. This worker sends no more; PIPE stops in
  // shutdownImpl(), after torch's RRef context checked for leaks (as
  // TensorPipe's join does). What may still run are handlers of requests
  // whose callers gave up on them: they finish while PIPE stops, and their
  // replies go nowhere.
  if (shutdown) stopped_ = true;
}

void SwitchboardAgent::wait_until_no_calls(std::optional<Milliseconds> bound) {
  using Clock = std::chrono::steady_clock;
  const std::optional<Clock::time_point> deadline =
      bound ? std::optional<Clock::time_point>(Clock::now() + *bound) : std::nullopt;
  auto left = [&]() -> Milliseconds {
    if (!deadline) return Store::kNoTimeout;
    const auto ms = std::chrono::duration_cast<Milliseconds>(*deadline - Clock::now());
    if (ms.count() <= 0) {
      throw TimeoutError(fmt::format(
          "SWITCHBOARD agent \"{}\": join timed out after {} ms with {} calls of this worker "
          "in flight",
          config_.name, bound->count(), activity_->client.load()));
    }
    return ms;
  };
  const int world = *config_.world_size;
  TorchStore store(store_);
  for (;;) {
    // This worker's calls first.
    {
      Activity& a = *activity_;
      MutexLock lock(a.mu);
      auto done = [&] { return a.client.load() == 0; };
      if (deadline) {
        a.calls_done.wait_until(a.mu, *deadline, done);
      } else {
        a.calls_done.wait(a.mu, done);
      }
    }
    const std::string key = rendezvous::torch_join_key(join_rounds_.fetch_add(1));
    // What is in flight now (a handler may have started a call since), then
    // the arrival; the last to arrive publishes the round's total.
    store.add(key + "/calls", activity_->client.load());
    if (store.add(key, 1) == world) {
      store.set(key + "/total", std::to_string(store.add(key + "/calls", 0)));
    }
    store.wait({key + "/total"}, left());
    const Bytes total = store.get(key + "/total");
    // Rank 0 may host torch's store: it leaves the round last.
    if (store.add(key + "/read", 1) == world) store.set(key + "/read/all", Bytes{1});
    if (config_.rank == 0) store.wait({key + "/read/all"}, left());
    if (std::string(total.begin(), total.end()) == "0") return;
  }
}

void SwitchboardAgent::shutdownImpl() {
  GilReleased unlocked;
  stopped_ = true;
  if (context_.initialized()) context_.shutdown(false);
}

void SwitchboardAgent::addGilWaitTime(std::chrono::microseconds wait) {
  MutexLock lock(mu_);
  ++gil_waits_;
  gil_wait_total_ += wait;
}

std::unordered_map<std::string, std::string> SwitchboardAgent::getMetrics() {
  std::unordered_map<std::string, std::string> metrics;
  metrics["agent.num_pending_requests"] = std::to_string(activity_->server.load());
  metrics["agent.thread_pool_size"] = std::to_string(config_.num_worker_threads);
  metrics["agent.client_active_calls"] = std::to_string(activity_->client.load());
  metrics["agent.server_active_calls"] = std::to_string(activity_->server.load());
  metrics["agent.server_active_async_calls"] = "0";
  if (isGILProfilingEnabled()) {
    MutexLock lock(mu_);
    metrics["agent.gil_average_wait_time_us"] =
        std::to_string(gil_waits_ == 0 ? 0 : gil_wait_total_.count() / gil_waits_);
  }
  if (context_.initialized()) {
    try {
      for (const auto& [key, value] : context_.get_metrics()) {
        metrics["switchboard." + key] = fmt::format("{}", value);
      }
    } catch (const Error&) {
      // shut down meanwhile: torch's keys only
    }
  }
  return metrics;
}

}  // namespace switchboard::torch_rpc
