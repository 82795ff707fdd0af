#include "rpc/rref_payload.h"

#include <fmt/format.h>

#include <vector>

#include "common/error.h"
#include "core/tensor.h"

namespace switchboard::rpc::detail {

void repack(PayloadPacker& packer, const msgpack::object& o, const ExtRewrite& rewrite) {
  switch (o.type) {
    case msgpack::type::ARRAY:
      packer.pack_array(o.via.array.size);
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        repack(packer, o.via.array.ptr[i], rewrite);
      }
      return;
    case msgpack::type::MAP:
      packer.pack_map(o.via.map.size);
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        repack(packer, o.via.map.ptr[i].key, rewrite);
        repack(packer, o.via.map.ptr[i].val, rewrite);
      }
      return;
    case msgpack::type::EXT:
      if (rewrite(packer, o)) return;
      [[fallthrough]];
    default:
      packer.pack(o);
  }
}

void for_each_ext(const msgpack::object& o, int8_t type,
                  const std::function<void(const msgpack::object&)>& f) {
  if (o.type == msgpack::type::ARRAY) {
    for (uint32_t i = 0; i < o.via.array.size; ++i) for_each_ext(o.via.array.ptr[i], type, f);
  } else if (o.type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      for_each_ext(o.via.map.ptr[i].key, type, f);
      for_each_ext(o.via.map.ptr[i].val, type, f);
    }
  } else if (o.type == msgpack::type::EXT && o.via.ext.type() == type) {
    f(o);
  }
}

namespace {

// Packs `o` with every tensor descriptor's index moved up by `shift`.
void pack_shifted(PayloadPacker& packer, const msgpack::object& o, uint64_t shift) {
  repack(packer, o, [shift](PayloadPacker& out, const msgpack::object& ext) {
    if (ext.via.ext.type() != kTensorExtType || shift == 0) return false;
    msgpack::object_handle body = msgpack::unpack(ext.via.ext.data(), ext.via.ext.size);
    const msgpack::object& d = body.get();
    if (d.type != msgpack::type::ARRAY || d.via.array.size != 3) {
      throw SerializationError("a tensor descriptor is not [index, dtype, shape]");
    }
    std::vector<uint8_t> bytes;
    PayloadWriter writer{&bytes};
    PayloadPacker inner(writer);
    inner.pack_array(3);
    inner.pack(d.via.array.ptr[0].as<uint64_t>() + shift);
    inner.pack(d.via.array.ptr[1]);
    inner.pack(d.via.array.ptr[2]);
    out.pack_ext(bytes.size(), kTensorExtType);
    out.pack_ext_body(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return true;
  });
}

}  // namespace

Message value_first(const Message& value, const Message& args) {
  msgpack::object_handle handle =
      unpack_payload(args.payload, arguments_what(args.function));
  const msgpack::object& received = handle.get();
  if (received.type != msgpack::type::ARRAY) {
    throw SerializationError(fmt::format("arguments of function \"{}\": expected an array, "
                                         "received {}",
                                         args.function, received_type_name(received)));
  }
  Message out;
  out.type = MessageType::kRequest;
  out.id = args.id;
  out.function = args.function;
  out.timeout_ms = args.timeout_ms;
  PayloadWriter writer{&out.payload};
  PayloadPacker packer(writer);
  packer.pack_array(received.via.array.size + 1);
  writer.write(reinterpret_cast<const char*>(value.payload.data()), value.payload.size());
  for (uint32_t i = 0; i < received.via.array.size; ++i) {
    pack_shifted(packer, received.via.array.ptr[i], value.tensors.size());
  }
  out.tensors = value.tensors;
  out.tensors.insert(out.tensors.end(), args.tensors.begin(), args.tensors.end());
  return out;
}

}  // namespace switchboard::rpc::detail
