#include "collective/groups.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include "collective/registry.h"
#include "common/auth.h"
#include "common/error.h"
#include "rendezvous/rounds.h"
#include "store/prefix_store.h"
#include "store/store.h"
#include "store/tcp_store.h"

namespace switchboard::collective {
namespace {

constexpr std::string_view kSpecHeader = "switchboard collective group spec v1";

void check_group_name(std::string_view what, const std::string& name) {
  if (name.empty())
    throw std::invalid_argument(fmt::format("{}: the group name is empty", what));
  if (name.find('/') != std::string::npos) {
    throw std::invalid_argument(
        fmt::format("{}: group name \"{}\" contains '/', which is reserved", what, name));
  }
}

void check_member_name(std::string_view what, const std::string& name) {
  if (name.empty())
    throw std::invalid_argument(fmt::format("{}: a member name is empty", what));
  if (name.find_first_of("\r\n") != std::string::npos) {
    throw std::invalid_argument(
        fmt::format("{}: member name \"{}\" contains a line break", what, name));
  }
}

void check_spec(std::string_view what, const GroupSpec& spec) {
  check_group_name(what, spec.group_name);
  if (spec.world_size < 1 ||
      static_cast<size_t>(spec.world_size) != spec.members.size()) {
    throw std::invalid_argument(
        fmt::format("{}: group \"{}\" has world_size {} but {} members", what,
                    spec.group_name, spec.world_size, spec.members.size()));
  }
  std::set<std::string> seen;
  for (const auto& member : spec.members) {
    check_member_name(what, member);
    if (!seen.insert(member).second) {
      throw std::invalid_argument(
          fmt::format("{}: member \"{}\" is listed twice in group \"{}\"", what, member,
                      spec.group_name));
    }
  }
  if (spec.backend.empty() || spec.backend.find_first_of("\r\n") != std::string::npos) {
    throw std::invalid_argument(
        fmt::format("{}: bad backend name \"{}\"", what, spec.backend));
  }
  if (spec.timeout.count() <= 0) {
    throw std::invalid_argument(fmt::format("{}: timeout must be positive, got {} ms",
                                            what, spec.timeout.count()));
  }
}

std::string describe(const GroupSpec& spec) {
  std::string members;
  for (const auto& m : spec.members)
    members += fmt::format("{}\"{}\"", members.empty() ? "" : ", ", m);
  return fmt::format("world_size {}, backend {}, members [{}], timeout {} ms",
                     spec.world_size, spec.backend, members, spec.timeout.count());
}

long long parse_integer(std::string_view what, const std::string& text, long long lo,
                        long long hi) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < lo || value > hi) {
    throw std::invalid_argument(
        fmt::format("{}: \"{}\" is not an integer in [{}, {}]", what, text, lo, hi));
  }
  return value;
}

std::string default_member_name() {
  const char* env = std::getenv("SWITCHBOARD_MEMBER_NAME");
  if (env != nullptr && *env != '\0') return env;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return fmt::format("{}:{}", host[0] != '\0' ? host : "localhost", getpid());
}

// A TcpStore client of $MASTER_ADDR:$MASTER_PORT, or null (required: an
// error naming the missing variables) when they are not set.
std::shared_ptr<Store> store_from_env(std::string_view what, GroupTimeout timeout,
                                      bool required) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  std::vector<std::string> missing;
  if (addr == nullptr || *addr == '\0') missing.push_back("MASTER_ADDR");
  if (port == nullptr || *port == '\0') missing.push_back("MASTER_PORT");
  if (!missing.empty()) {
    if (!required) return nullptr;
    throw std::invalid_argument(
        fmt::format("{}: no store given, no default store set "
                    "(CollectiveContext::set_default_store), "
                    "and the environment variable{} {} {} not set; set MASTER_ADDR and "
                    "MASTER_PORT to "
                    "the address of a TcpStore server",
                    what, missing.size() > 1 ? "s" : "", fmt::join(missing, " and "),
                    missing.size() > 1 ? "are" : "is"));
  }
  long long port_number =
      parse_integer(fmt::format("{}: MASTER_PORT", what), port, 1, 65535);
  TcpStoreOptions options;
  options.timeout = timeout;
  options.secret = Secret::from_environment();  // the job's, when it has one
  return std::make_shared<TcpStore>(addr, static_cast<uint16_t>(port_number), options);
}

}  // namespace

