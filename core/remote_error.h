// RemoteError: an exception raised by a function on another worker, as the
// caller sees it.
//
// A remote function that throws never takes its exception object across the
// wire; the serving worker describes it (its worker name, the exception's
// C++ type name and its what()) in an error response (MessageType::kError),
// and the caller rethrows that description as a RemoteError:
//
//   worker "w1" raised std::runtime_error: boom
//
// Wire format of a kError payload: one msgpack map with string keys
//   {"worker": str, "type": str, "message": str, "code": str | nil}
// where "code" is error_code_name() of a switchboard::Error and nil for any
// other exception. Language-neutral: a client in another language reads it
// with any msgpack library.
//
// Error codes: a RemoteError carries the remote exception's code when it was
// a switchboard::Error (a remote TimeoutError arrives with kDeadlineExceeded,
// an unknown function with kNotFound), and kFailedPrecondition for any other
// exception (the call failed; retrying it unchanged will not help).
//
// Thread safety: RemoteError is an immutable value; the functions are
// thread-safe (they touch only their arguments).
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "core/message.h"

namespace switchboard {

// RemoteError keeps the namespace switchboard::rpc, as the serialization
// errors do (core/serialize.h): its demangled name travels when a handler
// lets another worker's error through.
namespace rpc {

class RemoteError : public Error {
 public:
  RemoteError(std::string worker, std::string type_name, std::string message,
              ErrorCode code = ErrorCode::kFailedPrecondition);

  // The name of the worker whose function raised.
  const std::string& worker() const { return worker_; }
  // The remote exception's demangled C++ type, e.g. "std::runtime_error",
  // "switchboard::rpc::ArgumentError", "switchboard::NotFoundError".
  const std::string& type_name() const { return type_name_; }
  // The remote exception's what().
  const std::string& remote_message() const { return remote_message_; }

 private:
  std::string worker_;
  std::string type_name_;
  std::string remote_message_;
};

}  // namespace rpc

using rpc::RemoteError;

// What is known of an exception: its dynamic type's demangled name, its
// what() and, for a switchboard::Error, its code. For an object that is not
// a std::exception (`throw 42;`) the type is the thrown type ("int") and the
// message "(not a std::exception)".
struct ExceptionInfo {
  std::string type_name;
  std::string message;
  std::optional<ErrorCode> code;
};
// `error` must not be null (std::invalid_argument otherwise).
ExceptionInfo describe_exception(std::exception_ptr error);

// Makes `m` an error response: sets m.type = kError, replaces m.payload
// with the map above and clears m.tensors. Leaves m.id and m.function.
void encode_remote_error(Message& m, std::string_view worker, std::string_view type_name,
                         std::string_view message,
                         std::optional<ErrorCode> code = std::nullopt);
// Same, describing `error` (describe_exception). `error` must not be null.
void encode_remote_error(Message& m, std::string_view worker, std::exception_ptr error);

// Reads an error response's payload. Throws SerializationError
// (core/serialize.h) when the payload is not such a map (bad bytes from the
// peer); does not look at m.type.
RemoteError decode_remote_error(const Message& m);

}  // namespace switchboard

// The RPC layer's names for them (core/message.h says why).
namespace switchboard::rpc {
using switchboard::decode_remote_error;
using switchboard::describe_exception;
using switchboard::encode_remote_error;
using switchboard::ExceptionInfo;
}  // namespace switchboard::rpc
