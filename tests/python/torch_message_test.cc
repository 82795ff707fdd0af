// The torch message codec (python/csrc/torch_message.h): what goes out comes
// back the same, and bytes from the network that do not add up are refused
// with a reason, never read out of bounds.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "python/csrc/torch_message.h"

using namespace switchboard;
using Catch::Matchers::Contains;
namespace trpc = torch::distributed::rpc;

namespace {

c10::intrusive_ptr<trpc::Message> sample() {
  std::vector<char> payload = {'p', 'i', 'c', 'k', 'l', 'e'};
  at::Tensor grad = at::ones({2, 3}, at::kFloat);
  grad.set_requires_grad(true);
  std::vector<at::Tensor> tensors = {
      at::arange(12, at::kLong).reshape({3, 4}).t(),  // not contiguous
      grad,
      at::empty({0, 5}, at::kDouble),
      at::scalar_tensor(2.5, at::kBFloat16),
  };
  return c10::make_intrusive<trpc::Message>(std::move(payload), std::move(tensors),
                                            trpc::MessageType::PYTHON_CALL, 0);
}

// The header's bytes after the version, type and count (9 bytes).
constexpr size_t kFirstTensor = 1 + 4 + 4;

}  // namespace

TEST_CASE("a torch message crosses the codec with its type, payload and tensors",
          "[torch_rpc][codec]") {
  const auto original = sample();
  const rpc::Message wire = torch_rpc::encode(*original, rpc::MessageType::kRequest);
  CHECK(wire.type == rpc::MessageType::kRequest);
  REQUIRE(wire.tensors.size() == 4);
  for (const Tensor& t : wire.tensors) CHECK(t.dtype() == DType::kUInt8);
  const auto back = torch_rpc::decode(wire, 42);
  CHECK(back->id() == 42);
  CHECK(back->type() == trpc::MessageType::PYTHON_CALL);
  CHECK(std::string(back->payload().begin(), back->payload().end()) == "pickle");
  REQUIRE(back->tensors().size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const at::Tensor& a = original->tensors()[i];
    const at::Tensor& b = back->tensors()[i];
    CHECK(a.scalar_type() == b.scalar_type());
    CHECK(a.sizes() == b.sizes());
    CHECK(a.strides() == b.strides());  // the transposed one stays transposed
    CHECK(at::equal(a, b));
    CHECK(a.requires_grad() == b.requires_grad());
  }
}

TEST_CASE("bytes from the network that do not add up are refused with the reason",
          "[torch_rpc][codec][hostile]") {
  const rpc::Message good = torch_rpc::encode(*sample(), rpc::MessageType::kRequest);
  auto refused = [](const rpc::Message& m, const std::string& why) {
    CHECK_THROWS_WITH(torch_rpc::decode(m, 1), Contains(why));
  };
  SECTION("every truncation of the header") {
    // The header of the first tensor ends after its sizes and strides (2
    // dims each).
    for (size_t n = 0; n < kFirstTensor + 3 + 32; ++n) {
      rpc::Message m = good;
      m.payload.resize(n);
      CHECK_THROWS_AS(torch_rpc::decode(m, 1), std::invalid_argument);
    }
  }
  SECTION("another version") {
    rpc::Message m = good;
    m.payload[0] = 9;
    refused(m, "codec version 9");
  }
  SECTION("a tensor count that is not what came") {
    rpc::Message m = good;
    m.tensors.pop_back();
    refused(m, "names 4 tensors, 3 came");
  }
  SECTION("a dtype torch does not have") {
    rpc::Message m = good;
    m.payload[kFirstTensor] = 120;
    refused(m, "dtype 120");
  }
  SECTION("unknown flags") {
    rpc::Message m = good;
    m.payload[kFirstTensor + 1] = 0x40;
    refused(m, "unknown flags");
  }
  SECTION("too many dimensions") {
    rpc::Message m = good;
    m.payload[kFirstTensor + 2] = 65;
    refused(m, "65 dimensions");
  }
  SECTION("sizes that ask for more bytes than came, overflow included") {
    rpc::Message m = good;
    const int64_t huge = std::numeric_limits<int64_t>::max();
    std::memcpy(m.payload.data() + kFirstTensor + 3, &huge, sizeof huge);
    refused(m, "bytes, but 96 came");
    const int64_t negative = -1;
    std::memcpy(m.payload.data() + kFirstTensor + 3, &negative, sizeof negative);
    refused(m, "negative size");
  }
  SECTION("strides that reach past the bytes that came, or back") {
    rpc::Message m = good;
    const int64_t far = int64_t{1} << 40;
    std::memcpy(m.payload.data() + kFirstTensor + 3 + 16, &far, sizeof far);
    refused(m, "bytes, but 96 came");
    const int64_t negative = -4;
    std::memcpy(m.payload.data() + kFirstTensor + 3 + 16, &negative, sizeof negative);
    refused(m, "negative stride");
  }
  SECTION("a tensor that is not flat bytes") {
    rpc::Message m = good;
    m.tensors[0] = Tensor::zeros({24}, DType::kFloat32);
    refused(m, "96 bytes");
  }
}

