#include "agents/pipe/announcement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <msgpack.hpp>
#include <stdexcept>

#include "common/error.h"

namespace switchboard::agents::pipe {
namespace {

// On the wire: [name, address, port, device_count,
//               {target: [[src, dst], ...]}, [device, ...], tls,
//               [host_key, pid, cuda_ipc, cuda_ipc_own_process, [uuid, ...]]]
// (devices as text); versions before TLS sent the first six, versions
// before channels the first seven, which still decode (as no TLS, and
// channels that can do nothing but inline bytes).
using MapWire = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;
using OlderAnnouncementWire =
    std::tuple<std::string, std::string, int, int, MapWire, std::vector<std::string>>;
using TlsAnnouncementWire =
    std::tuple<std::string, std::string, int, int, MapWire, std::vector<std::string>, bool>;
using ChannelsWire = std::tuple<std::string, int64_t, bool, bool, std::vector<std::string>>;
using AnnouncementWire = std::tuple<std::string, std::string, int, int, MapWire,
                                    std::vector<std::string>, bool, ChannelsWire>;

template <typename T>
T unpack_as(const uint8_t* data, size_t size, const char* what) {
  try {
    msgpack::object_handle handle =
        msgpack::unpack(reinterpret_cast<const char*>(data), size);
    return handle.get().as<T>();
  } catch (const std::exception& e) {
    throw ProtocolError(fmt::format("PIPE agent: malformed {}: {}", what, e.what()));
  }
}

template <typename T>
std::vector<uint8_t> pack(const T& value) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, value);
  return std::vector<uint8_t>(buffer.data(), buffer.data() + buffer.size());
}

}  // namespace

std::vector<uint8_t> encode_announcement(const WorkerAnnouncement& a) {
  MapWire maps;
  for (const auto& [target, map] : a.device_maps) {
    auto& pairs = maps[target];
    for (const auto& [src, dst] : map) pairs.emplace_back(src.str(), dst.str());
  }
  std::vector<std::string> devices;
  for (const Device& d : a.devices) devices.push_back(d.str());
  const ChannelDescriptor& c = a.channels;
  return pack(AnnouncementWire{
      a.name, a.address, a.port, a.device_count, maps, devices, a.tls,
      ChannelsWire{c.host_key, c.pid, c.cuda_ipc, c.cuda_ipc_own_process, c.device_uuids}});
}

WorkerAnnouncement decode_announcement(const uint8_t* data, size_t size) {
  std::string name, address;
  int port = 0, count = 0;
  MapWire maps;
  std::vector<std::string> devices;
  WorkerAnnouncement a;
  try {
    msgpack::object_handle handle = msgpack::unpack(reinterpret_cast<const char*>(data), size);
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size < 6 || o.via.array.size > 8) {
      throw std::invalid_argument("not an array of 6 to 8 fields");
    }
    if (o.via.array.size == 6) {
      std::tie(name, address, port, count, maps, devices) = o.as<OlderAnnouncementWire>();
    } else if (o.via.array.size == 7) {
      std::tie(name, address, port, count, maps, devices, a.tls) = o.as<TlsAnnouncementWire>();
    } else {
      ChannelsWire channels;
      std::tie(name, address, port, count, maps, devices, a.tls, channels) =
          o.as<AnnouncementWire>();
      ChannelDescriptor& c = a.channels;
      std::tie(c.host_key, c.pid, c.cuda_ipc, c.cuda_ipc_own_process, c.device_uuids) =
          channels;
    }
  } catch (const std::exception& e) {
    throw ProtocolError(fmt::format("PIPE agent: malformed worker announcement: {}", e.what()));
  }
  a.name = std::move(name);
  a.address = std::move(address);
  a.port = port;
  a.device_count = count;
  for (const auto& [target, pairs] : maps) {
    rpc::DeviceMap& map = a.device_maps[target];
    for (const auto& [src, dst] : pairs) map.emplace(Device::parse(src), Device::parse(dst));
  }
  for (const auto& d : devices) a.devices.push_back(Device::parse(d));
  return a;
}

