#include "rpc/call_context.h"

namespace switchboard::rpc {

namespace {
thread_local const CallContext* current = nullptr;
}  // namespace

const CallContext* current_call() { return current; }

ScopedCallContext::ScopedCallContext(const CallContext* context) : previous_(current) {
  current = context;
}

ScopedCallContext::~ScopedCallContext() { current = previous_; }

}  // namespace switchboard::rpc
