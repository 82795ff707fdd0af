// The NCCL backend without a GPU: the registry hook, the errors a machine
// without a GPU gives, the argument checks and NCCL's names for dtypes and
// reductions (pure functions, no CUDA context), and the CUDA allocator's
// registration. Every case runs everywhere; where a GPU is visible, the
// cases about machines without one print "skipped: <reason>" or check the
// GPU's side instead. The cases that run ranks on GPUs are in
// nccl_process_group_test.cc.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <string>

#include "collective/nccl_process_group.h"
#include "collective/process_group.h"
#include "common/error.h"
#include "core/cuda_allocator.h"
#include "core/tensor.h"
#include "store/hash_store.h"

namespace sb = switchboard;
using Catch::Matchers::Contains;
using sb::Device;
using sb::DType;
using sb::Tensor;
using sb::collective::NcclOptions;
using sb::collective::NcclProcessGroup;
using sb::collective::ReduceOp;
using namespace std::chrono_literals;

TEST_CASE("Linking the NCCL backend fills the hook, which says why it is unavailable",
          "[nccl][nogpu]") {
  const auto& hook = sb::collective::detail::nccl_hook();
  REQUIRE(hook.create);
  REQUIRE(hook.available);
  std::string why;
  const bool available = hook.available(&why);
  CHECK(available == (sb::cuda_device_count() > 0));
  if (!available) {
    CHECK(why == sb::cuda_unavailable_reason());
    CHECK_THAT(why, Contains("no CUDA device visible"));
    CHECK_THAT(why, Contains("cudaGetDeviceCount"));
  }
}

TEST_CASE("cuda_device_count and cuda_unavailable_reason agree and never throw",
          "[nccl][nogpu]") {
  int count = -1;
  std::string reason;
  REQUIRE_NOTHROW(count = sb::cuda_device_count());
  REQUIRE_NOTHROW(reason = sb::cuda_unavailable_reason());
  CHECK(count >= 0);
  CHECK(reason.empty() == (count > 0));
  INFO("CUDA devices: " << count << "; reason: " << reason);
}

TEST_CASE(
    "Without a GPU, creating an NCCL group fails with the reason, before any rendezvous",
    "[nccl][nogpu]") {
  if (sb::cuda_device_count() > 0) {
    WARN("skipped: a CUDA device is visible; this case checks machines without one");
    fmt::print("skipped: a CUDA device is visible; this case checks machines without one\n");
    return;
  }
  sb::HashStore store;
  NcclOptions options;
  options.group_name = "trainers";
  options.timeout = 1s;
  try {
    NcclProcessGroup pg(store, 1, 2, options);
    FAIL("constructing an NcclProcessGroup without a GPU did not throw");
  } catch (const sb::Error& e) {
    CHECK(e.code() == sb::ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Contains("group \"trainers\"") && Contains("rank 1 of 2") &&
                             Contains(sb::cuda_unavailable_reason()));
  }
  CHECK(store.num_keys() == 0);

  sb::collective::GroupInit init{store, 0, 1, "via-hook", 1000ms};
  CHECK_THROWS_MATCHES(sb::collective::detail::nccl_hook().create(init), sb::Error,
                       Catch::Matchers::Predicate<sb::Error>([](const sb::Error& e) {
                         return std::string(e.what()).find("no CUDA device visible") !=
                                std::string::npos;
                       }));
}

TEST_CASE("A rank outside the group is refused before CUDA is consulted",
          "[nccl][nogpu]") {
  sb::HashStore store;
  NcclOptions options;
  options.group_name = "g";
  CHECK_THROWS_AS(NcclProcessGroup(store, 2, 2, options), std::invalid_argument);
  CHECK_THROWS_AS(NcclProcessGroup(store, 0, 0, options), std::invalid_argument);
  CHECK(store.num_keys() == 0);
}

TEST_CASE("A CPU tensor given to NCCL is refused naming its device", "[nccl][nogpu]") {
  const std::string where = "allreduce in group \"g\" (rank 0 of 2)";
  Tensor cpu = Tensor::from_vector<float>({1, 2, 3});
  CHECK_THROWS_MATCHES(
      sb::collective::nccl_checks::on_device(where, cpu, Device::cuda(0)),
      std::invalid_argument,
      Catch::Matchers::Message("allreduce in group \"g\" (rank 0 of 2): tensor "
                               "float32[3] on cpu is on cpu; the "
                               "NCCL backend needs CUDA tensors on cuda:0"));
}

TEST_CASE("A CUDA tensor on another device, undefined or strided, is refused",
          "[nccl][nogpu]") {
  // Descriptors only: nothing here dereferences the pointer or calls CUDA.
  static float fake[8];
  const std::string where = "broadcast in group \"g\" (rank 1 of 2)";
  using sb::collective::nccl_checks::on_device;
  Tensor other = Tensor::from_blob(fake, {4}, DType::kFloat32, Device::cuda(1), nullptr);
  CHECK_THROWS_WITH(
      on_device(where, other, Device::cuda(0)),
      Contains(where) && Contains("is on cuda:1") && Contains("runs on cuda:0"));
  CHECK_THROWS_WITH(on_device(where, Tensor(), Device::cuda(0)),
                    Contains(where) && Contains("undefined"));
  Tensor strided =
      Tensor::from_blob(fake, {2, 2}, DType::kFloat32, Device::cuda(0), nullptr, {1, 2});
  CHECK_THROWS_WITH(on_device(where, strided, Device::cuda(0), "input"),
                    Contains("input") && Contains("not contiguous"));
  Tensor good =
      Tensor::from_blob(fake, {2, 4}, DType::kFloat32, Device::cuda(0), nullptr);
  CHECK_NOTHROW(on_device(where, good, Device::cuda(0)));
}

