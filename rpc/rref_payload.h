// How the RRef protocol rewrites payloads (msgpack, core/serialize.h): the
// call on an owner's value, with the value first, and walks over the ext
// values (tensors, RRefs) in a payload. Internal to the RPC layer
// (rpc/rref_table.h); pure functions.
#pragma once

#include <cstdint>
#include <functional>

#include "core/message.h"
#include "core/serialize.h"

namespace switchboard::rpc::detail {

using PayloadPacker = msgpack::packer<PayloadWriter>;

// Packs `o`, handing each ext value to `rewrite` first: when it returns
// true, it packed that value (in its own way) itself.
using ExtRewrite = std::function<bool(PayloadPacker&, const msgpack::object&)>;
void repack(PayloadPacker& packer, const msgpack::object& o, const ExtRewrite& rewrite);

// Calls `f` on every ext value of type `type` in `o`, in packing order.
void for_each_ext(const msgpack::object& o, int8_t type,
                  const std::function<void(const msgpack::object&)>& f);

// The request that calls `args.function` with `value` first: the value's
// payload, then the arguments', their tensors after the value's (their
// descriptors' indices moved up). Throws SerializationError when the
// arguments are no array or a tensor descriptor is malformed.
Message value_first(const Message& value, const Message& args);

}  // namespace switchboard::rpc::detail
