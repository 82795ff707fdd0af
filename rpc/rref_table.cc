#include "rpc/rref_table.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <optional>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "rpc/rpc.h"
#include "rpc/rref_payload.h"

namespace switchboard::rpc::detail {

namespace {

constexpr const char* kPrefix = "__sb_rref_";
constexpr const char* kRemote = "__sb_rref_remote";
constexpr const char* kFetch = "__sb_rref_fetch";
constexpr const char* kCall = "__sb_rref_call";
constexpr const char* kFork = kRRefForkFunction.data();
constexpr const char* kRelease = kRRefReleaseFunction.data();
constexpr const char* kDelete = kRRefDeleteFunction.data();


template <typename... Args>
Message protocol_request(const char* function, const Args&... args) {
  Message m;
  m.type = MessageType::kRequest;
  m.function = function;
  encode_args(m, args...);
  return m;
}

Message ack(uint64_t id) {
  Message m = make_response(id);
  encode_result(m);
  return m;
}

using Packer = PayloadPacker;

// The user's call that a protocol request carries: its function and
// arguments, the request's id, deadline and tensors.
Message user_request(const Message& carrier, std::string function,
                     std::vector<uint8_t> payload) {
  Message inner;
  inner.type = MessageType::kRequest;
  inner.id = carrier.id;
  inner.function = std::move(function);
  inner.timeout_ms = carrier.timeout_ms;
  inner.payload = std::move(payload);
  inner.tensors = carrier.tensors;
  return inner;
}

Message as_response(Message m, uint64_t id) {
  m.id = id;
  m.function.clear();
  return m;
}

}  // namespace

// ------------------------------------------------------------- OwnerEntry

Message OwnerEntry::current() const {
  const Message& made = value.value();
  {
    MutexLock lock(typed_mu);
    if (typed != nullptr) {
      Message m = make_response(made.id);
      encode(typed.get(), m);
      return m;
    }
  }
  if (held.empty()) return made;
  // The RRefs in it, each packed anew from the reference the value holds.
  msgpack::object_handle handle = unpack_payload(made.payload, "an RRef's value");
  Message m;
  m.type = made.type;
  m.id = made.id;
  m.timeout_ms = made.timeout_ms;
  m.tensors = made.tensors;
  PayloadWriter writer{&m.payload};
  Packer packer(writer);
  size_t next = 0;
  repack(packer, handle.get(), [&](Packer& out, const msgpack::object& ext) {
    if (ext.via.ext.type() != kRRefExtType) return false;
    SB_REQUIRE(next < held.size(), "an RRef's value holds more RRefs than when it was made");
    const std::shared_ptr<RRefCore>& core = held[next++];
    const std::string body = core->table->pack(core);
    out.pack_ext(body.size(), kRRefExtType);
    out.pack_ext_body(body.data(), body.size());
    return true;
  });
  return m;
}

// ------------------------------------------------------------- RRefTable

RRefTable::RRefTable(RpcContext* context, WorkerInfo self, std::shared_ptr<ThreadPool> pool,
                     std::shared_ptr<FunctionRegistry> functions,
                     std::chrono::milliseconds rpc_timeout)
    : context_(context),
      self_(std::move(self)),
      pool_(std::move(pool)),
      functions_(std::move(functions)),
      rpc_timeout_(rpc_timeout) {
  std::random_device random;
  MutexLock lock(mu_);
  next_serial_ = (uint64_t{random()} << 32 | random()) >> 1;
  // Fork numbers start at random too: a release names its fork's parent by
  // name only, and a worker that joins under the name of one that left must
  // not hold forks of the numbers the other's releases name. Never 0 (0
  // means "counted by the owner already").
  next_fork_ = ((uint64_t{random()} << 32 | random()) >> 1) | 1;
}

bool RRefTable::is_protocol(std::string_view function) {
  return function.starts_with(kPrefix);
}

void RRefTable::check_open(std::string_view what) const {
  MutexLock lock(mu_);
  if (closed_) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: RPC on worker \"{}\" has shut down", what, self_.name));
  }
}

void RRefTable::add_user(RRefCore* core) {
  MutexLock lock(mu_);
  users_.insert(core);
}

