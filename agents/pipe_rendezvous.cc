#include "agents/pipe_rendezvous.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "collective/gloo_process_group.h"
#include "common/check.h"
#include "common/error.h"
#include "store/store.h"

namespace switchboard::agents {

using Timeout = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

StaticRendezvous::StaticRendezvous(std::string name, int rank, int world_size,
                                   const PipeAgentOptions& options, PeerTable& peers,
                                   PipeTransport& transport, const PipeAuth& auth)
    : name_(std::move(name)),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      peers_(peers),
      transport_(transport),
      auth_(auth) {}

StaticRendezvous::~StaticRendezvous() = default;

void StaticRendezvous::run(Store& store, const WorkerAnnouncement& mine) {
  collective::GlooOptions gloo_options;
  gloo_options.group_name = "pipe";
  gloo_options.timeout = options_.rpc_timeout.count() > 0
                             ? options_.rpc_timeout
                             : collective::ProcessGroup::kDefaultTimeout;
  // One bound for all of it (init_rpc's StoreCallBound covers the store
  // calls): each step waits for what is left.
  const auto deadline = std::chrono::steady_clock::now() + gloo_options.timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  gloo_options.hostname = mine.address;
  gloo_ = std::make_unique<collective::GlooProcessGroup>(store, rank_, world_size_,
                                                         gloo_options);
  const std::vector<WorkerAnnouncement> all =
      allgather_announcements(*gloo_, mine, left());

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
        name_, fmt::join(quoted, ", "), gloo_options.timeout.count()));
  }
}

std::string StaticRendezvous::accept_hello(const Hello& hello,
                                           const std::shared_ptr<Connection>& connection) {
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

void StaticRendezvous::close() { gloo_.reset(); }

}  // namespace switchboard::agents
