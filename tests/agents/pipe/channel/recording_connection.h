// A Connection for the channel tests: it sends nothing, and records the
// channel messages queued on it (kChannel frames: the tag, then the
// message) for the test to hand to the other end.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/wire/frame.h"
#include "core/message.h"

namespace sbtest {

class RecordingConnection final
    : public switchboard::agents::pipe::transport::Connection {
 public:
  bool enqueue(const switchboard::rpc::Message&, const std::vector<switchboard::Device>&,
               const std::vector<switchboard::agents::pipe::wire::TensorRoute>&,
               bool) override {
    return true;
  }
  bool enqueue_control(switchboard::agents::pipe::wire::FrameKind kind,
                       const uint8_t* payload, size_t size, uint64_t) override {
    REQUIRE(kind == switchboard::agents::pipe::wire::FrameKind::kChannel);
    REQUIRE(size >= 1);
    tags.push_back(payload[0]);
    sent.emplace_back(payload + 1, payload + size);
    return true;
  }
  void start_reading() override {}
  void replay(switchboard::agents::pipe::wire::InboundFrame) override {}
  void close_after_flush() override {}
  bool wait_closed(std::chrono::steady_clock::time_point) override { return true; }
  void close_now() override {}

  // Takes the payloads queued so far (tag, then message), oldest first.
  std::vector<std::vector<uint8_t>> take_payloads() {
    std::vector<std::vector<uint8_t>> out;
    for (size_t i = 0; i < sent.size(); ++i) {
      out.push_back({tags[i]});
      out.back().insert(out.back().end(), sent[i].begin(), sent[i].end());
    }
    tags.clear();
    sent.clear();
    return out;
  }

  // Each message's tag, and the message after it, in the order queued.
  std::vector<uint8_t> tags;
  std::vector<std::vector<uint8_t>> sent;
};

}  // namespace sbtest
