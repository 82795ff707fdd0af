#include "core/remote_error.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <typeinfo>

#include "common/check.h"
#include "core/serialize.h"

namespace switchboard {
namespace {

constexpr ErrorCode kAllCodes[] = {
    ErrorCode::kNotFound,    ErrorCode::kDeadlineExceeded,
    ErrorCode::kUnavailable, ErrorCode::kResourceExhausted,
    ErrorCode::kCancelled,   ErrorCode::kFailedPrecondition,
    ErrorCode::kRegistry,    ErrorCode::kUnauthenticated,
    ErrorCode::kPermissionDenied, ErrorCode::kInternal,
};

std::optional<ErrorCode> parse_code(std::string_view name) {
  for (ErrorCode code : kAllCodes) {
    if (error_code_name(code) == name) return code;
  }
  return std::nullopt;
}

// The string at `key` in an error map.
std::string string_field(const msgpack::object& map, std::string_view key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && kv.key.as<std::string_view>() == key) {
      if (kv.val.is_nil()) return {};
      if (kv.val.type != msgpack::type::STR) {
        throw SerializationError(fmt::format("error payload: \"{}\" is {}, not str", key,
                                             received_type_name(kv.val)));
      }
      return kv.val.as<std::string>();
    }
  }
  if (key == "code") return {};
  throw SerializationError(fmt::format("error payload: no \"{}\"", key));
}

}  // namespace

rpc::RemoteError::RemoteError(std::string worker, std::string type_name,
                              std::string message, ErrorCode code)
    : Error(code, fmt::format("worker \"{}\" raised {}: {}", worker, type_name, message)),
      worker_(std::move(worker)),
      type_name_(std::move(type_name)),
      remote_message_(std::move(message)) {}

ExceptionInfo describe_exception(std::exception_ptr error) {
  SB_REQUIRE(error != nullptr, "describe_exception: null exception_ptr");
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return {demangle(typeid(e).name()), e.what(), e.code()};
  } catch (const std::exception& e) {
    return {demangle(typeid(e).name()), e.what(), std::nullopt};
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    return {type ? demangle(type->name()) : std::string("unknown"),
            "(not a std::exception)", std::nullopt};
  }
}

void encode_remote_error(Message& m, std::string_view worker, std::string_view type_name,
                         std::string_view message, std::optional<ErrorCode> code) {
  std::vector<uint8_t> payload;
  detail::PayloadWriter writer{&payload};
  msgpack::packer<detail::PayloadWriter> packer(writer);
  packer.pack_map(4);
  packer.pack("worker");
  packer.pack(worker);
  packer.pack("type");
  packer.pack(type_name);
  packer.pack("message");
  packer.pack(message);
  packer.pack("code");
  if (code) {
    packer.pack(error_code_name(*code));
  } else {
    packer.pack_nil();
  }
  m.type = MessageType::kError;
  m.payload = std::move(payload);
  m.tensors.clear();
}

void encode_remote_error(Message& m, std::string_view worker, std::exception_ptr error) {
  ExceptionInfo info = describe_exception(error);
  encode_remote_error(m, worker, info.type_name, info.message, info.code);
}

RemoteError decode_remote_error(const Message& m) {
  msgpack::object_handle handle = detail::unpack_payload(m.payload, "error payload");
  const msgpack::object& o = handle.get();
  if (o.type != msgpack::type::MAP) {
    throw SerializationError(
        fmt::format("error payload: expected a map, received {}", received_type_name(o)));
  }
  // One field at a time: a missing one is reported in this order.
  std::string worker = string_field(o, "worker");
  std::string type = string_field(o, "type");
  std::string message = string_field(o, "message");
  std::optional<ErrorCode> code = parse_code(string_field(o, "code"));
  return RemoteError(std::move(worker), std::move(type), std::move(message),
                     code.value_or(ErrorCode::kFailedPrecondition));
}

}  // namespace switchboard
