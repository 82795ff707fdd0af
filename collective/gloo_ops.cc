#include "collective/gloo_ops.h"

#include <fmt/format.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include "common/error.h"

namespace switchboard::collective {

std::exception_ptr translate_gloo_error(const std::string& where,
                                        std::chrono::milliseconds timeout,
                                        std::exception_ptr error,
                                        const std::vector<std::string>& peers) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    // "Timed out waiting ..." in the op that timed out, and "Application
    // timeout caused pair closure" in every other op of the context.
    if (what.find("imed out") != std::string::npos ||
        what.find("timeout caused") != std::string::npos) {
      return std::make_exception_ptr(TimeoutError(
          fmt::format("{}: timed out after {} ms waiting for peers (gloo: {})", where,
                      timeout.count(), what)));
    }
    for (size_t r = 0; r < peers.size(); ++r) {
      if (!peers[r].empty() && what.find(peers[r]) != std::string::npos) {
        return std::make_exception_ptr(ConnectionError(fmt::format(
            "{}: the connection to rank {} failed: it died or was cut off (timeout {} ms; "
            "gloo: {})",
            where, r, timeout.count(), what)));
      }
    }
    return std::make_exception_ptr(ConnectionError(
        fmt::format("{}: a peer connection failed (timeout {} ms; gloo: {})", where,
                    timeout.count(), what)));
  } catch (const gloo::Exception& e) {
    return std::make_exception_ptr(
        Error(ErrorCode::kInternal, fmt::format("{}: gloo failed: {}", where, e.what())));
  } catch (...) {
    return std::current_exception();
  }
}

void empty_op(const std::shared_ptr<gloo::rendezvous::Context>& context, uint32_t tag,
              std::chrono::milliseconds timeout) {
  gloo::BarrierOptions opts(context);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::barrier(opts);
}

}  // namespace switchboard::collective