TEST_CASE("a view that spans much more than its elements goes as a compact copy",
          "[torch_rpc][codec]") {
  const at::Tensor big = at::arange(10000, at::kFloat).reshape({100, 100});
  const at::Tensor column = big.select(1, 7);  // stride 100: 100 elements over 9901
  const at::Tensor expanded = at::ones({1}).expand({50});  // stride 0: all one element
  auto m = c10::make_intrusive<trpc::Message>(std::vector<char>{},
                                              std::vector<at::Tensor>{column, expanded},
                                              trpc::MessageType::PYTHON_CALL, 0);
  const rpc::Message wire = torch_rpc::encode(*m, rpc::MessageType::kRequest);
  CHECK(wire.tensors[0].nbytes() == 100 * sizeof(float));
  CHECK(wire.tensors[1].nbytes() == sizeof(float));
  const auto back = torch_rpc::decode(wire, 0);
  CHECK(at::equal(back->tensors()[0], column));
  CHECK(at::equal(back->tensors()[1], expanded));
  CHECK(back->tensors()[1].stride(0) == 0);
}

TEST_CASE("tensors Switchboard cannot carry are refused at encode, naming them",
          "[torch_rpc][codec]") {
  const at::Tensor csr = at::ones({3, 3}).to_sparse_csr();
  const at::Tensor quantized = at::quantize_per_tensor(at::ones({4}), 0.1, 0, at::kQUInt8);
  for (const at::Tensor& bad : {csr, quantized}) {
    INFO(bad.toString());
    std::vector<at::Tensor> tensors = {at::ones({2}), bad};
    auto m = c10::make_intrusive<trpc::Message>(std::vector<char>{}, std::move(tensors),
                                                trpc::MessageType::PYTHON_CALL, 0);
    CHECK_THROWS_WITH(torch_rpc::encode(*m, rpc::MessageType::kRequest),
                      Contains("tensor 1") && Contains("does not carry"));
  }
}

namespace {

// A 4 x 3 x 2 sparse COO tensor (two sparse dims, one dense), its indices
// not coalesced (one repeated, out of order) unless `coalesce`.
at::Tensor sparse_sample(bool coalesce) {
  const at::Tensor indices = at::tensor({2, 0, 2, 1, 2, 1}, at::kLong).reshape({2, 3});
  const at::Tensor values = at::arange(6, at::kFloat).reshape({3, 2});
  at::Tensor t = at::sparse_coo_tensor(indices, values, {4, 3, 2});
  return coalesce ? t.coalesce() : t;
}

rpc::Message sparse_wire(const at::Tensor& t) {
  std::vector<at::Tensor> tensors = {at::ones({2}), t};
  auto m = c10::make_intrusive<trpc::Message>(std::vector<char>{'x'}, std::move(tensors),
                                              trpc::MessageType::PYTHON_CALL, 0);
  return torch_rpc::encode(*m, rpc::MessageType::kRequest);
}

// Where the sparse tensor's parts start in sparse_wire()'s payload: after
// the dense tensor (3 + 16 bytes) and the sparse header (3 + 3 * 8).
constexpr size_t kSparseIndices = kFirstTensor + 3 + 16 + 3 + 24;
constexpr size_t kSparseValues = kSparseIndices + 3 + 32;

}  // namespace

