#include "rpc/function_registry.h"

#include "rpc/call_context.h"

#include <fmt/format.h>

#include <utility>

#include "common/error.h"

namespace switchboard::rpc {

namespace detail {

Message make_response(uint64_t id) {
  Message response;
  response.type = MessageType::kResponse;
  response.id = id;
  return response;
}

Message make_error_response(uint64_t id, std::string_view worker,
                            std::exception_ptr error) {
  Message response = make_response(id);
  encode_remote_error(response, worker, error);
  return response;
}

namespace {
thread_local ArgumentWaits* argument_waits = nullptr;
}  // namespace

ArgumentWaits::ArgumentWaits() : previous_(std::exchange(argument_waits, this)) {}

ArgumentWaits::~ArgumentWaits() { argument_waits = previous_; }

void ArgumentWaits::add(Future<void> pending, std::shared_ptr<Executor> executor) {
  if (argument_waits == nullptr || pending.done()) {
    if (argument_waits != nullptr && pending.has_error()) {
      argument_waits->pending_.push_back(std::move(pending));
    }
    return;
  }
  argument_waits->pending_.push_back(std::move(pending));
  if (!argument_waits->executor_) argument_waits->executor_ = std::move(executor);
}

Future<void> ArgumentWaits::all() const {
  if (pending_.empty()) return Future<void>();
  return all_succeeded(pending_, executor_);
}

}  // namespace detail

FunctionRegistry::FunctionRegistry(std::string worker_name)
    : worker_name_(std::move(worker_name)) {}

std::string FunctionRegistry::worker_name() const {
  MutexLock lock(mutex_);
  return worker_name_;
}

void FunctionRegistry::set_worker_name(std::string worker_name) {
  MutexLock lock(mutex_);
  worker_name_ = std::move(worker_name);
}

void FunctionRegistry::add(std::string name, Handler handler) {
  auto shared = std::make_shared<const Handler>(std::move(handler));
  MutexLock lock(mutex_);
  SB_REQUIRE(!name.empty(), "register_function on worker \"{}\": empty function name",
             worker_name_);
  auto [it, inserted] = handlers_.try_emplace(name, std::move(shared));
  if (!inserted) {
    throw RegistryError(fmt::format(
        "function \"{}\" is already registered on worker \"{}\"", name, worker_name_));
  }
}

bool FunctionRegistry::runs_inline(std::string_view name) const {
  MutexLock lock(mutex_);
  return inline_.find(name) != inline_.end();
}

bool FunctionRegistry::has_function(std::string_view name) const {
  MutexLock lock(mutex_);
  return handlers_.find(name) != handlers_.end();
}

std::vector<std::string> FunctionRegistry::functions() const {
  MutexLock lock(mutex_);
  std::vector<std::string> names;
  names.reserve(handlers_.size());
  for (const auto& entry : handlers_) names.push_back(entry.first);
  return names;
}

void FunctionRegistry::add_interceptor(ServerInterceptor interceptor) {
  SB_REQUIRE(interceptor != nullptr, "add_interceptor() with an empty interceptor");
  MutexLock lock(mutex_);
  auto next = std::make_shared<std::vector<ServerInterceptor>>(*interceptors_);
  next->push_back(std::move(interceptor));
  interceptors_ = std::move(next);
}

void FunctionRegistry::register_raw_function(std::string name, RawFunction f) {
  SB_REQUIRE(f != nullptr, "register_raw_function(\"{}\"): an empty function", name);
  add(std::move(name), [f = std::move(f)](const Message& request,
                                          const std::string& worker) -> Future<Message> {
    const uint64_t id = request.id;
    return f(request).then([id, worker](const Future<Message>& done) {
      try {
        Message response = done.value();
        response.type = MessageType::kResponse;
        response.id = id;
        response.function.clear();
        response.timeout_ms = 0;
        return response;
      } catch (...) {
        return detail::make_error_response(id, worker, std::current_exception());
      }
    });
  });
}

Future<Message> FunctionRegistry::call(const Message& request,
                                       const WorkerInfo& from) const {
  std::shared_ptr<const Handler> handler;
  std::shared_ptr<const std::vector<ServerInterceptor>> interceptors;
  std::string worker;
  {
    MutexLock lock(mutex_);
    worker = worker_name_;
    if (!interceptors_->empty()) interceptors = interceptors_;
    auto it = handlers_.find(request.function);
    if (it != handlers_.end()) handler = it->second;
  }
  try {
    if (request.type != MessageType::kRequest) {
      throw std::invalid_argument(
          fmt::format("worker \"{}\" received message {} of type {} as a request",
                      worker, request.id, static_cast<int>(request.type)));
    }
    if (!handler) {
      throw NotFoundError(fmt::format("worker \"{}\" has no function \"{}\"", worker,
                                      request.function));
    }
    // The call table set the context of this call (deadline from the
    // arrival, cancellation); called directly, make one.
    CallContext own{from, request.function, request.id, std::nullopt};
    const CallContext* serving = current_call();
    if (serving == nullptr || serving->id != request.id || serving->function != request.function ||
        serving->caller != from) {
      if (request.timeout_ms != 0) {
        own.deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(request.timeout_ms);
      }
      serving = &own;
    }
    const CallContext& context = *serving;
    ScopedCallContext scope(serving);
    for (const ServerInterceptor& intercept :
         interceptors ? *interceptors : std::vector<ServerInterceptor>{}) {
      std::string refusal;
      try {
        refusal = intercept(context);
      } catch (const std::exception& e) {
        refusal = e.what();
      }
      if (!refusal.empty()) {
        throw Error(ErrorCode::kPermissionDenied,
                    fmt::format("worker \"{}\" refused function \"{}\" from \"{}\": {}", worker,
                                request.function, from.name, refusal));
      }
    }
    return (*handler)(request, worker);
  } catch (...) {
    return Future<Message>::ready(
        detail::make_error_response(request.id, worker, std::current_exception()));
  }
}

}  // namespace switchboard::rpc
