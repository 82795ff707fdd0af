#include "collective/gloo_signature.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <initializer_list>
#include <set>
#include <cstring>
#include <deque>
#include <functional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::collective {

namespace {

// On the wire: int64 fields. A name's hash stands for the op (the names are
// known on every side); up to kDims extents of the shape travel for the
// error message only.
constexpr int64_t kMagic = 0x53424f50;  // "SBOP"
constexpr size_t kDims = 4;
enum Field : size_t { kMagicField, kOp, kDType, kNumel, kRoot, kReduce, kNdim, kShape };
constexpr size_t kFields = kShape + kDims;

// FNV-1a over the bytes of `values`, continuing from `h`: the same on
// every rank.
constexpr uint64_t kFnvBasis = 1469598103934665603ULL;
uint64_t fnv1a(uint64_t h, std::initializer_list<uint64_t> values) {
  for (uint64_t v : values) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ULL;
  }
  return h;
}

int64_t op_code(const std::string& op) {
  uint64_t h = kFnvBasis;
  for (char c : op) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  return static_cast<int64_t>(h >> 1);
}

std::vector<int64_t> encode(const OpSignature& s) {
  std::vector<int64_t> f(kFields, 0);
  f[kMagicField] = kMagic;
  f[kOp] = op_code(s.op);
  f[kDType] = static_cast<int64_t>(s.dtype);
  f[kNumel] = s.numel;
  f[kRoot] = s.root;
  f[kReduce] = s.reduce_op;
  f[kNdim] = static_cast<int64_t>(s.shape.size());
  for (size_t d = 0; d < std::min(kDims, s.shape.size()); ++d) f[kShape + d] = s.shape[d];
  return f;
}

// The name of the op whose code is `code`: one of the group's ops (they
// are the same on every rank), or "another op".
std::string op_name(int64_t code) {
  static constexpr const char* kOps[] = {
      "allreduce",       "broadcast", "reduce",           "allgather",
      "gather",          "scatter",   "reduce_scatter",   "alltoall",
      "alltoall_single", "barrier",   "monitored_barrier"};
  for (const char* op : kOps) {
    if (op_code(op) == code) return op;
  }
  return "another op";
}

// What another rank's fields say, in words.
std::string describe_fields(const int64_t* f, const OpSignature& mine) {
  OpSignature s;
  s.op = f[kOp] == op_code(mine.op) ? mine.op : op_name(f[kOp]);
  s.dtype = f[kDType] >= 0 && f[kDType] <= static_cast<int64_t>(DType::kBool)
                ? static_cast<DType>(f[kDType])
                : DType::kUInt8;
  s.numel = f[kNumel];
  s.root = static_cast<int>(f[kRoot]);
  s.reduce_op = static_cast<int>(f[kReduce]);
  const int64_t ndim = std::clamp<int64_t>(f[kNdim], 0, 64);
  for (int64_t d = 0; d < std::min<int64_t>(ndim, kDims); ++d) s.shape.push_back(f[kShape + d]);
  std::string text = s.describe();
  if (ndim > static_cast<int64_t>(kDims)) text += fmt::format(" ({} dims)", ndim);
  return text;
}

