// Serialization of RPC arguments and results: msgpack-c++ for values,
// tensors out of band.
//
// Wire format (language-neutral; any msgpack library reads it):
//   request payload   one msgpack array, one element per argument
//   response payload  the result as one msgpack value (nil for void)
//   error payload     see core/remote_error.h
// A Tensor anywhere in a value (an argument, a result, or inside a vector,
// map, optional, tuple or user struct) is written as a msgpack ext value of
// type kTensorExtType whose body is the msgpack array
//   [index: uint, dtype: str, shape: array of int]
// (dtype as dtype_name(): "float32", "int64", ...). `index` points into
// Message::tensors, which carries the tensor itself; its bytes never go
// through msgpack (the agent moves them out of band).
//
// Supported C++ types, and their names in error messages (type_name<T>()):
//   bool                                  bool
//   int8_t ... int64_t, uint8_t ... uint64_t  int8 ... int64, uint8 ... uint64
//   float, double                         float32, float64
//   std::string                           str
//   std::vector<uint8_t> (also std::vector<char>, std::vector<std::byte>)
//                                         bytes (msgpack bin)
//   std::vector<T>                        list[T]
//   std::map<K, V>, std::unordered_map<K, V>  dict[K, V]
//   std::optional<T>                      optional[T] (nil when empty)
//   std::tuple<A...>, std::pair<A, B>     tuple[A, B]
//   Tensor                                tensor
//   rpc::WorkerInfo                       worker_info: the array [name, id]
//   rpc::RRef<T>                          rref[T] (rpc/rref.h)
//   a user struct                         its demangled C++ name, e.g. "ns::Point"
// Note that std::vector<uint8_t> is bytes, never list[uint8]; send many small
// integers as a uint8 Tensor instead.
//
// User structs: give the struct MSGPACK_DEFINE(member, ...) (a msgpack array
// in member order) or MSGPACK_DEFINE_MAP(member, ...) (a map keyed by member
// name), as msgpack-c++ documents, and a default constructor. Include this
// header (not <msgpack.hpp> alone): it declares the Tensor adaptor, so
// Tensor members work too. Any type with a msgpack-c++ adaptor works.
//
// Received types (received_type_name) name what the msgpack value is: nil,
// bool, int, float, str, bin, tensor, ext(N) for other ext types, list[T] for
// an array (T: its elements' names joined by " | ", each once; list[] when
// empty) and dict[K, V] for a map (dict[] when empty).
//
// Floats are always written as msgpack float32/float64, also when they hold
// an integral value (unlike msgpack-c++ 4.1's own packer; see below).
//
// Conversions follow msgpack-c++: an int is accepted where a float is
// expected, str and bin are interchangeable for std::string and bytes, an
// integer out of the expected type's range is a mismatch.
//
// Tensors on encode: a contiguous tensor is recorded as is (Message::tensors
// aliases its storage: no copy); a non-contiguous CPU tensor is recorded as
// a contiguous clone; a CUDA tensor is recorded as is (the agent decides
// whether it can move it). Each occurrence gets its own entry, so a tensor
// passed twice travels twice. An undefined Tensor throws
// std::invalid_argument (use std::optional<Tensor> for "no tensor").
// On decode a Tensor is Message::tensors[index] itself (same storage, no
// copy); its dtype and shape must match the descriptor.
//
// How tensors reach Message::tensors: the encode/decode functions below open
// a per-thread tensor sink for the duration of the call, and the Tensor
// adaptor appends to (reads from) it. Packing or converting a Tensor with
// msgpack outside these functions throws std::invalid_argument.
//
// Thread safety: the functions are thread-safe; each touches only its
// arguments (the sink is per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "core/message.h"
#include "core/remote_error.h"

namespace switchboard::detail {

// The stream msgpack::packer writes payloads into: appends to a byte vector.
struct PayloadWriter {
  std::vector<uint8_t>* out;
  void write(const char* data, size_t size) {
    out->insert(out->end(), reinterpret_cast<const uint8_t*>(data),
                reinterpret_cast<const uint8_t*>(data) + size);
  }
};

}  // namespace switchboard::detail