void RRefTable::drop_user(RRefCore* core) {
  {
    MutexLock lock(mu_);
    users_.erase(core);
    if (closed_ || core->released.load()) return;
  }
  release(*core);
}

void RRefTable::release(const RRefCore& core) {
  // Released once the owner counted it. An announcement that failed may
  // not have arrived: that reference stays counted (a leak, never an early
  // free). A remote() that failed is released all the same (see RRefCore).
  // Owed from now on: graceful shutdown waits for it (the confirmation is
  // a call in flight, which the group's quiet rounds would wait for too).
  std::shared_ptr<RRefTable> self = shared_from_this();
  owe(1);
  core.confirmed.add_callback([self, owner = core.owner, id = core.id,
                               creator = core.creator](const Future<void>& done) {
    if (!done.has_error() || creator) {
      self->send_later(owner, protocol_request(kDelete, id.creator, id.serial));
    }
    self->owe(-1);
  });
}

void RRefTable::owe(int n) {
  MutexLock lock(mu_);
  owed_ += n;
  if (owed_ == 0) changed_.notify_all();
}

void RRefTable::drop_owner_reference(RRefId id) { drop_users_of(id, 1, "its owner's RRef"); }

void RRefTable::drop_users_of(RRefId id, int64_t n, std::string_view why) {
  std::shared_ptr<OwnerEntry> freed;  // destroyed outside the lock
  MutexLock lock(mu_);
  if (closed_) return;
  // Unknown: its remote() has not arrived yet (it may never), and the
  // negative count waits for it.
  auto [count, added] = counts_.try_emplace(id);
  if (added) {
    spdlog::debug("rpc worker \"{}\": {} released RRef {} before it was made here", self_.name,
                  why, id_text(id));
  }
  count->second.users -= n;
  if (count->second.users < 0 && count->second.created) {
    spdlog::warn("rpc worker \"{}\": RRef {} released more often than counted ({})",
                 self_.name, id_text(id), why);
    count->second.users = 0;
  }
  freed = free_if_unused_locked(id);
}

std::shared_ptr<OwnerEntry> RRefTable::free_if_unused_locked(RRefId id) {
  auto count = counts_.find(id);
  if (count == counts_.end() || count->second.users > 0 || !count->second.created) {
    return nullptr;
  }
  counts_.erase(count);
  std::shared_ptr<OwnerEntry> freed;
  auto owned = owners_.find(id);
  if (owned != owners_.end()) {
    freed = std::move(owned->second);
    owners_.erase(owned);
  }
  changed_.notify_all();
  return freed;
}

std::shared_ptr<OwnerEntry> RRefTable::owner_entry_locked(RRefId id) {
  auto [it, added] = owners_.try_emplace(id);
  if (added) {
    it->second = std::make_shared<OwnerEntry>(pool_);
    counts_.try_emplace(id);
  }
  return it->second;
}

std::shared_ptr<OwnerEntry> RRefTable::owner_entry(RRefId id, bool count_user) {
  MutexLock lock(mu_);
  std::shared_ptr<OwnerEntry> entry = owner_entry_locked(id);
  if (count_user) ++counts_[id].users;
  return entry;
}

void RRefTable::release_fork(uint64_t fork) {
  std::shared_ptr<RRefCore> pinned;  // destroyed outside the lock
  MutexLock lock(mu_);
  auto it = forks_.find(fork);
  if (it == forks_.end()) return;
  pinned = std::move(it->second);
  forks_.erase(it);
  orphans_.erase(fork);
  changed_.notify_all();
}

void RRefTable::orphan(const std::vector<uint64_t>& forks) {
  MutexLock lock(mu_);
  for (uint64_t fork : forks) {
    if (forks_.contains(fork)) orphans_.insert(fork);
  }
  changed_.notify_all();
}

// ------------------------------------------------------------- sending