std::string encode_group_spec(const GroupSpec& spec) {
  check_spec("encode_group_spec", spec);
  std::string out =
      fmt::format("{}\ngroup_name={}\nworld_size={}\nbackend={}\ntimeout_ms={}\n",
                  kSpecHeader, spec.group_name, spec.world_size,
                  normalize_backend_name(spec.backend), spec.timeout.count());
  for (const auto& member : spec.members) out += fmt::format("member={}\n", member);
  return out;
}

GroupSpec decode_group_spec(std::string_view text) {
  const std::string_view what = "decode_group_spec";
  GroupSpec spec;
  spec.world_size = -1;
  spec.backend.clear();
  spec.group_name.clear();
  size_t pos = 0;
  bool header = true;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string line(text.substr(pos, eol - pos));
    pos = eol + 1;
    if (header) {
      if (line != kSpecHeader) {
        throw std::invalid_argument(
            fmt::format("{}: not a group spec (first line \"{}\")", what, line));
      }
      header = false;
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      throw std::invalid_argument(fmt::format("{}: malformed line \"{}\"", what, line));
    }
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "group_name") {
      spec.group_name = value;
    } else if (key == "world_size") {
      spec.world_size = static_cast<int>(parse_integer(what, value, 1, 1 << 30));
    } else if (key == "backend") {
      spec.backend = value;
    } else if (key == "timeout_ms") {
      spec.timeout = GroupTimeout(
          parse_integer(what, value, 1, std::numeric_limits<long long>::max()));
    } else if (key == "member") {
      spec.members.push_back(value);
    } else {
      throw std::invalid_argument(fmt::format("{}: unknown key \"{}\"", what, key));
    }
  }
  if (header) throw std::invalid_argument(fmt::format("{}: empty spec", what));
  check_spec(what, spec);
  return spec;
}

CollectiveContext::CollectiveContext() : member_name_(default_member_name()) {}

CollectiveContext::~CollectiveContext() {
  std::map<std::string, Slot> slots;
  {
    MutexLock lock(mu_);
    slots.swap(slots_);
  }
  slots.clear();  // each group's destructor waits for its running op
}

CollectiveContext& CollectiveContext::global() {
  static CollectiveContext context;
  return context;
}

void CollectiveContext::set_default_store(std::shared_ptr<Store> store) {
  MutexLock lock(mu_);
  default_store_ = std::move(store);
}

std::shared_ptr<Store> CollectiveContext::default_store() const {
  MutexLock lock(mu_);
  return default_store_;
}

void CollectiveContext::set_member_name(std::string name) {
  check_member_name("set_member_name", name);
  MutexLock lock(mu_);
  member_name_ = std::move(name);
}

std::string CollectiveContext::member_name() const {
  MutexLock lock(mu_);
  return member_name_;
}

void CollectiveContext::set_spec_wait_timeout(GroupTimeout timeout) {
  MutexLock lock(mu_);
  spec_wait_timeout_ = timeout;
}

GroupTimeout CollectiveContext::spec_wait_timeout() const {
  MutexLock lock(mu_);
  return spec_wait_timeout_;
}

std::shared_ptr<Store> CollectiveContext::resolve_store(
    std::shared_ptr<Store> explicit_store, GroupTimeout timeout, std::string_view what,
    bool required) const {
  if (explicit_store != nullptr) return explicit_store;
  if (auto store = default_store()) return store;
  return store_from_env(what, timeout, required);
}

