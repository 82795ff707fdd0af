#include "store/call_bound.h"

#include <algorithm>

#include "common/check.h"

namespace switchboard {

StoreCallBound::Bounds& StoreCallBound::current() {
  thread_local Bounds bounds;
  return bounds;
}

StoreCallBound::StoreCallBound(Clock::time_point deadline) : enclosing_(current()) {
  Bounds& bounds = current();
  bounds.deadline = bounds.deadline ? std::min(*bounds.deadline, deadline) : deadline;
}

StoreCallBound::StoreCallBound(Timeout each) : enclosing_(current()) {
  SB_REQUIRE(each.count() > 0, "StoreCallBound: a cap of {} ms on each store call",
             each.count());
  Bounds& bounds = current();
  bounds.each = bounds.each ? std::min(*bounds.each, each) : each;
}

StoreCallBound::~StoreCallBound() { current() = enclosing_; }

StoreCallBound::Timeout StoreCallBound::bounded(Timeout timeout) {
  const Bounds& bounds = current();
  if (!bounds.deadline && !bounds.each) return timeout;
  // 0 is "forever" to the stores.
  Timeout out = timeout.count() > 0 ? timeout : Timeout::max();
  if (bounds.each) out = std::min(out, *bounds.each);
  if (bounds.deadline) {
    const auto left =
        std::chrono::ceil<Timeout>(*bounds.deadline - Clock::now());
    out = std::min(out, left);
  }
  return std::max(out, Timeout(1));
}

}  // namespace switchboard