Future<Message> RRefTable::send_now(const WorkerInfo& to, Message request,
                                    std::optional<std::chrono::milliseconds> timeout) {
  if (to.id >= 0 && to.name != self_.name) {
    // The incarnation meant: a worker that took the name later (another
    // rank) never held what this message is about.
    std::optional<WorkerInfo> now;
    try {
      now = context_->get_worker_info(to.name);
    } catch (const std::exception&) {  // gone: send() below says so
    }
    if (now && now->id != to.id) {
      return Future<Message>::failed(std::make_exception_ptr(ConnectionError(fmt::format(
          "the owner of an RRef, worker \"{}\" (rank {}), has left the group; the worker "
          "named \"{}\" now is another one (rank {}), which does not hold its values (this "
          "worker: \"{}\")",
          to.name, to.id, to.name, now->id, self_.name))));
    }
  }
  {
    MutexLock lock(mu_);
    if (closed_) {
      return Future<Message>::failed(std::make_exception_ptr(
          Error(ErrorCode::kFailedPrecondition,
                fmt::format("RRef message to \"{}\": RPC on worker \"{}\" has shut down", to.name,
                            self_.name))));
    }
    ++sending_;
  }
  Future<Message> sent;
  try {
    sent = context_->send(WorkerRef(to.name), std::move(request),
                          timeout.value_or(rpc_timeout_));
  } catch (const NotFoundError&) {
    sent = Future<Message>::failed(std::make_exception_ptr(ConnectionError(fmt::format(
        "the owner of an RRef, worker \"{}\", has left the group (this worker: \"{}\")",
        to.name, self_.name))));
  } catch (...) {
    sent = Future<Message>::failed(std::current_exception());
  }
  MutexLock lock(mu_);
  if (--sending_ == 0) changed_.notify_all();
  return sent;
}

void RRefTable::send_later(WorkerInfo to, Message request) {
  std::shared_ptr<RRefTable> self = shared_from_this();
  owe(1);
  try {
    pool_->post([self, to = std::move(to), request = std::move(request)]() mutable {
      Future<Message> sent = self->send_now(to, std::move(request), std::nullopt);
      self->owe(-1);
      sent.add_callback([to = to.name](const Future<Message>& done) {
        if (done.has_error()) {
          try {
            std::rethrow_exception(done.error());
          } catch (const std::exception& e) {
            spdlog::debug("RRef message to \"{}\" failed: {}", to, e.what());
          }
        }
      });
    });
  } catch (const std::exception& e) {
    owe(-1);
    spdlog::debug("RRef message not sent: {}", e.what());
  }
}

Future<void> RRefTable::confirm_later(WorkerInfo to, Message request) {
  Promise<void> confirmed(pool_);
  Future<void> result = confirmed.get_future();
  std::shared_ptr<RRefTable> self = shared_from_this();
  owe(1);
  try {
    pool_->post([self, confirmed, to = std::move(to), request = std::move(request)]() mutable {
      Future<Message> sent = self->send_now(to, std::move(request), std::nullopt);
      self->owe(-1);
      sent.add_callback([confirmed](const Future<Message>& done) {
            try {
              decode_result<void>(done.value());
              confirmed.set_value();
            } catch (...) {
              confirmed.set_error(std::current_exception());
            }
          });
    });
  } catch (...) {
    owe(-1);
    confirmed.set_error(std::current_exception());
  }
  return result;
}

// ------------------------------------------------------------- users' side

std::shared_ptr<RRefCore> RRefTable::create(const WorkerInfo& owner, Message user_request,
                                            std::string type,
                                            std::optional<std::chrono::milliseconds> timeout,
                                            const std::shared_ptr<RRefCore>& target,
                                            RRefEncodeScope* forks) {
  check_open(fmt::format("remote(\"{}\", \"{}\")", owner.name, user_request.function));
  RRefId id{self_.id, 0};
  {
    MutexLock lock(mu_);
    id.serial = next_serial_++;
  }
  const bool here = owner.name == self_.name;
  std::optional<std::tuple<int32_t, uint64_t>> on;
  if (target) on = std::make_tuple(target->id.creator, target->id.serial);
  Message request = protocol_request(kRemote, id.creator, id.serial, type, here,
                                     user_request.function, user_request.payload, on);
  request.tensors = std::move(user_request.tensors);

  std::shared_ptr<RRefCore> core;
  std::shared_ptr<OwnerEntry> entry;
  if (here) {
    entry = owner_entry(id, /*count_user=*/true);
    core = std::make_shared<RRefCore>(shared_from_this(), id, owner, type, entry);
  }
  Future<Message> made = send_now(owner, std::move(request), timeout);
  if (forks != nullptr) forks->watch(made);
  // The target is kept until its call is over.
  Future<void> confirmed = made.then_inline([target](const Future<Message>& done) {
    decode_result<void>(done.value(), kRemote);
  });
  if (here) {
    // A value that never came (the call failed before it ran) is that error.
    confirmed.add_callback([entry](const Future<void>& done) {
      if (done.has_error()) entry->promise.set_error(done.error());
    });
    return core;
  }
  return std::make_shared<RRefCore>(shared_from_this(), id, owner, std::move(type),
                                    std::move(confirmed), /*creator=*/true);
}

