// RRef: a reference to a value that lives on one worker (its owner),
// usable from any worker of the group. torch.distributed.rpc's remote()
// and RRef in C++.
//
//   // every worker
//   rpc::register_function("make_table", [](int64_t n) { return std::vector<int64_t>(n, 1); });
//   rpc::register_function("sum", [](const std::vector<int64_t>& v, int64_t k) { ... });
//
//   // w0: runs make_table on w1; the value stays there
//   rpc::RRef<std::vector<int64_t>> table = rpc::remote<std::vector<int64_t>>("w1", "make_table", 8);
//   int64_t s = table.rpc_sync<int64_t>("sum", 2);   // sum(value, 2), on w1
//   std::vector<int64_t> copy = table.to_here();      // the value, copied here
//   rpc::rpc_sync("w2", "consume", table);            // w2 gets a usable reference
//
// Owner and users. remote<T>(to, f, args...) returns at once; `to` runs f
// and keeps its result: `to` is the owner, and every RRef to that value on
// another worker is a user. An RRef passed in an RPC's arguments or result
// arrives as an RRef to the same value (a user, or the owner's own RRef
// when it arrives at the owner). On the owner, local_value() is the value
// itself.
//
// Reference counting (docs/api.md, "RRef"): the owner keeps the value
// while any RRef to it exists on any worker, references in flight
// included, and frees it when the last is gone:
//   - each RRef object (and its copies in one process: RRef is a shared
//     handle) is one reference, counted by the owner;
//   - a user that sends its RRef keeps its own reference until the owner
//     has counted the receiver's (the owner tells it), so the count never
//     drops to zero while a reference is on its way; the owner counts the
//     RRefs it sends itself before sending;
//   - a user's reference is released (a message to the owner) when its
//     last handle is destroyed, after the owner confirmed it
//     (confirmed_by_owner());
//   - graceful shutdown releases the references this worker still holds
//     (but those it sent and the owner has not yet counted the receiver
//     of), and the group's quiet rounds deliver those releases before
//     anyone stops.
// An RRef whose message is lost (its call failed on the way) keeps the
// value on its owner until the owner shuts down.
//
// Errors: to_here() and the calls on the value fail with what the
// function that made the value threw (RemoteError), TimeoutError,
// ConnectionError naming the owner when the owner died or left (never a
// hang), and Error(kFailedPrecondition) after this worker shut down.
// local_value() off the owner throws Error(kFailedPrecondition).
//
// Thread safety: an RRef is a handle like std::shared_ptr: its methods
// may be called from any thread; assigning to one object while another
// thread uses it is a data race. The owner's value is shared by every
// thread of the owner that uses local_value() and by the functions the
// calls on it run: synchronize access to it yourself, as in torch.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rpc/call_context.h"
#include "rpc/future.h"
#include "core/message.h"
#include "core/serialize.h"

namespace switchboard::rpc {

// The msgpack ext type code of an RRef in a payload (docs/wire_formats.md).
inline constexpr int8_t kRRefExtType = 2;

namespace detail {

class RRefCore;   // rpc/rref.cc
class RRefTable;  // rpc/rref_table.h

// Makes `table` the worker whose RRefs payloads decoded on this thread
// arrive at, for its scope (the RPC layer sets it around every decode).
// Scopes nest.
class RRefDecodeScope {
 public:
  explicit RRefDecodeScope(std::shared_ptr<RRefTable> table);
  ~RRefDecodeScope();
  RRefDecodeScope(const RRefDecodeScope&) = delete;
  RRefDecodeScope& operator=(const RRefDecodeScope&) = delete;

 private:
  std::shared_ptr<RRefTable> previous_;
};

// Collects the references packed on this thread for its scope (a call's
// arguments), so that a call that fails takes them off what graceful
// shutdown waits for (watch()). Scopes nest.
class RRefEncodeScope {
 public:
  RRefEncodeScope();
  ~RRefEncodeScope();
  RRefEncodeScope(const RRefEncodeScope&) = delete;
  RRefEncodeScope& operator=(const RRefEncodeScope&) = delete;

  // After the call carrying them was sent: when `sent` fails, its
  // receiver may never have seen them. Those of a scope that ends without
  // watch() (the call was never sent) are taken off at once.
  void watch(const Future<Message>& sent);