void check_same_tls(const WorkerAnnouncement& mine, const WorkerAnnouncement& other,
                    const std::string& what) {
  if (mine.tls == other.tls) return;
  const WorkerAnnouncement& with = mine.tls ? mine : other;
  const WorkerAnnouncement& without = mine.tls ? other : mine;
  throw std::invalid_argument(fmt::format(
      "PIPE agent \"{}\": {}: worker \"{}\" uses TLS and worker \"{}\" does not; every "
      "worker of a group needs the TLS files (SWITCHBOARD_TLS_CERT_FILE, "
      "SWITCHBOARD_TLS_KEY_FILE, SWITCHBOARD_TLS_CA_FILE), or none does",
      mine.name, what, with.name, without.name));
}

void check_unique_names(const std::vector<WorkerAnnouncement>& all) {
  std::map<std::string, std::vector<int>> ranks;
  for (size_t r = 0; r < all.size(); ++r) ranks[all[r].name].push_back(static_cast<int>(r));
  for (const auto& [name, used_by] : ranks) {
    if (used_by.size() > 1) {
      throw DuplicateNameError(fmt::format(
          "rpc worker name \"{}\" is used by ranks {}; names must be unique in the group",
          name, fmt::join(used_by, ", ")));
    }
  }
}

// On the wire: [kind, rank, name, announcement, accepted, reason, nonce,
// proof]; versions before authentication sent the first six, which still
// decode (with no nonce and no proof).
std::vector<uint8_t> encode_hello(const Hello& hello) {
  return pack(std::make_tuple(static_cast<int>(hello.kind), hello.rank, hello.name,
                              hello.announcement, hello.accepted, hello.reason, hello.nonce,
                              hello.proof));
}

Hello decode_hello(const std::vector<uint8_t>& payload) {
  using Older = std::tuple<int, int, std::string, std::vector<uint8_t>, bool, std::string>;
  using Wire = std::tuple<int, int, std::string, std::vector<uint8_t>, bool, std::string,
                          std::vector<uint8_t>, std::vector<uint8_t>>;
  Hello hello;
  int kind = -1;
  try {
    msgpack::object_handle handle =
        msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size());
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::ARRAY || (o.via.array.size != 6 && o.via.array.size != 8)) {
      throw std::invalid_argument("not an array of 6 or 8 fields");
    }
    if (o.via.array.size == 6) {
      std::tie(kind, hello.rank, hello.name, hello.announcement, hello.accepted,
               hello.reason) = o.as<Older>();
    } else {
      std::tie(kind, hello.rank, hello.name, hello.announcement, hello.accepted, hello.reason,
               hello.nonce, hello.proof) = o.as<Wire>();
    }
  } catch (const std::exception& e) {
    throw ProtocolError(fmt::format("PIPE agent: malformed hello: {}", e.what()));
  }
  if (kind < 0 || kind > static_cast<int>(Hello::Kind::kProof)) {
    throw ProtocolError(fmt::format("PIPE agent: a hello of unknown kind {}", kind));
  }
  hello.kind = static_cast<Hello::Kind>(kind);
  return hello;
}

std::vector<uint8_t> encode_members(const std::vector<Member>& members) {
  std::vector<std::pair<int, std::vector<uint8_t>>> wire;
  for (const Member& m : members) wire.emplace_back(m.rank, encode_announcement(m.announcement));
  return pack(wire);
}

std::vector<Member> decode_members(const std::vector<uint8_t>& bytes) {
  auto wire = unpack_as<std::vector<std::pair<int, std::vector<uint8_t>>>>(
      bytes.data(), bytes.size(), "member list");
  std::vector<Member> members;
  for (const auto& [rank, announcement] : wire) {
    members.push_back({rank, decode_announcement(announcement.data(), announcement.size())});
  }
  return members;
}

std::vector<uint8_t> encode_link_view(const LinkView& view) {
  return pack(std::make_tuple(view.seq,
                              std::vector<int>(view.unreachable.begin(), view.unreachable.end())));
}

LinkView decode_link_view(const std::vector<uint8_t>& bytes) {
  auto [seq, unreachable] =
      unpack_as<std::tuple<uint64_t, std::vector<int>>>(bytes.data(), bytes.size(), "link view");
  LinkView view;
  view.seq = seq;
  view.unreachable.insert(unreachable.begin(), unreachable.end());
  return view;
}

}  // namespace switchboard::agents::pipe