void CollectiveContext::init_collective_group(int world_size, int rank,
                                              std::string_view backend,
                                              const std::string& group_name,
                                              GroupTimeout timeout,
                                              std::shared_ptr<Store> store) {
  const std::string_view what = "init_collective_group";
  check_group_name(what, group_name);
  if (world_size < 1) {
    throw std::invalid_argument(
        fmt::format("{}(\"{}\"): world_size must be at least 1, got {}", what, group_name,
                    world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument(
        fmt::format("{}(\"{}\"): rank {} is out of range for world_size {}", what,
                    group_name, rank, world_size));
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument(
        fmt::format("{}(\"{}\"): timeout must be positive, got {} ms", what, group_name,
                    timeout.count()));
  }
  claim(group_name, what);
  try {
    (void)require_collective_backend(backend);  // fail before touching the store
    auto resolved = resolve_store(std::move(store), timeout, what, /*required=*/true);
    install(group_name, build(group_name, world_size, rank, backend, timeout, resolved));
  } catch (...) {
    release(group_name);
    throw;
  }
}

void CollectiveContext::claim(const std::string& group_name, std::string_view what) {
  MutexLock lock(mu_);
  auto it = slots_.find(group_name);
  if (it != slots_.end()) {
    if (it->second.group == nullptr) {
      throw std::invalid_argument(fmt::format(
          "{}: collective group \"{}\" is being initialized by another thread", what,
          group_name));
    }
    throw std::invalid_argument(
        fmt::format("{}: collective group \"{}\" is already initialized in this process "
                    "(rank {} of {}); "
                    "call destroy_collective_group(\"{}\") first",
                    what, group_name, it->second.group->rank(), it->second.group->size(),
                    group_name));
  }
  slots_.emplace(group_name, Slot{});
}

void CollectiveContext::install(const std::string& group_name,
                                std::shared_ptr<ProcessGroup> group) {
  MutexLock lock(mu_);
  slots_[group_name].group = std::move(group);
  slots_changed_.notify_all();
}

void CollectiveContext::release(const std::string& group_name) {
  MutexLock lock(mu_);
  slots_.erase(group_name);
  slots_changed_.notify_all();
}

std::shared_ptr<ProcessGroup> CollectiveContext::build(
    const std::string& group_name, int world_size, int rank, std::string_view backend,
    GroupTimeout timeout, const std::shared_ptr<Store>& store) const {
  // The generation rule of groups.h.
  const rendezvous::Round round =
      rendezvous::join_collective_round(store, group_name, world_size, rank);
  const int64_t generation = round.number;
  GroupInit init{*round.store, rank, world_size, group_name, timeout};
  std::shared_ptr<ProcessGroup> group = create_process_group(backend, init);
  spdlog::info(
      "collective group \"{}\": rank {} of {} joined (backend {}, generation {}, "
      "member \"{}\")",
      group_name, rank, world_size, group->backend_name(), generation, member_name());
  return group;
}

std::shared_ptr<ProcessGroup> CollectiveContext::find_or_join(
    const std::string& group_name, SpecWait wait, std::string_view what) {
  check_group_name(what, group_name);
  for (;;) {
    GroupTimeout wait_timeout;
    std::string me;
    {
      MutexLock lock(mu_);
      slots_changed_.wait(mu_, [&]() SB_REQUIRES(mu_) {
        auto it = slots_.find(group_name);
        return it == slots_.end() || it->second.group != nullptr;
      });
      auto it = slots_.find(group_name);
      if (it != slots_.end()) return it->second.group;
      wait_timeout = spec_wait_timeout_;
      me = member_name_;
    }
    auto store = resolve_store(nullptr, wait_timeout, what, wait == SpecWait::kWait);
    if (store == nullptr) return nullptr;
    std::optional<GroupSpec> spec =
        read_spec(*store, group_name, wait, wait_timeout, me, what);
    if (!spec) return nullptr;
    auto member = std::find(spec->members.begin(), spec->members.end(), me);
    if (member == spec->members.end()) return nullptr;
    int rank = static_cast<int>(member - spec->members.begin());
    try {
      claim(group_name, what);
    } catch (const std::invalid_argument&) {
      continue;  // another thread got there first; use its group
    }
    try {
      auto group =
          build(group_name, spec->world_size, rank, spec->backend, spec->timeout, store);
      install(group_name, group);
      return group;
    } catch (...) {
      release(group_name);
      throw;
    }
  }
}

std::optional<GroupSpec> CollectiveContext::read_spec(
    Store& store, const std::string& group_name, SpecWait wait, GroupTimeout wait_timeout,
    const std::string& me, std::string_view what) const {
  std::string key = rendezvous::collective_spec_key(group_name);
  if (wait == SpecWait::kNoWait) {
    if (!store.check({key})) return std::nullopt;
  } else {
    try {
      store.wait({key}, wait_timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format(
          "{}: collective group \"{}\" is not initialized in this process (member "
          "\"{}\") and "
          "no spec for it appeared in the store under \"{}\" within {} ms; call "
          "init_collective_group() or create_collective_group() first",
          what, group_name, me, key, wait_timeout.count()));
    }
  }
  return decode_group_spec(to_string(store.get(key)));
}

std::shared_ptr<ProcessGroup> CollectiveContext::require(const std::string& group_name,
                                                         std::string_view what) {
  auto group = find_or_join(group_name, SpecWait::kWait, what);
  if (group == nullptr) {
    throw std::invalid_argument(fmt::format(
        "{}: this process (member \"{}\") is not a member of collective group \"{}\"",
        what, member_name(), group_name));
  }
  return group;
}

void CollectiveContext::create_collective_group(const GroupSpec& spec,
                                                std::shared_ptr<Store> store) {
  const std::string_view what = "create_collective_group";
  std::string text = encode_group_spec(spec);  // checks the spec
  if (!is_collective_backend_registered(spec.backend)) {
    std::string why;
    is_collective_backend_available(spec.backend, &why);
    throw RegistryError(fmt::format("{}(\"{}\"): {}", what, spec.group_name, why));
  }
  auto resolved = resolve_store(std::move(store), spec.timeout, what, /*required=*/true);
  std::string current =
      to_string(resolved->compare_set(rendezvous::collective_spec_key(spec.group_name), {}, to_bytes(text)));
  if (current == text) return;
  std::string existing;
  try {
    existing = describe(decode_group_spec(current));
  } catch (const std::invalid_argument& e) {
    existing = fmt::format("unreadable ({})", e.what());
  }
  throw Error(
      ErrorCode::kFailedPrecondition,
      fmt::format("{}: collective group \"{}\" already has a different spec in the "
                  "store: {} (new: {})",
                  what, spec.group_name, existing, describe(decode_group_spec(text))));
}

bool CollectiveContext::remove_collective_group_spec(const std::string& group_name,
                                                     std::shared_ptr<Store> store) {
  const std::string_view what = "remove_collective_group_spec";
  check_group_name(what, group_name);
  auto resolved =
      resolve_store(std::move(store), spec_wait_timeout(), what, /*required=*/true);
  return resolved->delete_key(rendezvous::collective_spec_key(group_name));
}

bool CollectiveContext::destroy_collective_group(const std::string& group_name) {
  std::shared_ptr<ProcessGroup> dropped;
  {
    MutexLock lock(mu_);
    slots_changed_.wait(mu_, [&]() SB_REQUIRES(mu_) {
      auto it = slots_.find(group_name);
      return it == slots_.end() || it->second.group != nullptr;
    });
    auto it = slots_.find(group_name);
    if (it == slots_.end()) {
      spdlog::debug("destroy_collective_group: no collective group \"{}\" here",
                    group_name);
      return false;
    }
    dropped = std::move(it->second.group);
    slots_.erase(it);
  }
  dropped.reset();  // outside the lock: waits for an op that is running
  return true;
}

bool CollectiveContext::is_group_initialized(const std::string& group_name) const {
  MutexLock lock(mu_);
  auto it = slots_.find(group_name);
  return it != slots_.end() && it->second.group != nullptr;
}

std::vector<std::string> CollectiveContext::initialized_groups() const {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, slot] : slots_) {
    if (slot.group != nullptr) names.push_back(name);
  }
  return names;
}

