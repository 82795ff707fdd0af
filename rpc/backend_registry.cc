#include "rpc/backend_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::rpc {

class BackendRegistryAccess {
 public:
  static BackendType make(std::string name) { return BackendType(std::move(name)); }
};

namespace {

std::string upper(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

struct Entry {
  ConstructOptionsHandler construct_options;
  InitBackendHandler init_backend;
};

class Registry {
 public:
  static Registry& instance() {
    static Registry registry;
    return registry;
  }

  void set_builtins(void (*registrar)()) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    builtins_ = registrar;
  }

  BackendType add(std::string_view name, Entry entry) SB_EXCLUDES(mu_) {
    ensure_builtins();
    return insert(name, std::move(entry));
  }

  std::optional<Entry> find(std::string_view name) SB_EXCLUDES(mu_) {
    ensure_builtins();
    MutexLock lock(mu_);
    auto it = entries_.find(upper(name));
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<std::string> names() SB_EXCLUDES(mu_) {
    ensure_builtins();
    MutexLock lock(mu_);
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }

  [[noreturn]] void unknown(std::string_view name) SB_EXCLUDES(mu_) {
    throw RegistryError(fmt::format("RPC backend {}: not registered (registered: {})",
                                    upper(name), fmt::join(names(), ", ")));
  }

 private:
  // Runs the installed registrar, once, outside mu_ (it calls add(), which
  // must not wait for it to finish). A registrar installed after the
  // registry was first consulted runs at the next consult; one that already
  // ran never runs again. (A registrar's add() calls come back here with
  // registrar_mu_ held, and return at once.)
  void ensure_builtins() SB_EXCLUDES(mu_) {
    static thread_local bool in_registrar = false;
    if (in_registrar) return;
    MutexLock serial(registrar_mu_);
    void (*registrar)() = nullptr;
    {
      MutexLock lock(mu_);
      registrar = builtins_;
      builtins_ = nullptr;
      if (registrar == nullptr || !ran_.insert(registrar).second) return;
    }
    in_registrar = true;
    try {
      registrar();
    } catch (...) {
      in_registrar = false;
      throw;
    }
    in_registrar = false;
  }

  // Adds `entry` (takes mu_).
  BackendType insert(std::string_view name, Entry entry) SB_EXCLUDES(mu_) {
    SB_REQUIRE(!name.empty(), "register_backend: the backend name is empty");
    SB_REQUIRE(entry.construct_options != nullptr,
               "register_backend(\"{}\"): construct_options_handler is empty", name);
    SB_REQUIRE(entry.init_backend != nullptr,
               "register_backend(\"{}\"): init_backend_handler is empty", name);
    std::string key = upper(name);
    MutexLock lock(mu_);
    if (entries_.count(key) != 0) {
      throw RegistryError(fmt::format("RPC backend {}: already registered", key));
    }
    entries_.emplace(key, std::move(entry));
    return BackendRegistryAccess::make(std::move(key));
  }

  Mutex mu_;
  std::map<std::string, Entry> entries_ SB_GUARDED_BY(mu_);
  void (*builtins_)() SB_GUARDED_BY(mu_) = nullptr;  // not yet run
  std::set<void (*)()> ran_ SB_GUARDED_BY(mu_);
  Mutex registrar_mu_;  // held while a registrar runs
};

}  // namespace

ExtrasReader::ExtrasReader(std::string backend, const Extras& extras)
    : backend_(std::move(backend)), extras_(extras) {}

std::optional<std::string> ExtrasReader::get(const std::string& key) {
  known_.insert(key);
  auto it = extras_.find(key);
  if (it == extras_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> ExtrasReader::get_int(const std::string& key) {
  auto text = get(key);
  if (!text) return std::nullopt;
  int64_t value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  SB_REQUIRE(ec == std::errc() && ptr == end && !text->empty(),
             "RPC backend \"{}\": option \"{}\" must be an integer, got \"{}\"", backend_,
             key, *text);
  return value;
}

std::optional<bool> ExtrasReader::get_bool(const std::string& key) {
  auto text = get(key);
  if (!text) return std::nullopt;
  if (*text == "true" || *text == "1") return true;
  if (*text == "false" || *text == "0") return false;
  throw std::invalid_argument(
      fmt::format("RPC backend \"{}\": option \"{}\" must be true/false/1/0, got \"{}\"",
                  backend_, key, *text));
}

void ExtrasReader::finish() const {
  for (const auto& [key, value] : extras_) {
    if (known_.count(key) == 0) {
      throw std::invalid_argument(
          fmt::format("RPC backend \"{}\": unknown option \"{}\" (known: {})", backend_,
                      key, fmt::join(known_, ", ")));
    }
  }
}

BackendType register_backend(std::string_view name,
                             ConstructOptionsHandler construct_options_handler,
                             InitBackendHandler init_backend_handler) {
  return Registry::instance().add(
      name, Entry{std::move(construct_options_handler), std::move(init_backend_handler)});
}

bool backend_registered(std::string_view name) {
  return Registry::instance().find(name).has_value();
}

BackendType backend_type(std::string_view name) {
  if (!Registry::instance().find(name)) Registry::instance().unknown(name);
  return BackendRegistryAccess::make(upper(name));
}

std::vector<BackendType> registered_backends() {
  std::vector<BackendType> out;
  for (auto& name : Registry::instance().names()) {
    out.push_back(BackendRegistryAccess::make(std::move(name)));
  }
  return out;
}

std::shared_ptr<RpcBackendOptions> construct_rpc_backend_options(
    const BackendType& backend, std::chrono::milliseconds rpc_timeout,
    const std::string& init_method, const Extras& extras) {
  SB_REQUIRE(rpc_timeout.count() >= 0,
             "construct_rpc_backend_options({}): rpc_timeout must be >= 0 ms, got {}",
             backend.name(), rpc_timeout.count());
  auto entry = Registry::instance().find(backend.name());
  if (!entry) Registry::instance().unknown(backend.name());
  auto options = entry->construct_options(rpc_timeout, init_method, extras);
  SB_ASSERT(options != nullptr, "RPC backend {}: options handler returned null",
            backend.name());
  return options;
}

std::unique_ptr<RpcAgent> init_backend(const BackendType& backend,
                                       const BackendInit& init) {
  auto entry = Registry::instance().find(backend.name());
  if (!entry) Registry::instance().unknown(backend.name());
  auto agent = entry->init_backend(init);
  SB_ASSERT(agent != nullptr, "RPC backend {}: init_backend_handler returned null",
            backend.name());
  return agent;
}

void set_builtin_backends(void (*registrar)()) { Registry::instance().set_builtins(registrar); }

}  // namespace switchboard::rpc
