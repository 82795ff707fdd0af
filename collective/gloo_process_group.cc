#include "collective/gloo_process_group.h"

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>  // std::once_flag
#include <optional>
#include <thread>

#include "collective/gloo_monitored_barrier.h"
#include "collective/gloo_ops.h"
#include "collective/gloo_p2p.h"
#include "collective/gloo_same_host.h"
#include "collective/gloo_signature.h"
#include "common/check.h"
#include "common/error.h"
#include "common/listen_address.h"
#include "common/mutex.h"
#include "store/store.h"

namespace switchboard::collective {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo treats its timeout as a deadline for every wait; "no timeout" (0)
// becomes a month, long past any job.
std::chrono::milliseconds gloo_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() == 0) return std::chrono::hours(24 * 30);
  return timeout;
}

// Presents our Store to Gloo's rendezvous under "<prefix>".
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(switchboard::Store& store, std::string prefix,
                   std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, Bytes(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    store_.wait({prefix_ + key}, timeout_);
    const Bytes value = store_.get(prefix_ + key);
    return {value.begin(), value.end()};
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  // Bounded by the group's timeout, not by what Gloo passes: the context's
  // timeout is a fifth of it while connecting (see the constructor).
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& /*gloo_timeout*/) override {
    const std::chrono::milliseconds timeout = timeout_;
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& key : keys) full.push_back(prefix_ + key);
    store_.wait(full, timeout);
  }

 private:
  switchboard::Store& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

gloo::transport::tcp::attr device_attr(const GlooOptions& options) {
  gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
    return attr;
  }
  if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
    return attr;
  }
  ListenAddressRequest request;
  request.component = "Gloo";
  request.aliases = {{"SWITCHBOARD_GLOO_SOCKET_IFNAME"},
                     {"GLOO_SOCKET_IFNAME"},
                     {"SWITCHBOARD_GLOO_HOSTNAME", /*host_name=*/true}};
  attr.hostname = choose_listen_address(request).address;
  return attr;
}

}  // namespace

struct GlooProcessGroup::Impl {
  GlooProcessGroup& group;
  // Receives given up on that Gloo may still deliver into (a
  // monitored_barrier's late ranks). Declared before `context`: destroyed
  // after it. Op thread only.
  std::vector<PostedRecv> kept_buffers;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds op_timeout;
  // peer_addresses[r]: how Gloo names rank r's end of our pair in its
  // errors (set once the mesh is connected; empty for this rank).
  std::vector<std::string> peer_addresses;

  // The op queue, run by `worker` in issue order.
  struct Op {
    Work work;
    std::function<void()> run;
    std::chrono::milliseconds timeout{0};  // the op's Gloo timeout, for its errors
  };
  Mutex mu;
  CondVar cv;
  std::deque<Op> queue SB_GUARDED_BY(mu);
  bool stopping SB_GUARDED_BY(mu) = false;
  uint64_t next_tag SB_GUARDED_BY(mu) = 0;  // collectives issued (their tags: op_tag())
  // Compares the ranks' signatures beside each op (null for a group of one).
  // Used by the op thread only; destroyed after it is joined.
  std::unique_ptr<SignatureWatch> watch;
  // Allreduce, reduce, reduce_scatter, broadcast, allgather and barrier
  // through shared memory when every rank runs on this host (null
  // otherwise). Op thread only.
  std::unique_ptr<SameHostMemory> same_host;
  // The op that runs, for same_host's ops (op thread only).
  SameHostOp running;
  std::function<bool()> watch_failed = [this] { return watch && watch->failed(); };
  std::thread worker;

  // Sends and recvs (made once the group is connected).
  std::unique_ptr<GlooPointToPoint> p2p;

  explicit Impl(GlooProcessGroup& g) : group(g) {}