TEST_CASE("a sparse COO tensor crosses as its indices and values, coalesced or not, grad "
          "flag kept",
          "[torch_rpc][codec][sparse]") {
  for (bool coalesce : {false, true}) {
    INFO("coalesced " << coalesce);
    at::Tensor original = sparse_sample(coalesce);
    original.set_requires_grad(true);
    const rpc::Message wire = sparse_wire(original);
    REQUIRE(wire.tensors.size() == 3);  // the dense one, indices, values
    const auto back = torch_rpc::decode(wire, 7);
    REQUIRE(back->tensors().size() == 2);
    const at::Tensor& got = back->tensors()[1];
    CHECK(got.is_sparse());
    CHECK(got.sizes() == original.sizes());
    CHECK(got.sparse_dim() == 2);
    CHECK(got.dense_dim() == 1);
    CHECK(got.is_coalesced() == coalesce);
    CHECK(got.requires_grad());
    CHECK(at::equal(got._indices(), original._indices()));
    CHECK(at::equal(got._values(), original._values().detach()));
    CHECK(at::equal(got.to_dense(), original.detach().to_dense()));
    CHECK(std::string(back->payload().begin(), back->payload().end()) == "x");
  }
}

TEST_CASE("a sparse tensor from the network whose parts disagree, or whose indices fall "
          "outside it, is refused with the reason",
          "[torch_rpc][codec][sparse][hostile]") {
  const rpc::Message good = sparse_wire(sparse_sample(false));
  auto refused = [](const rpc::Message& m, const std::string& why) {
    CHECK_THROWS_WITH(torch_rpc::decode(m, 1), Contains(why));
  };
  SECTION("an index past the size") {
    rpc::Message m = good;
    const std::vector<int64_t> indices = {2, 0, 9, 1, 2, 1};  // row 0: 2, 0, 9
    std::vector<uint8_t> bytes(indices.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), indices.data(), bytes.size());
    m.tensors[1] = Tensor::from_vector(bytes);
    refused(m, "sparse tensor 1 of size [4, 3, 2]");
  }
  SECTION("indices that are not int64") {
    rpc::Message m = good;
    m.payload[kSparseIndices] = static_cast<char>(c10::ScalarType::Int);
    m.tensors[1] = Tensor::zeros({24}, DType::kUInt8);
    refused(m, "indices of Int");
  }
  SECTION("values of another dtype than the header's") {
    rpc::Message m = good;
    m.payload[kSparseValues] = static_cast<char>(c10::ScalarType::Int);
    m.tensors[2] = Tensor::zeros({24}, DType::kUInt8);
    refused(m, "values of Int");
  }
  SECTION("a part that is missing") {
    rpc::Message m = good;
    m.tensors.pop_back();
    refused(m, "needs one more Switchboard tensor than the 2 that came");
  }
  SECTION("a Switchboard tensor left over") {
    rpc::Message m = good;
    m.tensors.push_back(Tensor::zeros({4}, DType::kUInt8));
    refused(m, "take 3 Switchboard tensors, 4 came");
  }
  SECTION("flags on a part, or kCoalesced on a strided tensor") {
    rpc::Message m = good;
    m.payload[kSparseIndices + 1] = torch_rpc::kRequiresGrad;
    refused(m, "a part has flags 0x1");
    m = good;
    m.payload[kFirstTensor + 1] = torch_rpc::kCoalesced;
    refused(m, "unknown flags 0x4");
  }
}
