// What PIPE workers tell each other at rendezvous (exchanged through the
// static group's store) and in a connection's hello frame. Internal to
// agents/.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agents/pipe/channel/descriptor.h"
#include "core/tensor.h"
#include "rpc/device_map.h"

namespace switchboard::agents::pipe {

using channel::ChannelDescriptor;  // agents/pipe/channel/descriptor.h

struct WorkerAnnouncement {
  std::string name;
  std::string address;
  int port = 0;
  int device_count = 0;
  rpc::DeviceMaps device_maps;
  std::vector<Device> devices;
  // Whether its connections are inside TLS (a group is all TLS or none).
  bool tls = false;
  ChannelDescriptor channels;
};

// msgpack; decode throws ProtocolError (common/error.h) on malformed bytes.
std::vector<uint8_t> encode_announcement(const WorkerAnnouncement& a);
WorkerAnnouncement decode_announcement(const uint8_t* data, size_t size);

// std::invalid_argument naming a name used by several ranks, and the ranks.
void check_unique_names(const std::vector<WorkerAnnouncement>& all);
// std::invalid_argument when `other` uses TLS and `mine` does not, or the
// reverse: such a pair cannot talk, and without this check a dynamic
// joiner would take members that close its connections for members gone.
// `what` says what is being done ("cannot join the dynamic group").
void check_same_tls(const WorkerAnnouncement& mine, const WorkerAnnouncement& other,
                    const std::string& what);

// A hello frame's payload.
//   kStatic    a static group's connecting worker (the higher rank) says who
//              it is;
//   kJoin      a worker joining a dynamic group introduces itself to a
//              member, with its announcement;
//   kWelcome   the member's answer to kJoin: accepted, or refused with the
//              reason (the joiner then aborts its join);
//   kChallenge with a job secret (agents/pipe/handshake.h), the accepting
//              worker's answer to a kStatic or kJoin claim: its nonce and
//              its proof; or, refused, why (no nonce in a claim to a worker
//              with a secret, or a claim with a nonce to one without);
//   kProof     the connecting worker's proof, after it checked the
//              challenge.
struct Hello {
  enum class Kind : int { kStatic = 0, kJoin = 1, kWelcome = 2, kChallenge = 3, kProof = 4 };
  Kind kind = Kind::kStatic;
  int rank = -1;
  std::string name;
  std::vector<uint8_t> announcement;  // kJoin: encode_announcement()
  bool accepted = true;               // kWelcome, kChallenge
  std::string reason;                 // kWelcome, kChallenge, when refused
  std::vector<uint8_t> nonce;         // kStatic, kJoin (with a secret), kChallenge
  std::vector<uint8_t> proof;         // kChallenge, kProof
};

std::vector<uint8_t> encode_hello(const Hello& hello);
// Throws ProtocolError on malformed bytes or an unknown kind.
Hello decode_hello(const std::vector<uint8_t>& payload);

// A dynamic group's members as the Store holds them (written by the holder
// of the membership token): rank and announcement of each.
struct Member {
  int rank = -1;
  WorkerAnnouncement announcement;
};
std::vector<uint8_t> encode_members(const std::vector<Member>& members);
// Throws ProtocolError on malformed bytes.
std::vector<Member> decode_members(const std::vector<uint8_t>& bytes);

// A dynamic group member's word on its links (agents/pipe/partition.h), as
// the store keeps it under dyn/view/<rank>: msgpack [seq, [rank, ...]], a
// counter it moves on at each write and the listed ranks it cannot reach.
struct LinkView {
  uint64_t seq = 0;
  std::set<int> unreachable;
};
std::vector<uint8_t> encode_link_view(const LinkView& view);
// Throws ProtocolError on malformed bytes.
LinkView decode_link_view(const std::vector<uint8_t>& bytes);

}  // namespace switchboard::agents::pipe