int CollectiveContext::get_rank(const std::string& group_name) {
  auto group = find_or_join(group_name, SpecWait::kNoWait, "get_rank");
  return group == nullptr ? -1 : group->rank();
}

int CollectiveContext::get_collective_group_size(const std::string& group_name) {
  auto group = find_or_join(group_name, SpecWait::kNoWait, "get_collective_group_size");
  return group == nullptr ? -1 : group->size();
}

std::shared_ptr<ProcessGroup> CollectiveContext::get_group(
    const std::string& group_name) {
  return require(group_name, "get_group");
}

// The synchronous ops: find (or lazily join) the group, issue, wait with the
// group's timeout. `group` keeps the ProcessGroup alive through the wait.

void CollectiveContext::allreduce(Tensor& tensor, const std::string& group_name,
                                  ReduceOp op) {
  auto group = require(group_name, "allreduce");
  group->allreduce(tensor, op).wait();
}

void CollectiveContext::broadcast(Tensor& tensor, int src_rank,
                                  const std::string& group_name) {
  auto group = require(group_name, "broadcast");
  group->broadcast(tensor, src_rank).wait();
}

void CollectiveContext::reduce(Tensor& tensor, int dst_rank,
                               const std::string& group_name, ReduceOp op) {
  auto group = require(group_name, "reduce");
  group->reduce(tensor, dst_rank, op).wait();
}