std::string RRefTable::pack(const std::shared_ptr<RRefCore>& core) {
  check_open(fmt::format("sending {}", rref_describe(*core)));
  uint64_t fork = 0;  // 0: counted by the owner already
  {
    MutexLock lock(mu_);
    if (core->entry != nullptr) {
      ++counts_[core->id].users;
    } else {
      fork = next_fork_++;
      forks_.emplace(fork, core);
      // Not part of a call's arguments (a result, or a value encoded by
      // hand): graceful shutdown cannot tell whether it went, and does
      // not wait for it.
      if (encode_forks_on_this_thread() != nullptr) {
        encode_forks_on_this_thread()->emplace_back(shared_from_this(), fork);
      } else {
        orphans_.insert(fork);
      }
    }
  }
  std::vector<uint8_t> body;
  PayloadWriter writer{&body};
  Packer packer(writer);
  packer.pack_array(7);
  packer.pack(core->owner.name);
  packer.pack(core->owner.id);
  packer.pack(core->id.creator);
  packer.pack(core->id.serial);
  packer.pack(core->type);
  packer.pack(self_.name);
  packer.pack(fork);
  return std::string(body.begin(), body.end());
}

std::shared_ptr<RRefCore> RRefTable::unpack(const char* data, size_t size,
                                            const std::optional<std::string>& expected_type) {
  check_open("receiving an RRef");
  msgpack::object_handle handle = msgpack::unpack(data, size);
  WorkerInfo owner;
  RRefId id;
  std::string type;
  std::string parent;
  uint64_t fork = 0;
  try {
    std::tie(owner.name, owner.id, id.creator, id.serial, type, parent, fork) =
        handle.get()
            .as<std::tuple<std::string, int, int32_t, uint64_t, std::string, std::string,
                           uint64_t>>();
  } catch (const msgpack::type_error&) {
    throw SerializationError(
        "an RRef is not [owner, owner id, creator, serial, type, parent, fork]");
  }
  std::shared_ptr<RRefCore> core;
  if (owner.name == self_.name) {
    // Counted by this very worker when it sent it, or announced here now.
    std::shared_ptr<OwnerEntry> entry = owner_entry(id, /*count_user=*/fork != 0);
    core = std::make_shared<RRefCore>(shared_from_this(), id, owner, type, std::move(entry));
    if (fork != 0) {
      if (parent == self_.name) {
        release_fork(fork);
      } else {
        send_later(WorkerInfo{parent, -1}, protocol_request(kRelease, fork));
      }
    }
  } else if (fork == 0) {
    core = std::make_shared<RRefCore>(shared_from_this(), id, owner, type,
                                      Future<void>::ready());
  } else {
    Future<void> confirmed =
        confirm_later(owner, protocol_request(kFork, id.creator, id.serial, parent, fork));
    // A function that receives it runs once the owner counted it (torch's
    // confirmed_by_owner() is true inside it).
    ArgumentWaits::add(confirmed, pool_);
    core = std::make_shared<RRefCore>(shared_from_this(), id, owner, type, std::move(confirmed));
  }
  // Checked once the reference exists, so that a refused one is released.
  if (expected_type && type != *expected_type) throw msgpack::type_error();
  return core;
}