  void run_worker() SB_EXCLUDES(mu) {
    for (;;) {
      Op op{Work(Work::Info{}), nullptr, op_timeout};
      {
        MutexLock lock(mu);
        cv.wait(mu, [&]() SB_REQUIRES(mu) { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
      }
      try {
        op.run();
        op.work.complete();
      } catch (...) {
        op.work.fail(translate(op.work.info().op, std::current_exception(), op.timeout));
      }
    }
  }

  // `peer`: the one rank the op talks to (a send's or recv's), or -1: then
  // the other rank in a group of two.
  std::exception_ptr translate(
      const std::string& op, std::exception_ptr error,
      std::optional<std::chrono::milliseconds> timeout = std::nullopt,
      int peer = -1) const {
    if (peer < 0 && group.size() == 2) peer = 1 - group.rank();
    return translate_gloo_error(group.where(op), timeout.value_or(op_timeout), error,
                                peer_addresses, peer);
  }

  // Queues `run` (which receives the op's Gloo tag) and returns its Work.
  // Before `run`, the ranks compare their signatures (gloo_signature.h): a
  // mismatch fails the op on every rank instead of reaching Gloo. `timeout`:
  // what `run` gives Gloo (nullopt: op_timeout), for the errors.
  Work enqueue(const std::string& op, OpSignature signature, std::function<void(uint32_t)> run,
               std::optional<std::chrono::milliseconds> timeout = std::nullopt)
      SB_EXCLUDES(mu) {
    Work work(group.work_info(op));
    {
      MutexLock lock(mu);
      if (stopping) {
        throw Error(ErrorCode::kCancelled,
                    fmt::format("{}: the group is shutting down", group.where(op)));
      }
      const uint64_t sequence = next_tag++;
      const auto limit = timeout.value_or(op_timeout);
      queue.push_back(Op{work,
                         [this, run = std::move(run), sequence, limit,
                          signature = std::move(signature)] {
                           run_checked(sequence, signature, limit, run);
                         },
                         limit});
    }
    cv.notify_one();
    return work;
  }

  // Runs an op under its signature's tag while `watch` compares the ranks'
  // signatures (gloo_signature.h); a disagreement wins over the error it
  // causes in the op.
  void run_checked(uint64_t sequence, const OpSignature& signature,
                   std::chrono::milliseconds limit, const std::function<void(uint32_t)>& run) {
    const uint32_t tag = op_tag(sequence, signature);
    running = SameHostOp{signature.op, sequence, tag, &signature, limit, &watch_failed};
    if (!watch) {
      run(tag);
      return;
    }
    watch->begin(sequence, signature, limit);
    std::exception_ptr op_error;
    try {
      run(tag);
    } catch (...) {
      op_error = std::current_exception();
    }
    try {
      watch->end();  // throws when the ranks disagreed or a peer was lost
    } catch (const ConnectionError&) {
      // A peer lost: the op's own error names it better when it watched
      // the peer's pid (same-host ops).
      try {
        if (op_error) std::rethrow_exception(op_error);
      } catch (const PeerExited&) {
        throw;
      } catch (...) {
      }
      throw;
    }
    if (op_error) std::rethrow_exception(op_error);
  }

  std::exception_ptr cancelled(const std::string& op) const {
    return group_destroyed(group.where(op));
  }

  // Fails what has not started, aborts posted sends and recvs, lets the
  // running collective finish (it is bounded by the op timeout) and joins
  // every thread.
  void stop() SB_EXCLUDES(mu) {
    std::deque<Op> queued;
    {
      MutexLock lock(mu);
      stopping = true;
      queued.swap(queue);
    }
    cv.notify_all();
    for (auto& op : queued) op.work.fail(cancelled(op.work.info().op));
    if (p2p) p2p->stop();
    if (worker.joinable()) worker.join();
    watch.reset();
  }

};

namespace {

// Bytes an op's Gloo call overwrites whole: left uninitialized (zeroing
// megabytes that are written next is a pass over memory for nothing).
std::unique_ptr<uint8_t[]> scratch(size_t n) {
  return std::make_unique_for_overwrite<uint8_t[]>(n);
}

// SWITCHBOARD_GLOO_SHM=0 keeps every op on Gloo's TCP.
bool same_host_memory_wanted() {
  const char* value = std::getenv("SWITCHBOARD_GLOO_SHM");
  return value == nullptr || std::string_view(value) != "0";
}

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

// A Gloo context whose transport's timeout can be set after connecting.
// Gloo's unbound-buffer waits that name no timeout (BCUBE's, among them)
// use the transport context's, which connectFullMesh copies from this
// context's at that moment; setTimeout later changes only this one's.
class GroupContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  // The timeout of every later op, this context's and its transport's.
  void set_op_timeout(std::chrono::milliseconds timeout) {
    setTimeout(timeout);
    if (transportContext_) transportContext_->setTimeout(timeout);
  }
};

}  // namespace

GlooProcessGroup::GlooProcessGroup(Store& store, int rank, int size, GlooOptions options)
    : ProcessGroup(rank, size, options.group_name, options.timeout),
      impl_(std::make_unique<Impl>(*this)) {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that exited
  // would kill this process with SIGPIPE instead of failing the op.
  ignore_sigpipe_once();
  impl_->op_timeout = gloo_timeout(options.timeout);
  const std::string where_init = where("rendezvous");
  const auto attr = device_attr(options);
  try {
    impl_->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw ConnectionError(
        fmt::format("{}: cannot create a Gloo TCP device for {} \"{}\": {}", where_init,
                    attr.iface.empty() ? "host" : "interface",
                    attr.iface.empty() ? attr.hostname : attr.iface, e.what()));
  }
  const std::string prefix = options.group_name + "/gloo/";
  GlooStoreAdapter adapter(store, prefix, impl_->op_timeout);
  auto context = std::make_shared<GroupContext>(rank, size);
  // Gloo waits up to five times the context's timeout for a pair's first
  // connect (tcp::Pair::waitUntil): a fifth of ours makes the user's timeout
  // the bound there too. Ops carry their own timeout (opts.setTimeout).
  context->setTimeout(std::max(std::chrono::milliseconds(1), impl_->op_timeout / 5));
  try {
    context->connectFullMesh(adapter, impl_->device);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({prefix + "rank_" + std::to_string(r)})) missing.push_back(r);
    }
    throw TimeoutError(
        fmt::format("{}: timed out after {} ms waiting for ranks [{}] to join",
                    where_init, options.timeout.count(), fmt::join(missing, ", ")));
  } catch (const gloo::Exception& e) {
    throw ConnectionError(
        fmt::format("{}: connecting the full mesh failed "
                    "(timeout {} ms): {}",
                    where_init, options.timeout.count(), e.what()));
  }
  context->set_op_timeout(impl_->op_timeout);
  impl_->peer_addresses =
      exchange_peer_addresses(store, prefix, *context, where_init, options.timeout);
  impl_->context = std::move(context);
  if (size > 1) {
    impl_->watch = std::make_unique<SignatureWatch>(
        impl_->context, [this](std::string_view op) { return where(op); });
    impl_->same_host = SameHostMemory::connect(
        store, prefix, rank, size, options.same_host_memory && same_host_memory_wanted(),
        options.timeout.count() == 0 ? impl_->op_timeout : options.timeout,
        [this](std::string_view op) { return where(op); });
    if (impl_->same_host) {
      spdlog::debug("{}: same-host collectives through {}", where_init,
                    impl_->same_host->describe());
    }
  }
  impl_->p2p = std::make_unique<GlooPointToPoint>(
      GlooPointToPoint::Naming{rank, size,
                               [this](std::string_view op) { return where(op); },
                               [this](std::string_view op) { return work_info(op); }},
      impl_->context, impl_->op_timeout,
      [impl = impl_.get()](const std::string& op, std::exception_ptr error, int peer) {
        return impl->translate(op, std::move(error), std::nullopt, peer);
      });
  impl_->worker = std::thread([impl = impl_.get()] { impl->run_worker(); });
}

