#include "agents/pipe/static_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "common/check.h"
#include "common/error.h"
#include "store/store.h"

namespace switchboard::agents::pipe {

using Timeout = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

StaticRendezvous::StaticRendezvous(std::string name, int rank, int world_size,
                                   const PipeAgentOptions& options, PeerTable& peers,
                                   transport::PipeTransport& transport,
                                   const PipeAuth& auth)
    : name_(std::move(name)),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      peers_(peers),
      transport_(transport),
      auth_(auth) {}

StaticRendezvous::~StaticRendezvous() = default;

namespace {

// Every rank's announcement, by rank, through the static group's round of
// the store: each worker sets its own under "announce/<rank>", then reads
// them all once every rank's is there. TimeoutError naming the ranks whose
// announcement did not come within `timeout`. The ranks are waited for one
// at a time, in order, so that a wait that times out names its rank for
// certain: a store call made after the deadline to find out would be cut
// short by init_rpc's StoreCallBound (to 1 ms) and could fail itself. The
// later ranks are checked as that bound allows.
std::vector<WorkerAnnouncement> exchange_announcements(Store& store, const std::string& name,
                                                       int rank, int world_size,
                                                       const WorkerAnnouncement& mine,
                                                       std::chrono::milliseconds timeout) {
  auto key = [](int r) { return fmt::format("announce/{}", r); };
  store.set(key(rank), encode_announcement(mine));
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(key(r));
    try {
      store.wait(
          {keys.back()},
          std::max(Timeout(1), std::chrono::ceil<Timeout>(deadline - Clock::now())));
    } catch (const TimeoutError&) {
      std::vector<int> missing{r};
      std::vector<int> unchecked;
      for (int later = r + 1; later < world_size; ++later) {
        try {
          if (!store.check({key(later)})) missing.push_back(later);
        } catch (const Error&) {
          unchecked.push_back(later);
        }
      }
      throw TimeoutError(fmt::format(
          "PIPE agent \"{}\" (rank {} of {}): ranks [{}] did not arrive within {} ms{}",
          name, rank, world_size, fmt::join(missing, ", "), timeout.count(),
          unchecked.empty()
              ? ""
              : fmt::format(" (whether ranks [{}] did could not be checked in time)",
                            fmt::join(unchecked, ", "))));
    }
  }
  const std::vector<Bytes> values = store.multi_get(keys);
  std::vector<WorkerAnnouncement> all;
  for (const Bytes& value : values) all.push_back(decode_announcement(value.data(), value.size()));
  return all;
}

}  // namespace

void StaticRendezvous::run(Store& store, const WorkerAnnouncement& mine) {
  const std::chrono::milliseconds timeout =
      options_.rpc_timeout.count() > 0 ? options_.rpc_timeout : std::chrono::minutes(5);
  // One bound for all of it (init_rpc's StoreCallBound covers the store
  // calls): each step waits for what is left.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::vector<WorkerAnnouncement> all =
      exchange_announcements(store, name_, rank_, world_size_, mine, left());

  check_unique_names(all);
  for (const auto& worker : all) check_same_tls(mine, worker, "cannot form the static group");
  std::vector<rpc::WorkerDevices> gathered;
  for (const auto& worker : all) {
    gathered.push_back({worker.name, worker.device_count, worker.device_maps,
                        worker.devices});
  }
  rpc::validate_device_maps(gathered, /*static_group=*/true);
  PeerTable::DeviceRoutes routes;
  routes.reverse_maps = rpc::reverse_device_maps(name_, gathered);
  routes.devices =
      rpc::default_devices(options_.devices, options_.device_maps, routes.reverse_maps);
  peers_.fill_static(all, rank_, std::move(routes));

  hello_.rank = rank_;
  hello_.name = name_;
  for (int r = 0; r < rank_; ++r) {
    peers_.connect(r, transport_, auth_, hello_, left());
  }

  const std::vector<std::string> missing = peers_.wait_all_up(left());
  if (!missing.empty()) {
    std::vector<std::string> quoted;
    for (const auto& m : missing) quoted.push_back(fmt::format("\"{}\"", m));
    throw TimeoutError(fmt::format(
        "PIPE agent \"{}\": no connection from worker(s) {} within the static group's "
        "rendezvous ({} ms in all)",
        name_, fmt::join(quoted, ", "), timeout.count()));
  }
}

std::string StaticRendezvous::accept_hello(
    const Hello& hello, const std::shared_ptr<transport::Connection>& connection) {
  const int peer = hello.rank;
  if (connection->peer >= 0) return "a second hello";
  if (peer <= rank_ || peer >= world_size_) {
    return fmt::format("hello from rank {} (only ranks {}..{} connect here)", peer,
                       rank_ + 1, world_size_ - 1);
  }
  if (hello.name != peers_.name_of(peer)) {
    return fmt::format("hello from rank {} named \"{}\", expected \"{}\"", peer, hello.name,
                       peers_.name_of(peer));
  }
  if (!peers_.identify(peer, connection)) {
    return fmt::format("a second connection from rank {}", peer);
  }
  return std::string();
}

void StaticRendezvous::reconnect(int peer, std::chrono::milliseconds timeout) {
  SB_REQUIRE(peer >= 0 && peer < rank_, "PIPE agent \"{}\": rank {} reconnects only to ranks "
             "below it, not {}", name_, rank_, peer);
  peers_.connect(peer, transport_, auth_, hello_, timeout);
}

}  // namespace switchboard::agents::pipe
