#include "collective/gloo_ops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include "common/error.h"

namespace switchboard::collective {

std::exception_ptr translate_gloo_error(const std::string& where,
                                        std::chrono::milliseconds timeout,
                                        std::exception_ptr error,
                                        const std::vector<std::string>& peers,
                                        int only_peer) {
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
    int failed = only_peer;
    for (size_t r = 0; r < peers.size(); ++r) {
      if (!peers[r].empty() && what.find(peers[r]) != std::string::npos) {
        failed = static_cast<int>(r);
        break;
      }
    }
    if (failed >= 0) {
      return std::make_exception_ptr(ConnectionError(fmt::format(
          "{}: the connection to rank {} failed: it died or was cut off (timeout {} ms; "
          "gloo: {})",
          where, failed, timeout.count(), what)));
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

std::vector<std::string> exchange_peer_addresses(Store& store, const std::string& prefix,
                                                 gloo::rendezvous::Context& context,
                                                 const std::string& where,
                                                 std::chrono::milliseconds timeout) {
  const int rank = context.rank;
  std::vector<std::string> peers(static_cast<size_t>(context.size));
  auto key = [&](int from, int to) {
    return fmt::format("{}pair_address/{}/{}", prefix, from, to);
  };
  std::vector<std::string> theirs;
  for (int p = 0; p < context.size; ++p) {
    if (p == rank) continue;
    store.set(key(rank, p), context.getPair(p)->address().str());
    theirs.push_back(key(p, rank));
  }
  try {
    store.wait(theirs, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int p = 0; p < context.size; ++p) {
      if (p != rank && !store.check({key(p, rank)})) missing.push_back(p);
    }
    throw TimeoutError(fmt::format(
        "{}: timed out after {} ms waiting for ranks [{}] to finish connecting", where,
        timeout.count(), fmt::join(missing, ", ")));
  }
  for (int p = 0; p < context.size; ++p) {
    if (p == rank) continue;
    const Bytes value = store.get(key(p, rank));
    peers[static_cast<size_t>(p)] = std::string(value.begin(), value.end());
  }
  return peers;
}

void empty_op(const std::shared_ptr<gloo::rendezvous::Context>& context, uint32_t tag,
              std::chrono::milliseconds timeout) {
  gloo::BarrierOptions opts(context);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::barrier(opts);
}

}  // namespace switchboard::collective