GlooProcessGroup::~GlooProcessGroup() { impl_->stop(); }

std::string GlooProcessGroup::device_description() const { return impl_->device->str(); }

bool GlooProcessGroup::same_host_memory() const { return impl_->same_host != nullptr; }

namespace {
constexpr auto kCpu = Device::Type::kCpu;

// Allreduces of up to this many bytes use Gloo's BCUBE algorithm (recursive
// halving and doubling: about log2(size) exchanges of whole chunks), larger
// ones its RING (2 * (size - 1) steps of pipelined segments, each send
// behind a ready notification). For small arrays the steps are the cost:
// each wakes a thread in another process, which on a machine with idle
// cores takes tens to hundreds of microseconds. On 2 cores
// (docs/benchmarks.md, "Ray's collectives"), 2 ranks at 4 KiB to 256 KiB
// took half the time or less with BCUBE, and Ray's 1 MiB allreduce in
// `bench ray` was faster with it; at 64 MiB RING's pipelining matters.
constexpr size_t kBcubeMaxBytes = 1 << 20;

gloo::AllreduceOptions::Algorithm allreduce_algorithm(size_t bytes) {
  return bytes <= kBcubeMaxBytes ? gloo::AllreduceOptions::Algorithm::BCUBE
                                 : gloo::AllreduceOptions::Algorithm::RING;
}
}  // namespace

