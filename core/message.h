// Message: what agents carry between workers.
//
// A request names a registered function and carries its arguments; a
// response carries the result; an error response carries a RemoteError
// (the remote worker's name, the exception's type and message). The body is
// msgpack (core/serialize.h); tensors never go through msgpack: the body
// holds their descriptors (index into `tensors`), and agents move the bytes
// out of band.
//
// Thread safety: a value type; no internal synchronization.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace switchboard {

enum class MessageType : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kError = 3,  // payload: encode_remote_error() (core/serialize.h)
  // Transport-level, for backends that carry Future::cancel() to the
  // callee in their own messages (PROCESS_GROUP): the caller no longer
  // waits for request `id`. Nothing else is set. Never handed to a
  // request handler nor to a caller's future.
  kCancel = 4,
};

struct Message {
  MessageType type = MessageType::kRequest;
  // Set by the agent on send; a response carries its request's id.
  uint64_t id = 0;
  // Requests: the registered function's name. Empty otherwise.
  std::string function;
  // Requests: the caller's timeout in ms (0: none), which the callee counts
  // from the request's arrival: the call's deadline there
  // (rpc/call_context.h). Set by RpcContext; agents carry it.
  uint64_t timeout_ms = 0;
  // msgpack body (arguments, result or error).
  std::vector<uint8_t> payload;
  // Out-of-band tensors referenced from the body, in order. CPU tensors are
  // contiguous when they travel (agents make them so or refuse).
  std::vector<Tensor> tensors;
};

// The RRef protocol's reference counting (rpc/rref_table.h): requests the
// library sends on its own, never refused by the limit on one caller's
// requests (max_requests_per_peer), which is for users' calls; a refused
// one would leave a value owned for ever, or free it early.
inline constexpr std::string_view kRRefForkFunction = "__sb_rref_fork";
inline constexpr std::string_view kRRefReleaseFunction = "__sb_rref_release";
inline constexpr std::string_view kRRefDeleteFunction = "__sb_rref_delete";
inline bool is_bookkeeping_request(std::string_view function) {
  return function == kRRefForkFunction || function == kRRefReleaseFunction ||
         function == kRRefDeleteFunction;
}

// A worker of the group: its unique name and its id (the rank in a static
// group; assigned at join in a dynamic one).
struct WorkerInfo {
  std::string name;
  int id = -1;

  friend bool operator==(const WorkerInfo&, const WorkerInfo&) = default;
};

}  // namespace switchboard

// The RPC layer's names for them, as rpc/ and code written against
// switchboard::rpc use them.
namespace switchboard::rpc {
using switchboard::is_bookkeeping_request;
using switchboard::kRRefDeleteFunction;
using switchboard::kRRefForkFunction;
using switchboard::kRRefReleaseFunction;
using switchboard::Message;
using switchboard::MessageType;
using switchboard::WorkerInfo;
}  // namespace switchboard::rpc