// Floats stay floats. msgpack-c++ 4.1 packs a float or double that holds an
// integral value as a msgpack int (msgpack-c issue #1017), which turns -0.0
// into 0 and makes 2.0 an int for readers in other languages. For our
// payload stream, float32 and float64 are always written as such.
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(v1) {
  template <>
  inline packer<switchboard::detail::PayloadWriter>&
  packer<switchboard::detail::PayloadWriter>::pack_float(float d) {
    uint32_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    char buf[5];
    buf[0] = static_cast<char>(0xcau);
    _msgpack_store32(&buf[1], bits);
    append_buffer(buf, sizeof buf);
    return *this;
  }

  template <>
  inline packer<switchboard::detail::PayloadWriter>&
  packer<switchboard::detail::PayloadWriter>::pack_double(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    char buf[9];
    buf[0] = static_cast<char>(0xcbu);
    _msgpack_store64(&buf[1], bits);
    append_buffer(buf, sizeof buf);
    return *this;
  }
}  // MSGPACK_API_VERSION_NAMESPACE(v1)
}  // namespace msgpack

namespace switchboard {

// The msgpack ext type code of a tensor descriptor.
inline constexpr int8_t kTensorExtType = 1;

// The two exception classes keep the namespace switchboard::rpc: their
// demangled names travel in remote errors ("switchboard::rpc::ArgumentError",
// docs/wire_formats.md) and callers match on them.
namespace rpc {

// A payload that cannot be decoded as the expected types: malformed msgpack,
// a bad tensor descriptor, or a result of the wrong type.
class SerializationError : public Error {
 public:
  explicit SerializationError(const std::string& message)
      : Error(ErrorCode::kFailedPrecondition, message) {}
};

// A call whose arguments do not match the function's signature (arity or
// types). The message names the function, the expected and received types:
//   function "add" expects (int64, float64), received (int64, str)
class ArgumentError : public SerializationError {
 public:
  using SerializationError::SerializationError;
};

}  // namespace rpc

using rpc::ArgumentError;
using rpc::SerializationError;

// The demangled form of a typeid name ("std::runtime_error"); the input
// unchanged if it cannot be demangled.
std::string demangle(const char* mangled);

// The name of T in error messages (table above).
template <typename T>
std::string type_name();

// The name of what a msgpack value holds (see "Received types" above).
std::string received_type_name(const msgpack::object& o);

// Replaces m.payload with a msgpack array of `args` and m.tensors with the
// tensors they contain. Leaves m.type, m.id and m.function. Throws what
// packing throws (std::invalid_argument for an undefined Tensor); `m` is
// unchanged then.
template <typename... Args>
void encode_args(Message& m, const Args&... args);

// Decodes m.payload as the arguments of `function` into a std::tuple of
// default-constructible types. Throws ArgumentError on an arity or type
// mismatch, SerializationError on a malformed payload or tensor descriptor.
template <typename Tuple>
Tuple decode_args(const Message& m, std::string_view function);

// Replaces m.payload with `value` (nil for the void overload) and m.tensors
// with the tensors it contains. Leaves m.type, m.id and m.function.
template <typename R>
void encode_result(Message& m, const R& value);
void encode_result(Message& m);

// Decodes a response's result as R (void: the payload must be nil). When
// m.type is kError, throws decode_remote_error(m) instead. Throws
// SerializationError when the payload is malformed or not an R; `function`
// (may be empty) only names the call in that message:
//   result of function "add": expected float64, received str
template <typename R>
R decode_result(const Message& m, std::string_view function = {});

// ---------------------------------------------------------------------------
// Implementation.

namespace detail {

// Makes `tensors` the sink that Tensor packing appends to, for this thread,
// until destroyed (restores the previous sink: scopes nest).
class TensorEncodeScope {
 public:
  explicit TensorEncodeScope(std::vector<Tensor>* tensors);
  ~TensorEncodeScope();
  TensorEncodeScope(const TensorEncodeScope&) = delete;
  TensorEncodeScope& operator=(const TensorEncodeScope&) = delete;

 private:
  std::vector<Tensor>* previous_;
};

// Makes `tensors` the table Tensor conversion reads from, for this thread.
class TensorDecodeScope {
 public:
  explicit TensorDecodeScope(const std::vector<Tensor>* tensors);
  ~TensorDecodeScope();
  TensorDecodeScope(const TensorDecodeScope&) = delete;
  TensorDecodeScope& operator=(const TensorDecodeScope&) = delete;

