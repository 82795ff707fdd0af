#include "core/serialize.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

#include "common/check.h"

namespace switchboard {
namespace {

thread_local std::vector<Tensor>* tls_encode_sink = nullptr;
thread_local const std::vector<Tensor>* tls_decode_table = nullptr;

// Unpacked strings, bins and exts point into the payload instead of being
// copied (the payload outlives the handle; see unpack_payload).
bool reference_everything(msgpack::type::object_type, std::size_t, void*) { return true; }

// Appends `name` to `names` unless it is there already.
void add_unique(std::vector<std::string>& names, std::string name) {
  for (const auto& n : names) {
    if (n == name) return;
  }
  names.push_back(std::move(name));
}

std::string joined_with(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// received_type_name, bounded in depth so that hostile nesting stays cheap.
std::string received_name(const msgpack::object& o, int depth) {
  if (depth > 8) return "...";
  switch (o.type) {
    case msgpack::type::NIL:
      return "nil";
    case msgpack::type::BOOLEAN:
      return "bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER:
      return "int";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return "float";
    case msgpack::type::STR:
      return "str";
    case msgpack::type::BIN:
      return "bin";
    case msgpack::type::EXT:
      if (o.via.ext.type() == kTensorExtType) return "tensor";
      if (o.via.ext.type() == 2) return "rref";  // kRRefExtType (rpc/rref.h)
      return fmt::format("ext({})", o.via.ext.type());
    case msgpack::type::ARRAY: {
      std::vector<std::string> names;
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        add_unique(names, received_name(o.via.array.ptr[i], depth + 1));
      }
      return "list[" + joined_with(names, " | ") + "]";
    }
    case msgpack::type::MAP: {
      if (o.via.map.size == 0) return "dict[]";
      std::vector<std::string> keys, values;
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        add_unique(keys, received_name(o.via.map.ptr[i].key, depth + 1));
        add_unique(values, received_name(o.via.map.ptr[i].val, depth + 1));
      }
      return "dict[" + joined_with(keys, " | ") + ", " + joined_with(values, " | ") + "]";
    }
  }
  return "?";
}

// The descriptor inside a tensor ext value.
struct Descriptor {
  uint64_t index = 0;
  std::string dtype;
  Tensor::Shape shape;
};

Descriptor parse_descriptor(const msgpack::object& ext) {
  try {
    msgpack::object_handle handle =
        msgpack::unpack(ext.via.ext.data(), ext.via.ext.size, reference_everything,
                        nullptr, msgpack::unpack_limit(64, 0, 64, 0, 0, 3));
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) {
      throw SerializationError("not an array of 3");
    }
    Descriptor d;
    o.via.array.ptr[0].convert(d.index);
    o.via.array.ptr[1].convert(d.dtype);
    o.via.array.ptr[2].convert(d.shape);
    return d;
  } catch (const std::exception& e) {
    throw SerializationError(fmt::format("malformed tensor descriptor: {}", e.what()));
  }
}

}  // namespace

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

std::string received_type_name(const msgpack::object& o) { return received_name(o, 0); }

void encode_result(Message& m) {
  m.payload.clear();
  m.tensors.clear();
  detail::PayloadWriter writer{&m.payload};
  msgpack::packer<detail::PayloadWriter>(writer).pack_nil();
}

