#include "rpc/rref.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "rpc/rpc.h"
#include "rpc/rref_table.h"

namespace switchboard::rpc::detail {

namespace {

thread_local std::shared_ptr<RRefTable> decode_table;
thread_local RRefEncodeScope::Forks* encode_forks = nullptr;

}  // namespace

std::string id_text(RRefId id) { return fmt::format("{}:{}", id.creator, id.serial); }

RRefEncodeScope::Forks* encode_forks_on_this_thread() { return encode_forks; }

// ---------------------------------------------------------------- RRefCore

RRefCore::RRefCore(std::shared_ptr<RRefTable> table_in, RRefId id_in, WorkerInfo owner_in,
                   std::string type_in, Future<void> confirmed_in, bool creator_in)
    : table(std::move(table_in)),
      id(id_in),
      owner(std::move(owner_in)),
      type(std::move(type_in)),
      confirmed(std::move(confirmed_in)),
      creator(creator_in) {
  table->add_user(this);
}

RRefCore::RRefCore(std::shared_ptr<RRefTable> table_in, RRefId id_in, WorkerInfo owner_in,
                   std::string type_in, std::shared_ptr<OwnerEntry> entry_in)
    : table(std::move(table_in)),
      id(id_in),
      owner(std::move(owner_in)),
      type(std::move(type_in)),
      entry(std::move(entry_in)),
      confirmed(Future<void>::ready()) {}

RRefCore::~RRefCore() {
  if (entry != nullptr) {
    table->drop_owner_reference(id);
  } else {
    table->drop_user(this);
  }
}

// ------------------------------------------------------------- rref.h

RRefDecodeScope::RRefDecodeScope(std::shared_ptr<RRefTable> table)
    : previous_(std::exchange(decode_table, std::move(table))) {}

RRefDecodeScope::~RRefDecodeScope() { decode_table = std::move(previous_); }

RRefEncodeScope::RRefEncodeScope() : previous_(std::exchange(encode_forks, &forks_)) {}

RRefEncodeScope::~RRefEncodeScope() {
  encode_forks = previous_;
  for (const auto& [table, fork] : forks_) table->orphan({fork});
}

void RRefEncodeScope::watch(const Future<Message>& sent) {
  if (forks_.empty()) return;
  sent.add_callback([forks = std::move(forks_)](const Future<Message>& done) {
    if (!done.has_error()) return;
    for (const auto& [table, fork] : forks) table->orphan({fork});
  });
  forks_.clear();
}

const std::shared_ptr<RRefTable>& rref_table(const RRefCore& core) { return core.table; }
WorkerInfo rref_owner(const RRefCore& core) { return core.owner; }
bool rref_is_owner(const RRefCore& core) { return core.entry != nullptr; }

bool rref_confirmed(const RRefCore& core) {
  return core.confirmed.done() && !core.confirmed.has_error();
}

bool rref_same(const RRefCore& a, const RRefCore& b) {
  return a.id == b.id && a.owner.name == b.owner.name;
}

std::string rref_describe(const RRefCore& core) {
  return fmt::format("RRef(owner \"{}\", id {}, type {})", core.owner.name, id_text(core.id),
                     core.type);
}

Future<Message> rref_fetch(const std::shared_ptr<RRefCore>& core,
                           std::optional<std::chrono::milliseconds> timeout) {
  return core->table->fetch(core, timeout);
}

void* rref_local_value(const RRefCore& core, const std::string& type,
                       const TypedDecoder& decode, TypedEncoder encode) {
  if (core.entry == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("local_value() of {} on worker \"{}\": only its owner holds the "
                            "value; use to_here()",
                            rref_describe(core), core.table->self().name));
  }
  OwnerEntry& entry = *core.entry;
  (void)entry.value.value();  // waits for it; throws what made it failed with
  std::shared_ptr<void> decoded;
  bool decode_now = false;
  {
    MutexLock lock(entry.typed_mu);
    decode_now = entry.typed == nullptr;
  }
  if (decode_now) {
    // From the value as it would go out: the RRefs in it are references
    // of the typed value's own.
    const Message fresh = entry.current();
    RRefDecodeScope scope(core.table);
    decoded = decode(fresh);
  }
  MutexLock lock(entry.typed_mu);
  if (entry.typed == nullptr) {
    entry.typed = std::move(decoded);
    entry.typed_type = type;
    entry.encode = std::move(encode);
  } else if (entry.typed_type != type) {
    throw SerializationError(fmt::format("local_value() of {}: the value is a {}, not a {}",
                                         rref_describe(core), entry.typed_type, type));
  }
  return entry.typed.get();
}

Future<Message> rref_call(const std::shared_ptr<RRefCore>& core, Message request,
                          std::optional<std::chrono::milliseconds> timeout) {
  return core->table->call(core, std::move(request), timeout);
}

std::shared_ptr<RRefCore> rref_remote(const std::shared_ptr<RRefCore>& core, Message request,
                                      std::string type,
                                      std::optional<std::chrono::milliseconds> timeout,
                                      RRefEncodeScope* forks) {
  return core->table->create(core->owner, std::move(request), std::move(type), timeout, core,
                             forks);
}

std::string rref_pack(const std::shared_ptr<RRefCore>& core) { return core->table->pack(core); }

std::shared_ptr<RRefCore> rref_unpack(const char* data, size_t size,
                                      const std::string& expected_type) {
  if (decode_table == nullptr) {
    throw SerializationError(
        "an RRef can only be received in an RPC's arguments or result (or to_here())");
  }
  return decode_table->unpack(data, size, expected_type);
}

}  // namespace switchboard::rpc::detail
