// Object collectives, as torch.distributed has them: all_gather_object,
// broadcast_object_list, gather_object and scatter_object_list, for any
// value core/serialize.h encodes (numbers, strings, containers, user structs
// with MSGPACK_DEFINE, WorkerInfo), over any ProcessGroup whose tensors live
// on the CPU (GLOO). They block until done, as torch's do.
//
//   std::vector<std::string> names = col::all_gather_object(group, my_name);
//
// Each value travels as its msgpack bytes in a uint8 tensor: first every
// rank's length, then the bytes, padded to the longest. Tensors inside a
// value are refused (std::invalid_argument): send them with the tensor
// collectives.
//
// Errors: what the group's ops throw (TimeoutError, ConnectionError,
// Error(kFailedPrecondition) when the ranks disagree on the op); a value
// that does not decode as T throws SerializationError naming both types.
// Thread safety: as the group's ops (one thread issues a group's ops).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collective/process_group.h"
#include "common/check.h"
#include "core/message.h"
#include "core/serialize.h"

namespace switchboard::collective {

namespace detail {
// The byte-level exchanges the templates below are built on.
std::vector<std::vector<uint8_t>> allgather_bytes(ProcessGroup& group,
                                                  const std::vector<uint8_t>& mine);
std::vector<uint8_t> broadcast_bytes(ProcessGroup& group, const std::vector<uint8_t>& mine,
                                     int src);
std::vector<uint8_t> scatter_bytes(ProcessGroup& group,
                                   const std::vector<std::vector<uint8_t>>& inputs, int src);

template <typename T>
std::vector<uint8_t> to_bytes(const T& value, std::string_view what) {
  rpc::Message m;
  rpc::encode_result(m, value);
  SB_REQUIRE(m.tensors.empty(),
             "{}: the value holds {} tensor(s); object collectives carry values without "
             "tensors (send tensors with the tensor collectives)",
             what, m.tensors.size());
  return std::move(m.payload);
}

template <typename T>
T from_bytes(std::vector<uint8_t> bytes, std::string_view what) {
  rpc::Message m;
  m.type = rpc::MessageType::kResponse;
  m.payload = std::move(bytes);
  return rpc::decode_result<T>(m, what);
}
}  // namespace detail

// Every rank's `value`, by rank.
template <typename T>
std::vector<T> all_gather_object(ProcessGroup& group, const T& value) {
  std::vector<T> out;
  for (auto& bytes : detail::allgather_bytes(group, detail::to_bytes(value, "all_gather_object"))) {
    out.push_back(detail::from_bytes<T>(std::move(bytes), "all_gather_object"));
  }
  return out;
}

// Every rank's `objects` become `src`'s (torch: broadcast_object_list).
template <typename T>
void broadcast_object_list(ProcessGroup& group, std::vector<T>& objects, int src) {
  std::vector<uint8_t> mine;
  if (group.rank() == src) mine = detail::to_bytes(objects, "broadcast_object_list");
  objects = detail::from_bytes<std::vector<T>>(detail::broadcast_bytes(group, mine, src),
                                               "broadcast_object_list");
}

// Every rank's `value`, by rank, on `dst`; nullopt elsewhere.
template <typename T>
std::optional<std::vector<T>> gather_object(ProcessGroup& group, const T& value, int dst) {
  checks::rank("gather_object", dst, group.size(), "dst");
  std::vector<T> all = all_gather_object(group, value);
  if (group.rank() != dst) return std::nullopt;
  return all;
}

// Rank r gets inputs[r] of `src` (ignored elsewhere; size() values on src).
template <typename T>
T scatter_object_list(ProcessGroup& group, const std::vector<T>& inputs, int src) {
  std::vector<std::vector<uint8_t>> encoded;
  if (group.rank() == src) {
    SB_REQUIRE(static_cast<int>(inputs.size()) == group.size(),
               "scatter_object_list: rank {} gives {} values for a group of {}", src,
               inputs.size(), group.size());
    for (const T& v : inputs) encoded.push_back(detail::to_bytes(v, "scatter_object_list"));
  }
  return detail::from_bytes<T>(detail::scatter_bytes(group, encoded, src),
                               "scatter_object_list");
}

}  // namespace switchboard::collective