namespace detail {

TensorEncodeScope::TensorEncodeScope(std::vector<Tensor>* tensors)
    : previous_(tls_encode_sink) {
  tls_encode_sink = tensors;
}
TensorEncodeScope::~TensorEncodeScope() { tls_encode_sink = previous_; }

TensorDecodeScope::TensorDecodeScope(const std::vector<Tensor>* tensors)
    : previous_(tls_decode_table) {
  tls_decode_table = tensors;
}
TensorDecodeScope::~TensorDecodeScope() { tls_decode_table = previous_; }

std::string record_tensor(const Tensor& t) {
  SB_REQUIRE(tls_encode_sink != nullptr,
             "a Tensor can only be serialized by encode_args/encode_result "
             "(core/serialize.h), which record it in Message::tensors");
  SB_REQUIRE(t.defined(),
             "cannot serialize an undefined tensor (use std::optional<Tensor> for no "
             "tensor)");
  Tensor recorded = (t.device().is_cpu() && !t.is_contiguous()) ? t.clone() : t;
  msgpack::sbuffer body;
  msgpack::packer<msgpack::sbuffer> packer(body);
  packer.pack_array(3);
  packer.pack(static_cast<uint64_t>(tls_encode_sink->size()));
  packer.pack(std::string(dtype_name(recorded.dtype())));
  packer.pack(recorded.shape());
  tls_encode_sink->push_back(std::move(recorded));
  return std::string(body.data(), body.size());
}

Tensor resolve_tensor(const msgpack::object& o) {
  if (o.type != msgpack::type::EXT || o.via.ext.type() != kTensorExtType) {
    throw msgpack::type_error();
  }
  SB_REQUIRE(tls_decode_table != nullptr,
             "a Tensor can only be deserialized by decode_args/decode_result "
             "(core/serialize.h), which read Message::tensors");
  Descriptor d = parse_descriptor(o);
  const std::vector<Tensor>& table = *tls_decode_table;
  if (d.index >= table.size()) {
    throw SerializationError(
        fmt::format("tensor descriptor refers to tensor {} but the message carries {}",
                    d.index, table.size()));
  }
  const Tensor& t = table[d.index];
  if (!t.defined() || dtype_name(t.dtype()) != d.dtype || t.shape() != d.shape) {
    throw SerializationError(
        fmt::format("tensor descriptor {} says {}{} but the message carries {}", d.index,
                    d.dtype, shape_str(d.shape), t.describe()));
  }
  return t;
}

msgpack::object_handle unpack_payload(const std::vector<uint8_t>& payload,
                                      std::string_view what) {
  const char* data = reinterpret_cast<const char*>(payload.data());
  size_t offset = 0;
  msgpack::object_handle handle;
  try {
    msgpack::unpack_limit limit(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
                                0xffffffff, kMaxDepth);
    handle = msgpack::unpack(data, payload.size(), offset, reference_everything, nullptr,
                             limit);
  } catch (const std::exception& e) {
    throw SerializationError(fmt::format("{}: malformed msgpack payload of {} bytes: {}",
                                         what, payload.size(), e.what()));
  }
  if (offset != payload.size()) {
    throw SerializationError(fmt::format("{}: {} unexpected bytes after the payload",
                                         what, payload.size() - offset));
  }
  return handle;
}

void throw_argument_error(std::string_view function,
                          const std::vector<std::string>& expected,
                          const msgpack::object& received) {
  std::string got;
  if (received.type == msgpack::type::ARRAY) {
    std::vector<std::string> names;
    for (uint32_t i = 0; i < received.via.array.size; ++i) {
      names.push_back(received_type_name(received.via.array.ptr[i]));
    }
    got = "(" + join(names) + ")";
  } else {
    got = received_type_name(received) + " (not an array of arguments)";
  }
  throw ArgumentError(fmt::format("function \"{}\" expects ({}), received {}", function,
                                  join(expected), got));
}

void throw_result_error(std::string_view function, std::string_view expected,
                        const msgpack::object& received) {
  throw SerializationError(fmt::format("{}: expected {}, received {}",
                                       result_what(function), expected,
                                       received_type_name(received)));
}

void rethrow_with_context(const SerializationError& e, std::string_view what) {
  throw SerializationError(fmt::format("{}: {}", what, e.what()));
}

std::string arguments_what(std::string_view function) {
  return fmt::format("arguments of function \"{}\"", function);
}

std::string result_what(std::string_view function) {
  return function.empty() ? std::string("result")
                          : fmt::format("result of function \"{}\"", function);
}

std::string join(const std::vector<std::string>& parts) {
  return joined_with(parts, ", ");
}

}  // namespace detail
}  // namespace switchboard