Future<Message> RRefTable::fetch(const std::shared_ptr<RRefCore>& core,
                                 std::optional<std::chrono::milliseconds> timeout) {
  check_open(fmt::format("to_here() of {}", rref_describe(*core)));
  if (core->entry != nullptr) {
    std::shared_ptr<OwnerEntry> entry = core->entry;
    return entry->value.then_inline(
        [entry](const Future<Message>&) { return as_response(entry->current(), 0); });
  }
  if (core->confirmed.has_error()) return Future<Message>::failed(core->confirmed.error());
  Future<Message> fetched = send_now(
      core->owner, protocol_request(kFetch, core->id.creator, core->id.serial), timeout);
  if (core->confirmed.done()) return fetched;
  // A remote() that fails (its timeout, its owner gone) fails the fetch
  // waiting for its value at once.
  Promise<Message> first;
  fetched.add_callback([first](const Future<Message>& done) {
    if (done.has_error()) {
      first.set_error(done.error());
    } else {
      first.set_value(done.value());
    }
  });
  core->confirmed.add_callback([first](const Future<void>& done) {
    if (done.has_error()) first.set_error(done.error());
  });
  return first.get_future();
}

Future<Message> RRefTable::call(const std::shared_ptr<RRefCore>& core, Message request,
                                std::optional<std::chrono::milliseconds> timeout) {
  check_open(fmt::format("a call on {}", rref_describe(*core)));
  if (core->confirmed.has_error()) return Future<Message>::failed(core->confirmed.error());
  Message wrapped = protocol_request(kCall, core->id.creator, core->id.serial, request.function,
                                     request.payload);
  wrapped.tensors = std::move(request.tensors);
  // The caller's decoding holds `core` until the call is over
  // (decode_with in rpc/rref.h), so the owner keeps the value meanwhile.
  return send_now(core->owner, std::move(wrapped), timeout);
}

// ------------------------------------------------------------- owner's side

Future<Message> RRefTable::serve(const Message& request, const WorkerInfo& from) {
  try {
    const std::string& f = request.function;
    if (f == kRemote) return serve_remote(request, from);
    if (f == kFetch) return serve_fetch(request);
    if (f == kCall) return serve_call(request, from);
    if (f == kFork) return Future<Message>::ready(serve_fork(request));
    if (f == kRelease) return Future<Message>::ready(serve_release(request));
    if (f == kDelete) return Future<Message>::ready(serve_delete(request));
    throw NotFoundError(fmt::format("worker \"{}\" has no RRef function \"{}\"", self_.name, f));
  } catch (...) {
    return Future<Message>::ready(
        make_error_response(request.id, self_.name, std::current_exception()));
  }
}

namespace {

// The context of the request that carries a user's call (its deadline from
// the request's arrival, its cancellation, its caller's epoch), for that
// call: the same, under the user function's name.
std::optional<CallContext> carried_context(const Message& inner) {
  const CallContext* carrier = current_call();
  if (carrier == nullptr || carrier->id != inner.id) return std::nullopt;
  CallContext context = *carrier;
  context.function = inner.function;
  return context;
}

// Serves `request` under `context` (when set), as if the call table had
// handed it over.
Future<Message> call_under(const FunctionRegistry& functions, const Message& request,
                           const WorkerInfo& from, const std::optional<CallContext>& context) {
  if (!context) return functions.call(request, from);
  ScopedCallContext scope(&*context);
  return functions.call(request, from);
}

}  // namespace

Future<Message> RRefTable::call_on_value(const std::shared_ptr<OwnerEntry>& entry,
                                         Message inner, const WorkerInfo& from) {
  std::shared_ptr<RRefTable> self = shared_from_this();
  std::optional<CallContext> context = carried_context(inner);
  return entry->value.then([self, entry, inner = std::move(inner), from,
                            context = std::move(context)](
                               const Future<Message>&) -> Future<Message> {
    RRefDecodeScope scope(self);
    const Message value = entry->current();
    if (value.type == MessageType::kError) {
      return Future<Message>::ready(as_response(value, inner.id));
    }
    return call_under(*self->functions_, value_first(value, inner), from, context);
  });
}