  using Forks = std::vector<std::pair<std::shared_ptr<RRefTable>, uint64_t>>;

 private:
  Forks forks_;
  Forks* previous_;
};

// What RRef<T> calls; defined in rpc/rref.cc.
const std::shared_ptr<RRefTable>& rref_table(const RRefCore& core);
WorkerInfo rref_owner(const RRefCore& core);
bool rref_is_owner(const RRefCore& core);
bool rref_confirmed(const RRefCore& core);
std::string rref_describe(const RRefCore& core);
// Whether two references are to the same value.
bool rref_same(const RRefCore& a, const RRefCore& b);
// The value as a response message (kResponse, or kError when the function
// that made it threw).
Future<Message> rref_fetch(const std::shared_ptr<RRefCore>& core,
                           std::optional<std::chrono::milliseconds> timeout);
// Owner only: the value decoded once as `type`, kept (with `encode`, which
// later fetches and calls use) for as long as the value lives.
using TypedDecoder = std::function<std::shared_ptr<void>(const Message& value)>;
using TypedEncoder = std::function<void(const void* value, Message& out)>;
void* rref_local_value(const RRefCore& core, const std::string& type,
                       const TypedDecoder& decode, TypedEncoder encode);
// Calls `request.function` on the owner with the value first, then the
// arguments encoded in `request`.
Future<Message> rref_call(const std::shared_ptr<RRefCore>& core, Message request,
                          std::optional<std::chrono::milliseconds> timeout);
// The same call, its result kept on the owner as a new RRef of `type`.
std::shared_ptr<RRefCore> rref_remote(const std::shared_ptr<RRefCore>& core,
                                      Message request, std::string type,
                                      std::optional<std::chrono::milliseconds> timeout,
                                      RRefEncodeScope* forks);
// The ext body that stands for `core` in a payload (counts the reference
// in flight), and the reference it stands for on this thread's worker.
std::string rref_pack(const std::shared_ptr<RRefCore>& core);
std::shared_ptr<RRefCore> rref_unpack(const char* data, size_t size,
                                      const std::string& expected_type);

template <typename T>
Future<T> decode_with(const std::shared_ptr<RRefCore>& core, Future<Message> reply,
                      std::string what) {
  return reply.then_inline([core, what = std::move(what)](const Future<Message>& done) -> T {
    RRefDecodeScope scope(rref_table(*core));
    return decode_result<T>(done.value(), what);
  });
}

template <typename... Args>
std::pair<std::optional<std::chrono::milliseconds>, Message> encode_rref_call(
    const std::string& function, const Args&... args) {
  Message request;
  request.type = MessageType::kRequest;
  request.function = function;
  std::optional<std::chrono::milliseconds> timeout;
  if constexpr (sizeof...(Args) > 0) {
    [&](const auto& first, const auto&... rest) {
      if constexpr (std::is_same_v<std::decay_t<decltype(first)>, CallTimeout>) {
        timeout = first.value;
        encode_args(request, rest...);
      } else {
        encode_args(request, first, rest...);
      }
    }(args...);
  } else {
    encode_args(request);
  }
  return {timeout, std::move(request)};
}

}  // namespace detail

template <typename T>
class RRef {
 public:
  static_assert(!std::is_void_v<T>, "RRef<void> holds nothing; use rpc_async<void>");

  // An invalid RRef (every method but valid() throws std::invalid_argument).
  RRef() = default;

  bool valid() const { return core_ != nullptr; }

  // The worker that holds the value.
  WorkerInfo owner() const { return detail::rref_owner(core()); }
  std::string owner_name() const { return owner().name; }
  // Whether this worker is the owner.
  bool is_owner() const { return detail::rref_is_owner(core()); }
  // Whether the owner has counted this reference: always on the owner;
  // for a user, once the owner answered the remote() that made it or the
  // message that announced it (torch's confirmed_by_owner()).
  bool confirmed_by_owner() const { return detail::rref_confirmed(core()); }

  // A copy of the value, fetched from the owner (waits for the function
  // that makes it). `timeout` nullopt: options.rpc_timeout. Tensors in it
  // share storage with the owner's on the owner itself.
  T to_here(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    return to_here_async(timeout).value();
  }
  Future<T> to_here_async(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    return detail::decode_with<T>(core_ptr(), detail::rref_fetch(core_ptr(), timeout),
                                  "RRef.to_here");
  }

