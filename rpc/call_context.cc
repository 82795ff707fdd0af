#include "rpc/call_context.h"

#include <fmt/format.h>

#include <memory>
#include <regex>
#include <stdexcept>

namespace switchboard::rpc {

namespace {
thread_local const CallContext* current = nullptr;
}  // namespace

const CallContext* current_call() { return current; }

ScopedCallContext::ScopedCallContext(const CallContext* context) : previous_(current) {
  current = context;
}

ScopedCallContext::~ScopedCallContext() { current = previous_; }

ServerInterceptor allow_callers(std::string function, const std::string& callers) {
  std::shared_ptr<const std::regex> pattern;
  try {
    pattern = std::make_shared<const std::regex>(callers, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument(
        fmt::format("allow_callers(\"{}\"): \"{}\" is not a regular expression: {}",
                    function, callers, e.what()));
  }
  return [function = std::move(function), callers, pattern](const CallContext& call) {
    if (call.function != function || std::regex_match(call.caller.name, *pattern)) {
      return std::string();
    }
    return fmt::format("only workers matching \"{}\" may call it", callers);
  };
}

}  // namespace switchboard::rpc