 private:
  const std::vector<Tensor>* previous_;
};

// Records `t` in this thread's encode sink; returns the ext body.
std::string record_tensor(const Tensor& t);
// Resolves a tensor ext value against this thread's decode table. Throws
// msgpack::type_error when `o` is not a tensor ext, SerializationError when
// its descriptor is bad.
Tensor resolve_tensor(const msgpack::object& o);

// Unpacks a whole payload (one msgpack value, nothing after it; nesting at
// most kMaxDepth). The handle references `payload`, which must outlive it.
// Throws SerializationError naming `what` ("arguments of function \"f\"").
inline constexpr size_t kMaxDepth = 64;
msgpack::object_handle unpack_payload(const std::vector<uint8_t>& payload,
                                      std::string_view what);

[[noreturn]] void throw_argument_error(std::string_view function,
                                       const std::vector<std::string>& expected,
                                       const msgpack::object& received);
[[noreturn]] void throw_result_error(std::string_view function, std::string_view expected,
                                     const msgpack::object& received);
[[noreturn]] void rethrow_with_context(const SerializationError& e,
                                       std::string_view what);
std::string arguments_what(std::string_view function);
std::string result_what(std::string_view function);

template <typename T>
struct IsVector : std::false_type {};
template <typename T, typename A>
struct IsVector<std::vector<T, A>> : std::true_type {
  using Element = T;
};
template <typename T>
struct IsMap : std::false_type {};
template <typename K, typename V, typename C, typename A>
struct IsMap<std::map<K, V, C, A>> : std::true_type {
  using Key = K;
  using Value = V;
};
template <typename K, typename V, typename H, typename E, typename A>
struct IsMap<std::unordered_map<K, V, H, E, A>> : std::true_type {
  using Key = K;
  using Value = V;
};
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {
  using Value = T;
};
template <typename T>
struct TupleNames {
  static constexpr bool kIsTuple = false;
};
template <typename... Ts>
struct TupleNames<std::tuple<Ts...>> {
  static constexpr bool kIsTuple = true;
  static std::vector<std::string> names() { return {type_name<Ts>()...}; }
};
template <typename A, typename B>
struct TupleNames<std::pair<A, B>> {
  static constexpr bool kIsTuple = true;
  static std::vector<std::string> names() { return {type_name<A>(), type_name<B>()}; }
};

std::string join(const std::vector<std::string>& parts);

template <typename T>
void pack_value(std::vector<uint8_t>& payload, std::vector<Tensor>& tensors,
                const T& value) {
  TensorEncodeScope scope(&tensors);
  PayloadWriter writer{&payload};
  msgpack::pack(writer, value);
}

template <typename Tuple, size_t... I>
void convert_args(const msgpack::object* objects, Tuple& out, std::index_sequence<I...>) {
  (objects[I].convert(std::get<I>(out)), ...);
}

}  // namespace detail

template <typename T>
std::string type_name() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<U>) {
    return std::string(std::is_signed_v<U> ? "int" : "uint") +
           std::to_string(sizeof(U) * 8);
  } else if constexpr (std::is_same_v<U, float>) {
    return "float32";
  } else if constexpr (std::is_same_v<U, double>) {
    return "float64";
  } else if constexpr (std::is_same_v<U, std::string> ||
                       std::is_same_v<U, std::string_view>) {
    return "str";
  } else if constexpr (std::is_same_v<U, Tensor>) {
    return "tensor";
  } else if constexpr (std::is_same_v<U, WorkerInfo>) {
    return "worker_info";
  } else if constexpr (requires { U::sb_type_name(); }) {
    return U::sb_type_name();  // e.g. RRef<T>: rref[T]
  } else if constexpr (detail::IsVector<U>::value) {
    using E = typename detail::IsVector<U>::Element;
    if constexpr (std::is_same_v<E, unsigned char> || std::is_same_v<E, char> ||
                  std::is_same_v<E, std::byte>) {
      return "bytes";
    } else {
      return "list[" + type_name<E>() + "]";
    }
  } else if constexpr (detail::IsMap<U>::value) {
    return "dict[" + type_name<typename detail::IsMap<U>::Key>() + ", " +
           type_name<typename detail::IsMap<U>::Value>() + "]";
  } else if constexpr (detail::IsOptional<U>::value) {
    return "optional[" + type_name<typename detail::IsOptional<U>::Value>() + "]";
  } else if constexpr (detail::TupleNames<U>::kIsTuple) {
    return "tuple[" + detail::join(detail::TupleNames<U>::names()) + "]";
  } else {
    return demangle(typeid(U).name());
  }
}

template <typename... Args>
void encode_args(Message& m, const Args&... args) {
  std::vector<uint8_t> payload;
  std::vector<Tensor> tensors;
  {
    detail::TensorEncodeScope scope(&tensors);
    detail::PayloadWriter writer{&payload};
    msgpack::packer<detail::PayloadWriter> packer(writer);
    packer.pack_array(sizeof...(Args));
    (packer.pack(args), ...);
  }
  m.payload = std::move(payload);
  m.tensors = std::move(tensors);
}

