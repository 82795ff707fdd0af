// The collective backend registry, modeled on Ray's
// `ray.util.collective.register_collective_backend`.
//
// A backend is a name, a factory that builds one rank's ProcessGroup from a
// GroupInit, and an availability check ("can this backend run here, and if
// not, why"). Named groups (groups.h) look backends up here by name.
//
// Names are case-insensitive: every name is normalized to upper case
// ("gloo", "Gloo" and "GLOO" are one backend) and reported upper case.
//
// Built-ins, registered before the registry is first consulted (by any of
// the functions below, registration included), without the user doing
// anything; the list lives in one function in registry.cc:
//   GLOO  CPU tensors; builds a GlooProcessGroup from the GroupInit's store,
//         rank, size, group name and timeout. The address it binds:
//         GlooProcessGroup's rules (SWITCHBOARD_IFNAME, its older aliases,
//         then the address that routes to the store; see
//         collective/gloo_process_group.h).
//         Always available.
//   NCCL  CUDA tensors; delegates to detail::nccl_hook(), which
//         //collective:nccl fills when it is linked into the binary. Without
//         it the backend stays registered (so the name is known and the
//         error is clear) but unavailable: "NCCL backend not linked into this
//         binary (depend on //collective:nccl)"; with it, the hook decides
//         (e.g. "no CUDA device").
//
// Errors: RegistryError for a duplicate registration or an unknown name
// (both name the backend; an unknown name also lists the registered ones);
// Error(kFailedPrecondition) when a registered backend is unavailable here
// (names the backend and the reason); std::invalid_argument for an empty
// name or an empty factory.
//
// Thread safety: every function is thread-safe. Factories and availability
// checks are called without the registry's lock held, so they may use the
// registry themselves. Backends cannot be unregistered (as in Ray and
// PyTorch); registrations last until the process exits.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"

namespace switchboard::collective {

// Builds one rank's ProcessGroup. Must return a group whose rank(), size()
// and name() equal the GroupInit's, or throw. `init.store` is valid during
// the call only.
using BackendFactory = std::function<std::unique_ptr<ProcessGroup>(const GroupInit&)>;
// True when the backend can run in this process; otherwise false with
// *why_not set to a short reason ("no CUDA device"). `why_not` is never null.
using BackendAvailability = std::function<bool(std::string* why_not)>;

struct CollectiveBackend {
  std::string name;  // upper case
  BackendFactory create;
  BackendAvailability available;  // never empty once registered
};

// The upper-case form of a backend name ("gloo" -> "GLOO"). ASCII only.
std::string normalize_backend_name(std::string_view name);

// Registers `name` (normalized to upper case). An empty `available` means
// "always available". Throws RegistryError
//   collective backend "GLOO" is already registered
// when the name is taken (built-ins count), std::invalid_argument when the
// name or the factory is empty.
void register_collective_backend(std::string_view name, BackendFactory factory,
                                 BackendAvailability available = {});

// Whether `name` (any case) is registered.
bool is_collective_backend_registered(std::string_view name);

// The registered names, upper case, sorted.
std::vector<std::string> registered_collective_backends();

// Whether `name` is registered and its availability check passes. When it
// returns false and `why_not` is non-null, *why_not says why (for an
// unknown name: that it is not registered, listing the registered ones).
// An availability check that throws counts as unavailable, with the
// exception's message as the reason.
bool is_collective_backend_available(std::string_view name,
                                     std::string* why_not = nullptr);

// The registered, available backend called `name` (a copy). Throws
// RegistryError when unknown:
//   unknown collective backend "FOO" (registered: "GLOO", "NCCL")
// and Error(kFailedPrecondition) when unavailable:
//   collective backend "NCCL" is not available here: no CUDA device
[[nodiscard]] CollectiveBackend require_collective_backend(std::string_view name);

// require_collective_backend(name).create(init), checking that the result
// is a non-null group with the GroupInit's rank and size (otherwise
// Error(kInternal) naming the backend). Exceptions of the factory propagate
// unchanged.
std::unique_ptr<ProcessGroup> create_process_group(std::string_view backend,
                                                   const GroupInit& init);

}  // namespace switchboard::collective