  // The owner's value itself (waits for the function that makes it); the
  // reference stays valid while this RRef (or any copy of it) lives.
  // Error(kFailedPrecondition) off the owner; the function's error when it
  // threw.
  T& local_value() const {
    void* value = detail::rref_local_value(
        core(), type_name<T>(),
        [](const Message& m) -> std::shared_ptr<void> {
          return std::make_shared<T>(decode_result<T>(m, "RRef.local_value"));
        },
        [](const void* v, Message& out) { encode_result(out, *static_cast<const T*>(v)); });
    return *static_cast<T*>(value);
  }

  // Calls `function` on the owner with the value as its first argument,
  // then `args` (optionally led by with_timeout(t)): torch's
  // rref.rpc_sync().method(args). The function sees a copy of the value
  // (tensors share storage with it); to change the value itself, register
  // a function that takes the RRef and calls local_value().
  template <typename R = void, typename... Args>
  Future<R> rpc_async(const std::string& function, const Args&... args) const {
    detail::RRefEncodeScope forks;
    auto [timeout, request] = detail::encode_rref_call(function, args...);
    Future<Message> sent = detail::rref_call(core_ptr(), std::move(request), timeout);
    forks.watch(sent);
    return detail::decode_with<R>(core_ptr(), std::move(sent), function);
  }
  template <typename R = void, typename... Args>
  R rpc_sync(const std::string& function, const Args&... args) const {
    if constexpr (std::is_void_v<R>) {
      rpc_async<R>(function, args...).value();
    } else {
      return rpc_async<R>(function, args...).value();
    }
  }
  // The same call, its result kept on the owner: torch's rref.remote().
  template <typename R, typename... Args>
  RRef<R> remote(const std::string& function, const Args&... args) const {
    detail::RRefEncodeScope forks;
    auto [timeout, request] = detail::encode_rref_call(function, args...);
    return RRef<R>(detail::rref_remote(core_ptr(), std::move(request), type_name<R>(), timeout,
                                       &forks));
  }

  // "RRef(owner "w1", id 0:17, type int64)".
  std::string describe() const { return detail::rref_describe(core()); }
  // Its name in argument errors: rref[T].
  static std::string sb_type_name() { return "rref[" + type_name<T>() + "]"; }

  // Two RRefs are equal when they refer to the same value.
  friend bool operator==(const RRef& a, const RRef& b) {
    return a.core_ == b.core_ || (a.core_ && b.core_ && detail::rref_same(*a.core_, *b.core_));
  }

  // For the RPC layer: wraps a reference.
  explicit RRef(std::shared_ptr<detail::RRefCore> core) : core_(std::move(core)) {}
  const std::shared_ptr<detail::RRefCore>& core_ptr() const {
    if (!core_) throw std::invalid_argument("use of an invalid (default-constructed) RRef");
    return core_;
  }

 private:
  const detail::RRefCore& core() const { return *core_ptr(); }

  std::shared_ptr<detail::RRefCore> core_;
};

}  // namespace switchboard::rpc

// RRef<T> in payloads: an ext value of type kRRefExtType (docs/wire_formats.md).
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <typename T>
  struct pack<switchboard::rpc::RRef<T>> {
    template <typename Stream>
    packer<Stream>& operator()(packer<Stream>& o, const switchboard::rpc::RRef<T>& r) const {
      std::string body = switchboard::rpc::detail::rref_pack(r.core_ptr());
      o.pack_ext(body.size(), switchboard::rpc::kRRefExtType);
      o.pack_ext_body(body.data(), body.size());
      return o;
    }
  };

  template <typename T>
  struct convert<switchboard::rpc::RRef<T>> {
    const msgpack::object& operator()(const msgpack::object& o,
                                      switchboard::rpc::RRef<T>& r) const {
      if (o.type != msgpack::type::EXT || o.via.ext.type() != switchboard::rpc::kRRefExtType) {
        throw msgpack::type_error();
      }
      r = switchboard::rpc::RRef<T>(switchboard::rpc::detail::rref_unpack(
          o.via.ext.data(), o.via.ext.size, switchboard::rpc::type_name<T>()));
      return o;
    }
  };

  }  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