template <typename Tuple>
Tuple decode_args(const Message& m, std::string_view function) {
  static_assert(detail::TupleNames<Tuple>::kIsTuple, "decode_args<std::tuple<...>>");
  constexpr size_t kArity = std::tuple_size_v<Tuple>;
  msgpack::object_handle handle =
      detail::unpack_payload(m.payload, detail::arguments_what(function));
  const msgpack::object& received = handle.get();
  auto expected = [] { return detail::TupleNames<Tuple>::names(); };
  if (received.type != msgpack::type::ARRAY || received.via.array.size != kArity) {
    detail::throw_argument_error(function, expected(), received);
  }
  Tuple out;
  detail::TensorDecodeScope scope(&m.tensors);
  try {
    detail::convert_args(received.via.array.ptr, out, std::make_index_sequence<kArity>());
  } catch (const msgpack::type_error&) {
    detail::throw_argument_error(function, expected(), received);
  } catch (const SerializationError& e) {
    detail::rethrow_with_context(e, detail::arguments_what(function));
  }
  return out;
}

template <typename R>
void encode_result(Message& m, const R& value) {
  std::vector<uint8_t> payload;
  std::vector<Tensor> tensors;
  detail::pack_value(payload, tensors, value);
  m.payload = std::move(payload);
  m.tensors = std::move(tensors);
}

template <typename R>
R decode_result(const Message& m, std::string_view function) {
  if (m.type == MessageType::kError) throw decode_remote_error(m);
  msgpack::object_handle handle =
      detail::unpack_payload(m.payload, detail::result_what(function));
  const msgpack::object& received = handle.get();
  if constexpr (std::is_void_v<R>) {
    if (!received.is_nil()) detail::throw_result_error(function, "nil", received);
  } else {
    R out{};
    detail::TensorDecodeScope scope(&m.tensors);
    try {
      received.convert(out);
    } catch (const msgpack::type_error&) {
      detail::throw_result_error(function, type_name<R>(), received);
    } catch (const SerializationError& e) {
      detail::rethrow_with_context(e, detail::result_what(function));
    }
    return out;
  }
}

}  // namespace switchboard

// The RPC layer's names for them (core/message.h says why).
namespace switchboard::rpc {
using switchboard::decode_args;
using switchboard::decode_result;
using switchboard::demangle;
using switchboard::encode_args;
using switchboard::encode_result;
using switchboard::kTensorExtType;
using switchboard::received_type_name;
using switchboard::type_name;
// For the RRef payload rewriting (rpc/rref_payload.h).
namespace detail {
using switchboard::detail::arguments_what;
using switchboard::detail::PayloadWriter;
using switchboard::detail::unpack_payload;
}  // namespace detail
}  // namespace switchboard::rpc

// The msgpack-c++ adaptor for Tensor (see "How tensors reach
// Message::tensors" above).
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <>
  struct pack<switchboard::Tensor> {
    template <typename Stream>
    packer<Stream>& operator()(packer<Stream>& o, const switchboard::Tensor& t) const {
      std::string body = switchboard::detail::record_tensor(t);
      o.pack_ext(body.size(), switchboard::kTensorExtType);
      o.pack_ext_body(body.data(), body.size());
      return o;
    }
  };

  template <>
  struct convert<switchboard::Tensor> {
    const msgpack::object& operator()(const msgpack::object& o,
                                      switchboard::Tensor& t) const {
      t = switchboard::detail::resolve_tensor(o);
      return o;
    }
  };

  // WorkerInfo as torch passes it (an argument or a result): [name, id].
  template <>
  struct pack<switchboard::WorkerInfo> {
    template <typename Stream>
    packer<Stream>& operator()(packer<Stream>& o,
                               const switchboard::WorkerInfo& w) const {
      o.pack_array(2);
      o.pack(w.name);
      o.pack(w.id);
      return o;
    }
  };

  template <>
  struct convert<switchboard::WorkerInfo> {
    const msgpack::object& operator()(const msgpack::object& o,
                                      switchboard::WorkerInfo& w) const {
      if (o.type != msgpack::type::ARRAY || o.via.array.size != 2) throw msgpack::type_error();
      w.name = o.via.array.ptr[0].as<std::string>();
      w.id = o.via.array.ptr[1].as<int>();
      return o;
    }
  };

  }  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
