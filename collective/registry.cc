#include "collective/registry.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::collective {
namespace {

constexpr char kNcclNotLinked[] =
    "NCCL backend not linked into this binary (depend on //collective:nccl)";

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += fmt::format("\"{}\"", name);
  }
  return out.empty() ? "none" : out;
}

std::string unavailable_message(const std::string& name, const std::string& why) {
  return fmt::format("collective backend \"{}\" is not available here: {}", name, why);
}

class Registry {
 public:
  static Registry& instance() {
    static Registry registry;  // built-ins are added by the constructor
    return registry;
  }

  void add(CollectiveBackend backend) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (backends_.count(backend.name) != 0) {
      throw RegistryError(
          fmt::format("collective backend \"{}\" is already registered", backend.name));
    }
    std::string name = backend.name;
    backends_.emplace(std::move(name), std::move(backend));
  }

  std::optional<CollectiveBackend> find(const std::string& name) const SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = backends_.find(name);
    if (it == backends_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<std::string> names() const SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::vector<std::string> out;
    for (const auto& [name, backend] : backends_) out.push_back(name);
    return out;  // std::map keeps them sorted
  }

 private:
  Registry();

  mutable Mutex mu_;
  std::map<std::string, CollectiveBackend> backends_ SB_GUARDED_BY(mu_);
};

std::unique_ptr<ProcessGroup> create_gloo(const GroupInit& init) {
  GlooOptions options;
  options.group_name = init.group_name;
  options.timeout = init.timeout;
  return std::make_unique<GlooProcessGroup>(init.store, init.rank, init.size, options);
}

bool nccl_available(std::string* why_not) {
  const detail::NcclHook& hook = detail::nccl_hook();
  if (!hook.create) {
    *why_not = kNcclNotLinked;
    return false;
  }
  return !hook.available || hook.available(why_not);
}

std::unique_ptr<ProcessGroup> create_nccl(const GroupInit& init) {
  const detail::NcclHook& hook = detail::nccl_hook();
  if (!hook.create) {
    throw Error(ErrorCode::kFailedPrecondition,
                unavailable_message("NCCL", kNcclNotLinked));
  }
  return hook.create(init);
}

// The built-in backends, in one place. Consulted once, before the registry
// answers its first call.
void register_builtin_backends(Registry& registry) {
  registry.add({"GLOO", create_gloo, [](std::string*) { return true; }});
  registry.add({"NCCL", create_nccl, nccl_available});
}

Registry::Registry() { register_builtin_backends(*this); }

// Runs the backend's availability check; a throwing check is unavailable.
bool check_available(const CollectiveBackend& backend, std::string* why_not) {
  std::string why;
  bool ok = false;
  try {
    ok = backend.available(&why);
  } catch (const std::exception& e) {
    why = fmt::format("its availability check threw: {}", e.what());
  }
  if (!ok && why.empty()) why = "its availability check gave no reason";
  if (!ok && why_not != nullptr) *why_not = why;
  return ok;
}

std::string unknown_message(const std::string& name) {
  return fmt::format("unknown collective backend \"{}\" (registered: {})", name,
                     quoted_list(Registry::instance().names()));
}

}  // namespace

std::string normalize_backend_name(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

void register_collective_backend(std::string_view name, BackendFactory factory,
                                 BackendAvailability available) {
  if (name.empty()) {
    throw std::invalid_argument("register_collective_backend: the name is empty");
  }
  std::string upper = normalize_backend_name(name);
  if (!factory) {
    throw std::invalid_argument(
        fmt::format("register_collective_backend(\"{}\"): the factory is empty", upper));
  }
  if (!available) available = [](std::string*) { return true; };
  Registry::instance().add({upper, std::move(factory), std::move(available)});
}

bool is_collective_backend_registered(std::string_view name) {
  return Registry::instance().find(normalize_backend_name(name)).has_value();
}

std::vector<std::string> registered_collective_backends() {
  return Registry::instance().names();
}

bool is_collective_backend_available(std::string_view name, std::string* why_not) {
  std::string upper = normalize_backend_name(name);
  std::optional<CollectiveBackend> backend = Registry::instance().find(upper);
  if (!backend) {
    if (why_not != nullptr) *why_not = unknown_message(upper);
    return false;
  }
  return check_available(*backend, why_not);
}

CollectiveBackend require_collective_backend(std::string_view name) {
  std::string upper = normalize_backend_name(name);
  std::optional<CollectiveBackend> backend = Registry::instance().find(upper);
  if (!backend) throw RegistryError(unknown_message(upper));
  std::string why;
  if (!check_available(*backend, &why)) {
    throw Error(ErrorCode::kFailedPrecondition, unavailable_message(upper, why));
  }
  return std::move(*backend);
}

std::unique_ptr<ProcessGroup> create_process_group(std::string_view backend,
                                                   const GroupInit& init) {
  CollectiveBackend chosen = require_collective_backend(backend);
  std::unique_ptr<ProcessGroup> group = chosen.create(init);
  if (group == nullptr || group->rank() != init.rank || group->size() != init.size) {
    throw Error(ErrorCode::kInternal,
                fmt::format("collective backend \"{}\" built {} for group \"{}\" "
                            "(expected rank {} of {})",
                            chosen.name,
                            group == nullptr ? std::string("no process group")
                                             : fmt::format("rank {} of {}", group->rank(),
                                                           group->size()),
                            init.group_name, init.rank, init.size));
  }
  return group;
}

}  // namespace switchboard::collective