void CollectiveContext::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                  const std::string& group_name) {
  auto group = require(group_name, "allgather");
  group->allgather(outputs, input).wait();
}

void CollectiveContext::gather(std::vector<Tensor>& outputs, const Tensor& input,
                               int dst_rank, const std::string& group_name) {
  auto group = require(group_name, "gather");
  group->gather(outputs, input, dst_rank).wait();
}

void CollectiveContext::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                int src_rank, const std::string& group_name) {
  auto group = require(group_name, "scatter");
  group->scatter(output, inputs, src_rank).wait();
}

void CollectiveContext::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                       const std::string& group_name, ReduceOp op) {
  auto group = require(group_name, "reduce_scatter");
  group->reduce_scatter(output, inputs, op).wait();
}

void CollectiveContext::alltoall(std::vector<Tensor>& outputs,
                                 const std::vector<Tensor>& inputs,
                                 const std::string& group_name) {
  auto group = require(group_name, "alltoall");
  group->alltoall(outputs, inputs).wait();
}

void CollectiveContext::alltoall_single(Tensor& output, const Tensor& input,
                                        const std::string& group_name) {
  auto group = require(group_name, "alltoall_single");
  group->alltoall_single(output, input).wait();
}

void CollectiveContext::barrier(const std::string& group_name) {
  auto group = require(group_name, "barrier");
  group->barrier().wait();
}

void CollectiveContext::send(const Tensor& tensor, int dst_rank,
                             const std::string& group_name, int tag) {
  auto group = require(group_name, "send");
  group->send(tensor, dst_rank, tag).wait();
}

void CollectiveContext::recv(Tensor& tensor, int src_rank, const std::string& group_name,
                             int tag) {
  auto group = require(group_name, "recv");
  group->recv(tensor, src_rank, tag).wait();
}

void CollectiveContext::allreduce_multigpu(std::vector<Tensor>& tensors,
                                           const std::string& group_name, ReduceOp op) {
  auto group = require(group_name, "allreduce_multigpu");
  group->allreduce_multigpu(tensors, op).wait();
}

void CollectiveContext::broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank,
                                           int src_tensor,
                                           const std::string& group_name) {
  auto group = require(group_name, "broadcast_multigpu");
  group->broadcast_multigpu(tensors, src_rank, src_tensor).wait();
}

void CollectiveContext::reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank,
                                        int dst_tensor, const std::string& group_name,
                                        ReduceOp op) {
  auto group = require(group_name, "reduce_multigpu");
  group->reduce_multigpu(tensors, dst_rank, dst_tensor, op).wait();
}

void CollectiveContext::allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                                           const std::vector<Tensor>& inputs,
                                           const std::string& group_name) {
  auto group = require(group_name, "allgather_multigpu");
  group->allgather_multigpu(outputs, inputs).wait();
}

void CollectiveContext::reduce_scatter_multigpu(
    std::vector<Tensor>& outputs, const std::vector<std::vector<Tensor>>& inputs,
    const std::string& group_name, ReduceOp op) {
  auto group = require(group_name, "reduce_scatter_multigpu");
  group->reduce_scatter_multigpu(outputs, inputs, op).wait();
}

void CollectiveContext::send_multigpu(const Tensor& tensor, int dst_rank,
                                      int dst_gpu_index, const std::string& group_name,
                                      int tag) {
  auto group = require(group_name, "send_multigpu");
  group->send_multigpu(tensor, dst_rank, dst_gpu_index, tag).wait();
}

void CollectiveContext::recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                                      const std::string& group_name, int tag) {
  auto group = require(group_name, "recv_multigpu");
  group->recv_multigpu(tensor, src_rank, src_gpu_index, tag).wait();
}

// The free functions: the global context's methods.

