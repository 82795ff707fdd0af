// TorchStore: Switchboard's Store interface over a torch c10d::Store, so
// that a worker started by torch.distributed.rpc meets its group through
// the store torch made from init_method (tcp://, file://, env://), as
// TensorPipe does.
//
// Errors, by torch's exception type: c10::DistStoreError (what PyTorch 2.x's
// TCPStore and HashStore throw when a wait or get runs out of time) becomes
// TimeoutError naming the keys, c10::DistNetworkError ConnectionError, any
// other c10::Error Error(kUnavailable), each with torch's message. A wait
// or get that fails after its whole timeout is a TimeoutError whatever
// torch threw: PyTorch 2.11's FileStore (file://, what torch's own RPC tests
// use) throws a plain c10::Error then.
//
// Thread safety: as the wrapped store (c10d's stores are thread-safe).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "store/store.h"

namespace switchboard::torch_rpc {

class TorchStore final : public Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store);

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace switchboard::torch_rpc