Work GlooProcessGroup::allreduce(Tensor& tensor, ReduceOp op) {
  const std::string at = where("allreduce");
  checks::tensor(at, tensor, kCpu);
  checks::reduce_op(at, op, tensor.dtype());
  if (size() == 1) return Work::done(work_info("allreduce"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  if (impl_->same_host) {
    return impl_->enqueue("allreduce", OpSignature::of("allreduce", tensor, -1, op),
                          [impl = impl_.get(), tensor, op, n](uint32_t) mutable {
                            impl->same_host->allreduce(tensor, op, impl->running);
                            if (op == ReduceOp::kAvg) {
                              divide_elements(tensor.dtype(), tensor.data(),
                                              static_cast<size_t>(tensor.numel()), n);
                            }
                          });
  }
  return impl_->enqueue("allreduce", OpSignature::of("allreduce", tensor, -1, op),
                        [=](uint32_t tag) {
    if (tensor.nbytes() == 0) return empty_op(context, tag, timeout);
    with_element_type(tensor.dtype(), [&](auto element) {
      using T = decltype(element);
      gloo::AllreduceOptions opts(context);
      opts.setOutput(static_cast<T*>(tensor.data()), static_cast<size_t>(tensor.numel()));
      opts.setAlgorithm(allreduce_algorithm(tensor.nbytes()));
      const DType dtype = tensor.dtype();
      opts.setReduceFunction(
          [op, dtype](void* out, const void* a, const void* b, size_t count) {
            reduce_elements(op, dtype, out, a, b, count);
          });
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::kAvg) {
      divide_elements(tensor.dtype(), tensor.data(), static_cast<size_t>(tensor.numel()),
                      n);
    }
  });
}

Work GlooProcessGroup::broadcast(Tensor& tensor, int src_rank) {
  const std::string at = where("broadcast");
  checks::tensor(at, tensor, kCpu);
  checks::rank(at, src_rank, size(), "src_rank");
  if (size() == 1) return Work::done(work_info("broadcast"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  if (impl_->same_host) {
    return impl_->enqueue("broadcast", OpSignature::of("broadcast", tensor, src_rank),
                          [impl = impl_.get(), tensor, src_rank](uint32_t) mutable {
                            impl->same_host->broadcast(tensor, src_rank, impl->running);
                          });
  }
  return impl_->enqueue("broadcast", OpSignature::of("broadcast", tensor, src_rank),
                        [=](uint32_t tag) {
    if (tensor.nbytes() == 0) return empty_op(context, tag, timeout);
    gloo::BroadcastOptions opts(context);
    opts.setOutput(static_cast<uint8_t*>(tensor.data()), tensor.nbytes());
    opts.setRoot(src_rank);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  });
}

Work GlooProcessGroup::reduce(Tensor& tensor, int dst_rank, ReduceOp op) {
  const std::string at = where("reduce");
  checks::tensor(at, tensor, kCpu);
  checks::rank(at, dst_rank, size(), "dst_rank");
  checks::reduce_op(at, op, tensor.dtype());
  if (size() == 1) return Work::done(work_info("reduce"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  const bool is_root = rank() == dst_rank;
  if (impl_->same_host) {
    return impl_->enqueue(
        "reduce", OpSignature::of("reduce", tensor, dst_rank, op),
        [impl = impl_.get(), tensor, op, dst_rank, is_root, n](uint32_t) mutable {
          impl->same_host->reduce(tensor, op, dst_rank, impl->running);
          if (is_root && op == ReduceOp::kAvg) {
            divide_elements(tensor.dtype(), tensor.data(),
                            static_cast<size_t>(tensor.numel()), n);
          }
        });
  }
  return impl_->enqueue("reduce", OpSignature::of("reduce", tensor, dst_rank, op),
                        [=](uint32_t tag) {
    if (tensor.nbytes() == 0) return empty_op(context, tag, timeout);
    // Gloo's reduce uses its output as scratch on every rank; reduce from a
    // copy so that only dst's tensor changes, as the contract says.
    Tensor scratch = is_root ? tensor : tensor.clone();
    with_element_type(tensor.dtype(), [&](auto element) {
      using T = decltype(element);
      gloo::ReduceOptions opts(context);
      opts.setOutput(static_cast<T*>(scratch.data()),
                     static_cast<size_t>(scratch.numel()));
      const DType dtype = tensor.dtype();
      opts.setReduceFunction(
          [op, dtype](void* out, const void* a, const void* b, size_t count) {
            reduce_elements(op, dtype, out, a, b, count);
          });
      opts.setRoot(dst_rank);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::reduce(opts);
    });
    if (is_root && op == ReduceOp::kAvg) {
      divide_elements(tensor.dtype(), tensor.data(), static_cast<size_t>(tensor.numel()),
                      n);
    }
  });
}

Work GlooProcessGroup::allgather(std::vector<Tensor>& outputs, const Tensor& input) {
  const std::string at = where("allgather");
  checks::tensor(at, input, kCpu);
  checks::list(at, outputs, static_cast<size_t>(size()), input, "outputs", kCpu);
  if (input.nbytes() == 0 && size() == 1) return Work::done(work_info("allgather"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  std::vector<Tensor> outs = outputs;  // aliases of the caller's tensors
  if (impl_->same_host) {
    return impl_->enqueue("allgather", OpSignature::of("allgather", input),
                          [impl = impl_.get(), outs, input](uint32_t) {
                            impl->same_host->allgather(outs, input, impl->running);
                          });
  }
  return impl_->enqueue("allgather", OpSignature::of("allgather", input), [=](uint32_t tag) {
    const size_t chunk = input.nbytes();
    if (chunk == 0) return empty_op(context, tag, timeout);
    const size_t total = chunk * static_cast<size_t>(n);
    auto flat = scratch(total);
    gloo::AllgatherOptions opts(context);
    opts.setInput(static_cast<uint8_t*>(input.data()), chunk);
    opts.setOutput(flat.get(), total);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allgather(opts);
    for (int r = 0; r < n; ++r) {
      std::memcpy(outs[r].data(), flat.get() + chunk * r, chunk);
    }
  });
}

Work GlooProcessGroup::gather(std::vector<Tensor>& outputs, const Tensor& input,
                              int dst_rank) {
  const std::string at = where("gather");
  checks::tensor(at, input, kCpu);
  checks::rank(at, dst_rank, size(), "dst_rank");
  const bool is_root = rank() == dst_rank;
  if (is_root) {
    checks::list(at, outputs, static_cast<size_t>(size()), input, "outputs", kCpu);
  }
  if (input.nbytes() == 0 && size() == 1) return Work::done(work_info("gather"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  std::vector<Tensor> outs = is_root ? outputs : std::vector<Tensor>{};
  return impl_->enqueue("gather", OpSignature::of("gather", input, dst_rank),
                        [=](uint32_t tag) {
    const size_t chunk = input.nbytes();
    if (chunk == 0) return empty_op(context, tag, timeout);
    const size_t total = is_root ? chunk * static_cast<size_t>(n) : 0;
    auto flat = scratch(total);
    gloo::GatherOptions opts(context);
    opts.setInput(static_cast<uint8_t*>(input.data()), chunk);
    if (is_root) opts.setOutput(flat.get(), total);
    opts.setRoot(dst_rank);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::gather(opts);
    for (size_t r = 0; r < outs.size(); ++r) {
      std::memcpy(outs[r].data(), flat.get() + chunk * r, chunk);
    }
  });
}

Work GlooProcessGroup::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                               int src_rank) {
  const std::string at = where("scatter");
  checks::tensor(at, output, kCpu);
  checks::rank(at, src_rank, size(), "src_rank");
  const bool is_root = rank() == src_rank;
  if (is_root) {
    checks::list(at, inputs, static_cast<size_t>(size()), output, "inputs", kCpu);
  }
  if (output.nbytes() == 0 && size() == 1) return Work::done(work_info("scatter"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  std::vector<Tensor> ins = is_root ? inputs : std::vector<Tensor>{};
  return impl_->enqueue("scatter", OpSignature::of("scatter", output, src_rank),
                        [=](uint32_t tag) {
    if (output.nbytes() == 0) return empty_op(context, tag, timeout);
    gloo::ScatterOptions opts(context);
    if (is_root) {
      std::vector<uint8_t*> ptrs;
      for (const auto& t : ins) ptrs.push_back(static_cast<uint8_t*>(t.data()));
      opts.setInputs(ptrs, output.nbytes());
    }
    opts.setOutput(static_cast<uint8_t*>(output.data()), output.nbytes());
    opts.setRoot(src_rank);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::scatter(opts);
  });
}

Work GlooProcessGroup::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                      ReduceOp op) {
  const std::string at = where("reduce_scatter");
  checks::tensor(at, output, kCpu);
  checks::list(at, inputs, static_cast<size_t>(size()), output, "inputs", kCpu);
  checks::reduce_op(at, op, output.dtype());
  if (output.nbytes() == 0 && size() == 1) return Work::done(work_info("reduce_scatter"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  const int me = rank();
  if (impl_->same_host) {
    return impl_->enqueue(
        "reduce_scatter", OpSignature::of("reduce_scatter", output, -1, op),
        [impl = impl_.get(), output, inputs, op, n](uint32_t) mutable {
          impl->same_host->reduce_scatter(output, inputs, op, impl->running);
          if (op == ReduceOp::kAvg) {
            divide_elements(output.dtype(), output.data(),
                            static_cast<size_t>(output.numel()), n);
          }
        });
  }
  return impl_->enqueue("reduce_scatter", OpSignature::of("reduce_scatter", output, -1, op),
                        [=](uint32_t tag) {
    if (output.nbytes() == 0) return empty_op(context, tag, timeout);
    // Allreduce of the concatenated inputs, then keep this rank's chunk.
    const size_t chunk = output.nbytes();
    const size_t count = static_cast<size_t>(output.numel());
    const size_t total = chunk * static_cast<size_t>(n);
    auto flat = scratch(total);
    for (int r = 0; r < n; ++r) {
      std::memcpy(flat.get() + chunk * r, inputs[r].data(), chunk);
    }
    if (n > 1) {
      with_element_type(output.dtype(), [&](auto element) {
        using T = decltype(element);
        gloo::AllreduceOptions opts(context);
        opts.setOutput(reinterpret_cast<T*>(flat.get()), count * n);
        opts.setAlgorithm(allreduce_algorithm(total));
        const DType dtype = output.dtype();
        opts.setReduceFunction(
            [op, dtype](void* out, const void* a, const void* b, size_t k) {
              reduce_elements(op, dtype, out, a, b, k);
            });
        opts.setTag(tag);
        opts.setTimeout(timeout);
        gloo::allreduce(opts);
      });
    }
    std::memcpy(output.data(), flat.get() + chunk * me, chunk);
    if (op == ReduceOp::kAvg) {
      divide_elements(output.dtype(), output.data(), count, n);
    }
  });
}

Work GlooProcessGroup::alltoall(std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& inputs) {
  const std::string at = where("alltoall");
  SB_REQUIRE(!inputs.empty(), "{}: inputs is empty, expected {} tensors", at, size());
  checks::tensor(at, inputs[0], kCpu);
  checks::list(at, inputs, static_cast<size_t>(size()), inputs[0], "inputs", kCpu);
  checks::list(at, outputs, static_cast<size_t>(size()), inputs[0], "outputs", kCpu);
  if (inputs[0].nbytes() == 0 && size() == 1) return Work::done(work_info("alltoall"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  const int n = size();
  std::vector<Tensor> outs = outputs;
  return impl_->enqueue("alltoall", OpSignature::of("alltoall", inputs[0]), [=](uint32_t tag) {
    const size_t chunk = inputs[0].nbytes();
    if (chunk == 0) return empty_op(context, tag, timeout);
    const size_t total = chunk * static_cast<size_t>(n);
    auto in = scratch(total);
    auto out = scratch(total);
    for (int r = 0; r < n; ++r) {
      std::memcpy(in.get() + chunk * r, inputs[r].data(), chunk);
    }
    gloo::AlltoallOptions opts(context);
    opts.setInput(in.get(), total);
    opts.setOutput(out.get(), total);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::alltoall(opts);
    for (int r = 0; r < n; ++r) {
      std::memcpy(outs[r].data(), out.get() + chunk * r, chunk);
    }
  });
}

Work GlooProcessGroup::alltoall_single(Tensor& output, const Tensor& input) {
  const std::string at = where("alltoall_single");
  checks::tensor(at, input, kCpu);
  checks::tensor(at, output, kCpu);
  SB_REQUIRE(output.dtype() == input.dtype() && output.numel() == input.numel(),
             "{}: output {} and input {} differ in dtype or element count", at,
             output.describe(), input.describe());
  SB_REQUIRE(input.dim() >= 1 && input.shape()[0] % size() == 0,
             "{}: input {} needs a dim 0 divisible by the group size {}", at,
             input.describe(), size());
  if (input.nbytes() == 0 && size() == 1) return Work::done(work_info("alltoall_single"));
  auto context = impl_->context;
  const auto timeout = impl_->op_timeout;
  return impl_->enqueue("alltoall_single", OpSignature::of("alltoall_single", input),
                        [=](uint32_t tag) {
    if (input.nbytes() == 0) return empty_op(context, tag, timeout);
    gloo::AlltoallOptions opts(context);
    opts.setInput(static_cast<uint8_t*>(input.data()), input.nbytes());
    opts.setOutput(static_cast<uint8_t*>(output.data()), output.nbytes());
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::alltoall(opts);
  });
}

Work GlooProcessGroup::barrier() { return barrier(impl_->op_timeout); }

Work GlooProcessGroup::barrier(std::chrono::milliseconds timeout) {
  if (size() == 1) return Work::done(work_info("barrier"));
  SB_REQUIRE(timeout.count() > 0, "{}: barrier timeout must be positive, got {} ms",
             where("barrier"), timeout.count());
  auto context = impl_->context;
  if (impl_->same_host) {
    return impl_->enqueue(
        "barrier", OpSignature{"barrier"},
        [impl = impl_.get()](uint32_t) { impl->same_host->barrier(impl->running); },
        timeout);
  }
  return impl_->enqueue(
      "barrier", OpSignature{"barrier"},
      [=](uint32_t tag) {
        gloo::BarrierOptions opts(context);
        opts.setTag(tag);
        opts.setTimeout(timeout);
        gloo::barrier(opts);
      },
      timeout);
}

Work GlooProcessGroup::monitored_barrier(std::chrono::milliseconds timeout,
                                         bool wait_all_ranks) {
  if (size() == 1) return Work::done(work_info("monitored_barrier"));
  SB_REQUIRE(timeout.count() > 0, "{}: timeout must be positive, got {} ms",
             where("monitored_barrier"), timeout.count());
  auto context = impl_->context;
  Impl* impl = impl_.get();
  const std::string at = where("monitored_barrier");
  return impl_->enqueue(
      "monitored_barrier", OpSignature{"monitored_barrier"},
      [=](uint32_t tag) {
        run_monitored_barrier(context, tag, timeout, wait_all_ranks, at, impl->kept_buffers);
      },
      2 * timeout + std::chrono::seconds(5));
}

Work GlooProcessGroup::send(const Tensor& tensor, int dst_rank, int tag) {
  const std::string at = where("send");
  checks::tensor(at, tensor, kCpu);
  checks::rank(at, dst_rank, size(), "dst_rank");
  SB_REQUIRE(dst_rank != rank(), "{}: cannot send to itself", at);
  SB_REQUIRE(tag >= 0, "{}: tag must be >= 0, got {}", at, tag);
  return impl_->p2p->post("send", tensor, dst_rank, tag, /*is_send=*/true);
}

Work GlooProcessGroup::recv_any(Tensor& tensor, int tag) {
  const std::string at = where("recv_any");
  checks::tensor(at, tensor, kCpu);
  SB_REQUIRE(size() > 1, "{}: no other rank to receive from", at);
  SB_REQUIRE(tag >= 0, "{}: tag must be >= 0, got {}", at, tag);
  return impl_->p2p->post("recv_any", tensor, -1, tag, /*is_send=*/false);
}

Work GlooProcessGroup::recv(Tensor& tensor, int src_rank, int tag) {
  const std::string at = where("recv");
  checks::tensor(at, tensor, kCpu);
  checks::rank(at, src_rank, size(), "src_rank");
  SB_REQUIRE(src_rank != rank(), "{}: cannot receive from itself", at);
  SB_REQUIRE(tag >= 0, "{}: tag must be >= 0, got {}", at, tag);
  return impl_->p2p->post("recv", tensor, src_rank, tag, /*is_send=*/false);
}

}  // namespace switchboard::collective