bool same(const int64_t* a, const int64_t* b) {
  // The shape is for words only: ranks may view the same elements in other
  // shapes, as in PyTorch.
  for (size_t i : {kMagicField, kOp, kDType, kNumel, kRoot, kReduce}) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace

OpSignature OpSignature::of(std::string op, const Tensor& chunk, int root,
                            std::optional<ReduceOp> reduce) {
  OpSignature s;
  s.op = std::move(op);
  s.dtype = chunk.dtype();
  s.numel = chunk.numel();
  s.shape = chunk.shape();
  s.root = root;
  s.reduce_op = reduce ? static_cast<int>(*reduce) : -1;
  return s;
}

std::string OpSignature::describe() const {
  std::string text = op;
  if (reduce_op >= 0 && reduce_op <= static_cast<int>(ReduceOp::kBxor)) {
    text += fmt::format("({})", reduce_op_name(static_cast<ReduceOp>(reduce_op)));
  }
  if (root >= 0) text += fmt::format(" at root {}", root);
  return fmt::format("{} of {}[{}] ({} elements)", text, dtype_name(dtype),
                     fmt::join(shape, ", "), numel);
}

uint32_t op_tag(uint64_t sequence, const OpSignature& s) {
  // The fields same() compares, and only those: ranks that view the same
  // elements in other shapes agree, and must meet.
  const uint64_t h = fnv1a(kFnvBasis, {sequence, static_cast<uint64_t>(op_code(s.op)),
                                       static_cast<uint64_t>(s.dtype),
                                       static_cast<uint64_t>(s.numel),
                                       static_cast<uint64_t>(s.root),
                                       static_cast<uint64_t>(s.reduce_op)});
  // The top bit stays clear: the signatures' own slots are elsewhere.
  return static_cast<uint32_t>((h ^ (h >> 32)) & 0x7fffffffu);
}

uint64_t p2p_slot(int tag, const Tensor& tensor) {
  const uint64_t h = fnv1a(kFnvBasis, {static_cast<uint64_t>(tensor.nbytes()),
                                       static_cast<uint64_t>(tensor.dtype())});
  const uint64_t check = (h ^ (h >> 31)) & 0x7fffffffULL;
  return (uint64_t{1} << 63) | (check << 32) | static_cast<uint32_t>(tag);
}

struct SignatureWatch::Op {
  uint64_t sequence = 0;  // its low 48 bits: the signature slots
  OpSignature mine;
  std::vector<int64_t> fields;  // mine, encoded
  std::chrono::milliseconds timeout{0};
  std::string where;
  // The exchange (kept until the watcher is destroyed: a posted buffer must
  // outlive what Gloo may still deliver into it).
  std::vector<int> peers;
  std::vector<int64_t> received;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs;
  // end() or the destructor let the exchange go (under State::mu): no
  // receive is posted after it.
  bool ended = false;
};

struct SignatureWatch::State {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds suspicion{0};
  std::function<std::string(std::string_view)> where;
  Mutex mu;
  CondVar cv;
  // The op running (begin() to end()): no allocation on this path. `mine`
  // points at the op thread's signature, valid until end(), which waits
  // for the watcher to be done with it.
  bool running SB_GUARDED_BY(mu) = false;
  uint64_t sequence SB_GUARDED_BY(mu) = 0;
  const OpSignature* mine SB_GUARDED_BY(mu) = nullptr;
  std::chrono::milliseconds timeout SB_GUARDED_BY(mu){0};
  std::chrono::steady_clock::time_point started SB_GUARDED_BY(mu);
  std::shared_ptr<Op> probe SB_GUARDED_BY(mu);  // the running op's exchange, once begun
  bool probing SB_GUARDED_BY(mu) = false;       // the watcher waits on `probe`
  // What failed the running op: the ranks disagree, or a peer's
  // connection failed while the op waited.
  std::exception_ptr failure SB_GUARDED_BY(mu);
  bool stopping SB_GUARDED_BY(mu) = false;
  std::vector<std::shared_ptr<Op>> exchanged SB_GUARDED_BY(mu);  // kept, see Op
  std::thread thread;
};

SignatureWatch::SignatureWatch(std::shared_ptr<gloo::rendezvous::Context> context,
                               std::function<std::string(std::string_view)> where,
                               std::chrono::milliseconds suspicion)
    : state_(std::make_unique<State>()) {
  state_->context = std::move(context);
  state_->where = std::move(where);
  state_->suspicion = suspicion;
  state_->thread = std::thread([this] { run(); });
}

SignatureWatch::~SignatureWatch() {
  {
    MutexLock lock(state_->mu);
    state_->stopping = true;
    if (state_->probe) {
      state_->probe->ended = true;
      for (auto& r : state_->probe->recvs) r->abortWaitRecv();
      for (auto& w : state_->probe->sends) w->abortWaitSend();
    }
  }
  state_->cv.notify_all();
  state_->thread.join();
}

void SignatureWatch::begin(uint64_t sequence, const OpSignature& mine,
                           std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(state_->mu);
  state_->running = true;
  state_->sequence = sequence & ((uint64_t{1} << 48) - 1);
  state_->mine = &mine;
  state_->timeout = timeout;
  state_->started = now;
  state_->probe = nullptr;
  state_->failure = nullptr;
}

void SignatureWatch::end() {
  std::exception_ptr failure;
  {
    MutexLock lock(state_->mu);
    // An exchange still waiting (a peer that was never slow) is let go.
    if (state_->probe) {
      state_->probe->ended = true;
      for (auto& r : state_->probe->recvs) r->abortWaitRecv();
      for (auto& w : state_->probe->sends) w->abortWaitSend();
    }
    state_->cv.wait(state_->mu, [&]() SB_REQUIRES(state_->mu) { return !state_->probing; });
    state_->running = false;
    state_->mine = nullptr;
    state_->probe = nullptr;
    failure = std::exchange(state_->failure, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

bool SignatureWatch::failed() const {
  MutexLock lock(state_->mu);
  return state_->failure != nullptr;
}

void SignatureWatch::run() {
  State& s = *state_;
  // How often the watcher looks at the op that runs.
  const auto tick = std::min(s.suspicion, std::chrono::milliseconds(100));
  for (;;) {
    std::shared_ptr<Op> op;
    std::string failed;  // a peer's connection, when posting to it failed
    {
      MutexLock lock(s.mu);
      s.cv.wait_for(s.mu, tick, [&]() SB_REQUIRES(s.mu) { return s.stopping; });
      if (s.stopping) return;
      if (!s.running || s.probe ||
          std::chrono::steady_clock::now() - s.started < s.suspicion) {
        continue;
      }
      op = std::make_shared<Op>();
      op->sequence = s.sequence;
      op->mine = *s.mine;
      op->timeout = s.timeout;
      op->where = s.where ? s.where(op->mine.op) : op->mine.op;
      s.probe = op;
      s.probing = true;
      op->fields = encode(op->mine);
      const uint64_t slot = (uint64_t{0x5342} << 48) | op->sequence;
      for (int r = 0; r < s.context->size; ++r) {
        if (r != s.context->rank) op->peers.push_back(r);
      }
      op->received.assign(kFields * op->peers.size(), 0);
      s.exchanged.push_back(op);
      for (size_t i = 0; i < op->peers.size() && failed.empty(); ++i) {
        try {
          op->sends.push_back(
              s.context->createUnboundBuffer(op->fields.data(), kFields * sizeof(int64_t)));
          op->sends.back()->send(op->peers[i], slot);
        } catch (const std::exception& e) {
          // The peer's connection failed (it died, or the group was
          // aborted): Gloo throws on every send or recv to it. The op
          // waits for others that will not come; it fails now, saying so,
          // and this thread must not end the process with it.
          failed = fmt::format("the connection to rank {} failed (gloo: {})", op->peers[i],
                               e.what());
        }
      }
    }
    if (failed.empty()) {
      exchange(op);
    } else {
      fail_op(op, std::make_exception_ptr(ConnectionError(
                      fmt::format("{}: {}; the group is unusable now: destroy it and make a "
                                  "new one",
                                  op->where, failed))));
    }
    MutexLock lock(s.mu);
    s.probing = false;
    s.cv.notify_all();
  }
}

void SignatureWatch::exchange(const std::shared_ptr<Op>& op) {
  State& s = *state_;
  const uint64_t slot = (uint64_t{0x5342} << 48) | op->sequence;
  // The peers' signatures in the order they come (a receive from any peer
  // not heard from yet, posted again after each; posted under the lock,
  // which end() aborts): a peer that already left the op never sends one,
  // and the first that differs is enough.
  std::set<int> waiting(op->peers.begin(), op->peers.end());
  std::vector<std::string> differ;
  std::string failed;  // posting the receive failed: a peer's connection did
  for (size_t k = 0; !waiting.empty() && differ.empty(); ++k) {
    gloo::transport::UnboundBuffer* recv = nullptr;
    {
      MutexLock lock(s.mu);
      if (op->ended) return;
      try {
        op->recvs.push_back(s.context->createUnboundBuffer(op->received.data() + kFields * k,
                                                           kFields * sizeof(int64_t)));
        op->recvs.back()->recv(std::vector<int>(waiting.begin(), waiting.end()), slot);
        recv = op->recvs.back().get();
      } catch (const std::exception& e) {
        failed = fmt::format("a connection to a peer failed (gloo: {})", e.what());
      }
    }
    if (recv == nullptr) break;
    int from = -1;
    bool complete = false;
    try {
      // Bounded by the op's own timeout; end() and the destructor abort it.
      complete = recv->waitRecv(&from, op->timeout);
    } catch (const std::exception&) {
    }
    if (!complete) return;  // the op ended, or its own error says what happened
    waiting.erase(from);
    const int64_t* theirs = op->received.data() + kFields * k;
    if (!same(op->fields.data(), theirs)) {
      differ.push_back(fmt::format("rank {}: {}", from, describe_fields(theirs, op->mine)));
    }
  }
  if (!failed.empty() && differ.empty()) {
    fail_op(op, std::make_exception_ptr(ConnectionError(
                    fmt::format("{}: {}; the group is unusable now: destroy it and make a new "
                                "one",
                                op->where, failed))));
    return;
  }
  if (differ.empty()) return;  // merely slow
  // Before the connections close, each peer whose signature came gets ours:
  // it is exchanging, and once it finds the disagreement it sends nothing
  // more, so without ours it would only see its connections fail and could
  // not name the sides. Gloo sends ours once the peer posts its receive.
  // A peer not heard from may have left the op: not waited for. No two
  // ranks wait on each other (a peer that heard from us has ours). Bounded
  // by the op's timeout; end() and the destructor abort it.
  for (size_t i = 0; i < op->sends.size(); ++i) {
    if (waiting.contains(op->peers[i])) continue;
    try {
      op->sends[i]->waitSend(op->timeout);
    } catch (const std::exception&) {  // its connection failed: nothing to wait for
    }
  }
  fail_op(op, std::make_exception_ptr(Error(
                  ErrorCode::kFailedPrecondition,
                  fmt::format("{}: the ranks disagree on the op, so it did not run (the group "
                              "is unusable now: destroy it and make a new one): rank {}: {}; {}",
                              op->where, s.context->rank,
                              describe_fields(op->fields.data(), op->mine),
                              fmt::join(differ, "; ")))));
}

void SignatureWatch::fail_op(const std::shared_ptr<Op>& op, std::exception_ptr failure) {
  State& s = *state_;
  {
    MutexLock lock(s.mu);
    s.failure = std::move(failure);
  }
  // The op waits for messages that will not come. Gloo fails every
  // connection of the context when a wait on an unbound buffer times out,
  // which wakes the op's waits: make one time out. A receive from a peer
  // whose connection failed already (it closed first) throws at once and
  // closes nothing, so each peer is tried until one times out; after that
  // every connection is closed and the rest throw at once.
  for (const int peer : op->peers) {
    uint8_t byte = 0;
    try {
      auto probe = s.context->createUnboundBuffer(&byte, 1);
      probe->recv(peer, (uint64_t{0x5343} << 48) | op->sequence);
      probe->waitRecv(nullptr, std::chrono::milliseconds(1));
    } catch (const std::exception&) {  // what it is for (or that pair failed already)
    }
  }
}

}  // namespace switchboard::collective
