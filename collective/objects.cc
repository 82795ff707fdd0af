#include "collective/objects.h"

#include <algorithm>
#include <cstring>

namespace switchboard::collective::detail {

namespace {

Tensor bytes_tensor(const std::vector<uint8_t>& bytes, int64_t length) {
  Tensor t = Tensor::zeros({length}, DType::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t, int64_t length) {
  const auto* data = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(data, data + length);
}

}  // namespace

std::vector<std::vector<uint8_t>> allgather_bytes(ProcessGroup& group,
                                                  const std::vector<uint8_t>& mine) {
  const int n = group.size();
  Tensor length = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())});
  std::vector<Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(Tensor::zeros({1}, DType::kInt64));
  group.allgather(lengths, length).wait();
  int64_t longest = 0;
  for (const Tensor& l : lengths) longest = std::max(longest, l.data_as<int64_t>()[0]);
  Tensor padded = bytes_tensor(mine, longest);
  std::vector<Tensor> gathered;
  for (int r = 0; r < n; ++r) gathered.push_back(Tensor::zeros({longest}, DType::kUInt8));
  group.allgather(gathered, padded).wait();
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(bytes_of(gathered[r], lengths[r].data_as<int64_t>()[0]));
  }
  return out;
}

std::vector<uint8_t> broadcast_bytes(ProcessGroup& group, const std::vector<uint8_t>& mine,
                                     int src) {
  checks::rank("broadcast_object_list", src, group.size(), "src");
  Tensor length = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())});
  group.broadcast(length, src).wait();
  const int64_t n = length.data_as<int64_t>()[0];
  Tensor bytes = bytes_tensor(group.rank() == src ? mine : std::vector<uint8_t>{}, n);
  group.broadcast(bytes, src).wait();
  return bytes_of(bytes, n);
}

std::vector<uint8_t> scatter_bytes(ProcessGroup& group,
                                   const std::vector<std::vector<uint8_t>>& inputs, int src) {
  checks::rank("scatter_object_list", src, group.size(), "src");
  const int n = group.size();
  // Every length from src, then each rank's bytes padded to the longest.
  std::vector<int64_t> sizes(n, 0);
  if (group.rank() == src) {
    for (int r = 0; r < n; ++r) sizes[r] = static_cast<int64_t>(inputs[r].size());
  }
  Tensor lengths = Tensor::from_vector(sizes);
  group.broadcast(lengths, src).wait();
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data_as<int64_t>()[r]);
  std::vector<Tensor> chunks;
  if (group.rank() == src) {
    for (int r = 0; r < n; ++r) chunks.push_back(bytes_tensor(inputs[r], longest));
  }
  Tensor out = Tensor::zeros({longest}, DType::kUInt8);
  group.scatter(out, chunks, src).wait();
  return bytes_of(out, lengths.data_as<int64_t>()[group.rank()]);
}

}  // namespace switchboard::collective::detail
