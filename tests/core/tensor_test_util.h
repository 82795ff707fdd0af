// Helpers shared by tensor_test.cc and dlpack_test.cc.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

namespace sbtest {

// The message of the std::invalid_argument that fn throws ("<no exception>"
// when it throws nothing; other exception types propagate and fail the test).
template <typename Fn>
std::string invalid_argument_message(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

// A shared_ptr owner whose deleter sets a flag, to observe when the last
// reference to borrowed storage goes away.
inline std::shared_ptr<void> flag_owner(bool* released) {
  return std::shared_ptr<void>(static_cast<void*>(released),
                               [](void* flag) { *static_cast<bool*>(flag) = true; });
}

}  // namespace sbtest