void init_collective_group(int world_size, int rank, std::string_view backend,
                           const std::string& group_name, GroupTimeout timeout,
                           std::shared_ptr<Store> store) {
  CollectiveContext::global().init_collective_group(world_size, rank, backend, group_name,
                                                    timeout, std::move(store));
}
void create_collective_group(const GroupSpec& spec, std::shared_ptr<Store> store) {
  CollectiveContext::global().create_collective_group(spec, std::move(store));
}
bool destroy_collective_group(const std::string& group_name) {
  return CollectiveContext::global().destroy_collective_group(group_name);
}
bool is_group_initialized(const std::string& group_name) {
  return CollectiveContext::global().is_group_initialized(group_name);
}
int get_rank(const std::string& group_name) {
  return CollectiveContext::global().get_rank(group_name);
}
int get_collective_group_size(const std::string& group_name) {
  return CollectiveContext::global().get_collective_group_size(group_name);
}
void allreduce(Tensor& tensor, const std::string& group_name, ReduceOp op) {
  CollectiveContext::global().allreduce(tensor, group_name, op);
}
void broadcast(Tensor& tensor, int src_rank, const std::string& group_name) {
  CollectiveContext::global().broadcast(tensor, src_rank, group_name);
}
void reduce(Tensor& tensor, int dst_rank, const std::string& group_name, ReduceOp op) {
  CollectiveContext::global().reduce(tensor, dst_rank, group_name, op);
}
void allgather(std::vector<Tensor>& outputs, const Tensor& input,
               const std::string& group_name) {
  CollectiveContext::global().allgather(outputs, input, group_name);
}
void gather(std::vector<Tensor>& outputs, const Tensor& input, int dst_rank,
            const std::string& group_name) {
  CollectiveContext::global().gather(outputs, input, dst_rank, group_name);
}
void scatter(Tensor& output, const std::vector<Tensor>& inputs, int src_rank,
             const std::string& group_name) {
  CollectiveContext::global().scatter(output, inputs, src_rank, group_name);
}
void reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                    const std::string& group_name, ReduceOp op) {
  CollectiveContext::global().reduce_scatter(output, inputs, group_name, op);
}
void alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
              const std::string& group_name) {
  CollectiveContext::global().alltoall(outputs, inputs, group_name);
}
void alltoall_single(Tensor& output, const Tensor& input, const std::string& group_name) {
  CollectiveContext::global().alltoall_single(output, input, group_name);
}
void barrier(const std::string& group_name) {
  CollectiveContext::global().barrier(group_name);
}
void send(const Tensor& tensor, int dst_rank, const std::string& group_name, int tag) {
  CollectiveContext::global().send(tensor, dst_rank, group_name, tag);
}
void recv(Tensor& tensor, int src_rank, const std::string& group_name, int tag) {
  CollectiveContext::global().recv(tensor, src_rank, group_name, tag);
}
void allreduce_multigpu(std::vector<Tensor>& tensors, const std::string& group_name,
                        ReduceOp op) {
  CollectiveContext::global().allreduce_multigpu(tensors, group_name, op);
}
void broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank, int src_tensor,
                        const std::string& group_name) {
  CollectiveContext::global().broadcast_multigpu(tensors, src_rank, src_tensor,
                                                 group_name);
}
void reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank, int dst_tensor,
                     const std::string& group_name, ReduceOp op) {
  CollectiveContext::global().reduce_multigpu(tensors, dst_rank, dst_tensor, group_name,
                                              op);
}
void allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                        const std::vector<Tensor>& inputs,
                        const std::string& group_name) {
  CollectiveContext::global().allgather_multigpu(outputs, inputs, group_name);
}
void reduce_scatter_multigpu(std::vector<Tensor>& outputs,
                             const std::vector<std::vector<Tensor>>& inputs,
                             const std::string& group_name, ReduceOp op) {
  CollectiveContext::global().reduce_scatter_multigpu(outputs, inputs, group_name, op);
}
void send_multigpu(const Tensor& tensor, int dst_rank, int dst_gpu_index,
                   const std::string& group_name, int tag) {
  CollectiveContext::global().send_multigpu(tensor, dst_rank, dst_gpu_index, group_name,
                                            tag);
}
void recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                   const std::string& group_name, int tag) {
  CollectiveContext::global().recv_multigpu(tensor, src_rank, src_gpu_index, group_name,
                                            tag);
}

}  // namespace switchboard::collective