void RRefTable::settle(const std::shared_ptr<OwnerEntry>& entry, const Message& made) {
  if (made.type != MessageType::kResponse || made.payload.empty()) return;
  try {
    msgpack::object_handle handle = unpack_payload(made.payload, "an RRef's value");
    for_each_ext(handle.get(), kRRefExtType, [&](const msgpack::object& ext) {
      entry->held.push_back(unpack(ext.via.ext.data(), ext.via.ext.size, std::nullopt));
    });
  } catch (const std::exception& e) {
    // Not a payload this worker can read (it came from its own function):
    // the value goes out as it came, its RRefs not held.
    spdlog::warn("rpc worker \"{}\": the RRefs in a value it owns cannot be read ({}); "
                 "they are not kept for it",
                 self_.name, e.what());
    entry->held.clear();
  }
}

Future<Message> RRefTable::serve_remote(const Message& request, const WorkerInfo& from) {
  using Args = std::tuple<int32_t, uint64_t, std::string, bool, std::string,
                          std::vector<uint8_t>, std::optional<std::tuple<int32_t, uint64_t>>>;
  auto [creator, serial, type, counted, function, payload, target] =
      decode_args<Args>(request, kRemote);
  const RRefId id{creator, serial};
  std::shared_ptr<OwnerEntry> entry;
  std::shared_ptr<OwnerEntry> unused;  // its only RRef is gone already
  {
    MutexLock lock(mu_);
    if (closed_) throw Error(ErrorCode::kCancelled, "this worker is shutting down");
    entry = owner_entry_locked(id);
    Count& count = counts_[id];
    if (!counted) ++count.users;
    count.created = true;
    unused = free_if_unused_locked(id);
  }
  Message inner = user_request(request, std::move(function), std::move(payload));
  Future<Message> made;
  if (target) {
    made = call_on_value(owner_entry(RRefId{std::get<0>(*target), std::get<1>(*target)}, false),
                         std::move(inner), from);
  } else {
    made = call_under(*functions_, inner, from, carried_context(inner));
  }
  const uint64_t reply_to = request.id;
  std::shared_ptr<RRefTable> self = shared_from_this();
  return made.then_inline([self, entry, reply_to](const Future<Message>& done) {
    if (done.has_error()) {
      entry->promise.set_error(done.error());
    } else {
      self->settle(entry, done.value());
      entry->promise.set_value(done.value());
    }
    return ack(reply_to);
  });
}

Future<Message> RRefTable::serve_fetch(const Message& request) {
  auto [creator, serial] = decode_args<std::tuple<int32_t, uint64_t>>(request, kFetch);
  std::shared_ptr<OwnerEntry> entry = owner_entry(RRefId{creator, serial}, false);
  const uint64_t reply_to = request.id;
  std::string worker = self_.name;
  return entry->value.then([entry, reply_to, worker](const Future<Message>&) {
    try {
      return as_response(entry->current(), reply_to);
    } catch (...) {
      return make_error_response(reply_to, worker, std::current_exception());
    }
  });
}

Future<Message> RRefTable::serve_call(const Message& request, const WorkerInfo& from) {
  auto [creator, serial, function, payload] =
      decode_args<std::tuple<int32_t, uint64_t, std::string, std::vector<uint8_t>>>(request,
                                                                                    kCall);
  Message inner = user_request(request, std::move(function), std::move(payload));
  return call_on_value(owner_entry(RRefId{creator, serial}, false), std::move(inner), from);
}

Message RRefTable::serve_fork(const Message& request) {
  auto [creator, serial, parent, fork] =
      decode_args<std::tuple<int32_t, uint64_t, std::string, uint64_t>>(request, kFork);
  owner_entry(RRefId{creator, serial}, /*count_user=*/true);
  // Sent while this request is being served, so that graceful shutdown's
  // quiet rounds see it.
  if (parent == self_.name) {
    release_fork(fork);
  } else {
    // Its answer is not needed: a lost release only keeps a value longer.
    (void)send_now(WorkerInfo{parent, -1}, protocol_request(kRelease, fork), std::nullopt);
  }
  return ack(request.id);
}

