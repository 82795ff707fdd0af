#include "agents/process_group/link.h"

#include <fmt/format.h>
#include <pthread.h>

#include <deque>

#include "agents/process_group/frame.h"
#include "agents/process_group/wire.h"
#include "collective/gloo_process_group.h"
#include "common/error.h"

namespace switchboard::agents::process_group {

namespace {

using collective::Work;

// Gloo sends or recvs one peer's sender or listener posts at a time.
constexpr size_t kMaxPosted = 8;

}  // namespace

ProcessGroupLink::ProcessGroupLink(std::string agent_name,
                                   std::unique_ptr<collective::GlooProcessGroup> group)
    : agent_name_(std::move(agent_name)), group_(std::move(group)) {}

ProcessGroupLink::~ProcessGroupLink() = default;

size_t ProcessGroupLink::send(int peer, const rpc::Message& m) {
  auto [header, body] = wire::encode_frame(m);
  std::vector<Tensor> data;
  if (body.defined()) data.push_back(body);
  data.insert(data.end(), m.tensors.begin(), m.tensors.end());
  exchange(peer, /*sending=*/true, {header}, wire::kHeaderTag);
  exchange(peer, /*sending=*/true, data, wire::kDataTag);
  size_t bytes = header.nbytes();
  for (const Tensor& part : data) bytes += part.nbytes();
  return bytes;
}

rpc::Message ProcessGroupLink::receive(int peer, size_t* bytes) {
  Tensor header = Tensor::empty({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  exchange(peer, /*sending=*/false, {header}, wire::kHeaderTag);
  const wire::Header h = wire::decode_header(header);
  Tensor body;
  if (h.body_length() > 0) {
    body = wire::allocate({static_cast<int64_t>(h.body_length())}, DType::kUInt8);
    exchange(peer, /*sending=*/false, {body}, wire::kDataTag);
  }
  rpc::Message m;
  m.type = h.type;
  m.id = h.id;
  wire::decode_body(h, body, m);
  exchange(peer, /*sending=*/false, m.tensors, wire::kDataTag);
  if (bytes != nullptr) {
    *bytes = header.nbytes() + (body.defined() ? body.nbytes() : 0);
    for (const Tensor& t : m.tensors) *bytes += t.nbytes();
  }
  return m;
}

void ProcessGroupLink::exchange(int peer, bool sending, const std::vector<Tensor>& parts,
                                int tag) {
  std::deque<Work> posted;
  for (const Tensor& part : parts) {
    if (part.nbytes() == 0) continue;
    if (posted.size() == kMaxPosted) {
      posted.front().wait(Work::kNoTimeout);
      posted.pop_front();
    }
    ReaderMutexLock lock(mu_);
    if (closed_) {
      throw Error(ErrorCode::kCancelled, fmt::format("rpc agent \"{}\" shut down", agent_name_));
    }
    Tensor t = part;
    posted.push_back(sending ? group_->send(t, peer, tag) : group_->recv(t, peer, tag));
  }
  for (const Work& work : posted) work.wait(Work::kNoTimeout);
}

void ProcessGroupLink::close() {
  WriterMutexLock lock(mu_);
  closed_ = true;
  group_.reset();
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

PeerThread::~PeerThread() {
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void PeerThread::start(const std::string& name, std::shared_ptr<const void> owner,
                       std::function<void()> body) {
  thread_ = std::thread([name, owner = std::move(owner), body = std::move(body)] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    body();
  });
}

void PeerThread::join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

}  // namespace switchboard::agents::process_group
