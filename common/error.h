// Switchboard's error hierarchy, shared by every layer.
//
// Exceptions are typed by what the caller should do about them, each with a
// code (see ErrorCode). The synchronous API throws these; asynchronous APIs
// carry them inside futures as std::exception_ptr. API misuse (a caller bug)
// throws std::invalid_argument instead.
//
// Thread safety: the classes are immutable values and safe to share.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace switchboard {

// What the caller should do about an error.
enum class ErrorCode {
  kNotFound,           // what was asked for does not exist
  kDeadlineExceeded,   // waited as long as allowed; may succeed if retried later
  kUnavailable,        // the peer or connection is gone: reconnect
  kResourceExhausted,  // over a limit: back off or send less
  kCancelled,          // the operation was cancelled (e.g. by shutdown)
  kFailedPrecondition, // the state does not allow this (e.g. non-integer add)
  kRegistry,           // a registry lookup or registration failed
  kUnauthenticated,    // a side did not prove the job secret; retrying will not help
  kPermissionDenied,   // the callee refused the call (an interceptor said no)
  kInternal,           // a bug in Switchboard
};

// Returns the code's name, e.g. "DeadlineExceeded".
std::string_view error_code_name(ErrorCode code);

// Root of every Switchboard exception.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// A blocking call waited past its timeout. The message names what it waited
// for (the missing keys, the worker, the function) and the timeout.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message)
      : Error(ErrorCode::kDeadlineExceeded, message) {}
};

// A key, worker or function that does not exist.
class NotFoundError : public Error {
 public:
  explicit NotFoundError(const std::string& message)
      : Error(ErrorCode::kNotFound, message) {}
};

// A connection failed or was closed; reconnecting may help.
class ConnectionError : public Error {
 public:
  explicit ConnectionError(const std::string& message)
      : Error(ErrorCode::kUnavailable, message) {}
};

// A peer sent bytes that are not the protocol: a frame, a descriptor or a
// message that no correct peer sends (PIPE and PROCESS_GROUP frames, tensor
// descriptors, PIPE hellos and announcements). The message says what was
// wrong, with the values and the limit they broke, e.g. "pipe frame: frame 7
// tensor 2: ndim 65 exceeds the limit 64". Code kUnavailable: close the
// connection that carried them (a reconnect may help); nothing after the
// bad bytes can be trusted. Never thrown for local mistakes (those are
// std::invalid_argument).
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& message)
      : Error(ErrorCode::kUnavailable, message) {}
};

// Authentication failed: the other side did not prove the job secret (a
// server or peer with another secret, or none), or refused this side's
// proof. The message names the other side and which proof failed. Not a
// ConnectionError: reconnecting with the same secret fails the same way.
class AuthenticationError : public Error {
 public:
  explicit AuthenticationError(const std::string& message)
      : Error(ErrorCode::kUnauthenticated, message) {}
};

// A worker name that another worker of the group uses too: a static group
// whose ranks share a name (on every worker, naming the name and its ranks),
// or a dynamic joiner whose name a member has. A std::invalid_argument (the
// job's configuration is wrong; retrying will not help), typed so that
// callers can tell it from other bad arguments without reading the message
// (the torch backend answers it as PyTorch's agents do: "is not unique").
class DuplicateNameError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A worker would join a static group (world_size given) through a store
// that holds a dynamic one, or the other way round: the job's
// configuration is wrong; typed so that callers can tell it from other bad
// arguments without reading the message (the torch backend answers it in
// TensorPipe's words: "RPC group mixes statically and dynamically
// initialized members which is not supported.").
class GroupKindMismatchError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A registry rejected a registration or lookup (duplicate or unknown name).
class RegistryError : public Error {
 public:
  explicit RegistryError(const std::string& message)
      : Error(ErrorCode::kRegistry, message) {}
};

}  // namespace switchboard