Message RRefTable::serve_release(const Message& request) {
  auto [fork] = decode_args<std::tuple<uint64_t>>(request, kRelease);
  release_fork(fork);
  return ack(request.id);
}

Message RRefTable::serve_delete(const Message& request) {
  auto [creator, serial] = decode_args<std::tuple<int32_t, uint64_t>>(request, kDelete);
  drop_users_of(RRefId{creator, serial}, 1, "a user");
  return ack(request.id);
}

// ------------------------------------------------------------- lifecycle

void RRefTable::release_users(std::chrono::steady_clock::time_point deadline) {
  std::vector<std::shared_ptr<RRefCore>> held;
  {
    MutexLock lock(mu_);
    // Announcements that will not come: their call failed, or their owner
    // left the group.
    auto awaited = [&]() SB_REQUIRES(mu_) {
      for (const auto& [fork, core] : forks_) {
        if (orphans_.contains(fork)) continue;
        try {
          (void)context_->get_worker_info(core->owner.name);
        } catch (const std::exception&) {
          continue;
        }
        return true;
      }
      return owed_ > 0;
    };
    changed_.wait_until(mu_, deadline, [&]() SB_REQUIRES(mu_) { return !awaited(); });
    std::set<const RRefCore*> sent;
    for (const auto& [fork, core] : forks_) sent.insert(core.get());
    for (RRefCore* core : users_) {
      // Sent and not yet announced: released when the owner tells (as at
      // any time), since its receiver may still be on the way.
      if (sent.contains(core)) continue;
      // A core whose last handle is being dropped right now is left to its
      // destructor, which releases it.
      std::shared_ptr<RRefCore> alive = core->weak_from_this().lock();
      if (alive == nullptr || alive->released.exchange(true)) continue;
      held.push_back(std::move(alive));
    }
  }
  for (const std::shared_ptr<RRefCore>& core : held) {
    // Sent on this thread, so that the quiet rounds that follow count it.
    if (!core->confirmed.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now())) ||
        (core->confirmed.has_error() && !core->creator)) {
      continue;
    }
    (void)send_now(core->owner,
                   protocol_request(kDelete, core->id.creator, core->id.serial), std::nullopt);
  }
}

void RRefTable::close() {
  std::map<uint64_t, std::shared_ptr<RRefCore>> forks;  // dropped outside the lock
  {
    MutexLock lock(mu_);
    closed_ = true;
    changed_.wait(mu_, [&]() SB_REQUIRES(mu_) { return sending_ == 0; });
    int64_t leaked = 0;
    for (const auto& [id, count] : counts_) {
      if (count.users > 0) ++leaked;
    }
    if (leaked > 0) {
      spdlog::warn("rpc worker \"{}\" shut down owning {} RRef value(s) that other workers "
                   "still referenced; they are freed",
                   self_.name, leaked);
    }
    closed_owners_.swap(owners_);
    counts_.clear();
    forks.swap(forks_);
    orphans_.clear();
  }
}

void RRefTable::abandon() {
  std::map<RRefId, std::shared_ptr<OwnerEntry>> owned;
  {
    MutexLock lock(mu_);
    owned.swap(closed_owners_);
  }
  // Values still being made never will be: what waits for them (the
  // owner's own local_value(), fetches whose replies can no longer go)
  // ends. Callers elsewhere saw the connection drop.
  for (auto& [id, entry] : owned) {
    entry->promise.set_error(std::make_exception_ptr(ConnectionError(
        fmt::format("RRef {}: its owner \"{}\" shut down", id_text(id), self_.name))));
  }
}

std::map<std::string, int64_t> RRefTable::debug_info() const {
  MutexLock lock(mu_);
  int64_t pending = 0;
  for (RRefCore* core : users_) {
    if (!core->confirmed.done()) ++pending;
  }
  return {{"num_owner_rrefs", static_cast<int64_t>(owners_.size())},
          {"num_user_rrefs", static_cast<int64_t>(users_.size())},
          {"num_pending_users", pending},
          {"num_forks", static_cast<int64_t>(forks_.size())}};
}

}  // namespace switchboard::rpc::detail