TEST_CASE("Multi-GPU lists need one tensor per distinct device of one layout",
          "[nccl][nogpu]") {
  static float fake[8];
  const std::string where = "allreduce_multigpu in group \"g\" (rank 0 of 2)";
  using sb::collective::nccl_checks::per_device;
  auto on = [](int device, Tensor::Shape shape = {4}, DType dtype = DType::kFloat32) {
    return Tensor::from_blob(fake, shape, dtype, Device::cuda(device), nullptr);
  };
  CHECK_THROWS_WITH(per_device(where, {}, "tensors"), Contains("tensors is empty"));
  CHECK_THROWS_WITH(per_device(where, {on(0), on(0)}, "tensors"),
                    Contains("tensors[1] is on cuda:0 like an earlier tensor"));
  CHECK_THROWS_WITH(per_device(where, {on(0), on(1, {2})}, "tensors"),
                    Contains("tensors[1] is float32[2] on cuda:1"));
  CHECK_THROWS_WITH(per_device(where, {on(0), on(1, {4}, DType::kInt32)}, "tensors"),
                    Contains("one dtype and shape"));
  CHECK_THROWS_WITH(
      per_device(where, {on(0), Tensor::from_vector<float>({1, 2, 3, 4})}, "inputs"),
      Contains("inputs[1]") && Contains("is on cpu"));
  CHECK_NOTHROW(per_device(where, {on(1), on(0), on(3)}, "tensors"));
}

TEST_CASE("Dtypes and reductions map onto NCCL's, bool as logical OR and AND",
          "[nccl][nogpu]") {
  using sb::collective::nccl_dtype_name;
  using sb::collective::nccl_reduction_name;
  CHECK(nccl_dtype_name(DType::kFloat16) == "ncclFloat16");
  CHECK(nccl_dtype_name(DType::kBFloat16) == "ncclBfloat16");
  CHECK(nccl_dtype_name(DType::kFloat32) == "ncclFloat32");
  CHECK(nccl_dtype_name(DType::kFloat64) == "ncclFloat64");
  CHECK(nccl_dtype_name(DType::kInt8) == "ncclInt8");
  CHECK(nccl_dtype_name(DType::kUInt8) == "ncclUint8");
  CHECK(nccl_dtype_name(DType::kInt32) == "ncclInt32");
  CHECK(nccl_dtype_name(DType::kInt64) == "ncclInt64");
  CHECK(nccl_dtype_name(DType::kBool) == "ncclUint8");

  CHECK(nccl_reduction_name(ReduceOp::kSum, DType::kInt32) == "ncclSum");
  CHECK(nccl_reduction_name(ReduceOp::kProduct, DType::kFloat32) == "ncclProd");
  CHECK(nccl_reduction_name(ReduceOp::kMin, DType::kUInt8) == "ncclMin");
  CHECK(nccl_reduction_name(ReduceOp::kMax, DType::kFloat64) == "ncclMax");
  CHECK(nccl_reduction_name(ReduceOp::kAvg, DType::kBFloat16) == "ncclAvg");
  CHECK(nccl_reduction_name(ReduceOp::kSum, DType::kBool) == "ncclMax");
  CHECK(nccl_reduction_name(ReduceOp::kMax, DType::kBool) == "ncclMax");
  CHECK(nccl_reduction_name(ReduceOp::kProduct, DType::kBool) == "ncclMin");
  CHECK(nccl_reduction_name(ReduceOp::kMin, DType::kBool) == "ncclMin");
  CHECK_THROWS_WITH(nccl_reduction_name(ReduceOp::kAvg, DType::kInt64),
                    Contains("AVG needs a floating dtype") && Contains("int64"));
  CHECK_THROWS_AS(nccl_reduction_name(ReduceOp::kAvg, DType::kBool),
                  std::invalid_argument);
}

TEST_CASE(
    "The CUDA allocator is registered at static init and fails clearly without a GPU",
    "[nccl][nogpu]") {
  CHECK(sb::has_device_allocator());
  Tensor cpu = Tensor::from_vector<int32_t>({1, 2, 3, 4});
  // CPU to CPU needs no CUDA at all.
  Tensor copy = sb::copy_to_cpu(cpu);
  CHECK(copy.equal(cpu));
  CHECK(copy.data() != cpu.data());
  CHECK_THROWS_AS(sb::copy_tensor(Tensor::empty({3}, DType::kInt32), cpu),
                  std::invalid_argument);
  if (sb::cuda_device_count() > 0) {
    Tensor back = sb::copy_to_cpu(sb::copy_to_cuda(cpu, 0));
    CHECK(back.equal(cpu));
    return;
  }
  CHECK_THROWS_MATCHES(Tensor::empty({4}, DType::kFloat32, Device::cuda(0)), sb::Error,
                       Catch::Matchers::Predicate<sb::Error>([](const sb::Error& e) {
                         const std::string what = e.what();
                         return e.code() == sb::ErrorCode::kFailedPrecondition &&
                                what.find("cuda:0") != std::string::npos &&
                                what.find("no CUDA device visible") != std::string::npos;
                       }));
  CHECK_THROWS_AS(sb::copy_to_cuda(cpu, 0), sb::Error);
}
