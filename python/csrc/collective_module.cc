// switchboard._collective: Switchboard's named collective groups
// (collective/groups.h) for Python, without torch. switchboard.collective
// wraps it; switchboard.ray builds Ray's backend on it.
//
// Built twice from this file (python/BUILD.bazel): _collective, with the
// GLOO backend only, and _collective_cuda, which also links
// //collective:nccl (the NCCL backend, CUDA tensors through DLPack) and so
// needs libnccl.so.2 at import. switchboard.collective imports one of them.
//
// Every op is synchronous, as in Ray: it returns once done on this rank,
// writing results into the caller's arrays, and releases the GIL while it
// waits. Errors become Python exceptions with Switchboard's messages:
// TimeoutError, ConnectionError (a lost peer), PermissionError (a wrong or
// missing job secret), ValueError (bad arguments), RuntimeError (ranks that
// disagree on an op, each side named; the rest).
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collective/groups.h"
#include "collective/registry.h"
#include "common/auth.h"
#include "common/error.h"
#include "python/csrc/py_tensor.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

namespace py = pybind11;
namespace col = switchboard::collective;
using switchboard::Tensor;

namespace {

using Ms = std::chrono::milliseconds;

std::vector<Tensor> borrow_all(const py::sequence& arrays, const char* what) {
  std::vector<Tensor> out;
  out.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    out.push_back(switchboard::py_tensor::borrow(arrays[i], fmt::format("{}[{}]", what, i)));
  }
  return out;
}

col::ReduceOp reduce_op(const std::string& name) {
  for (col::ReduceOp op : {col::ReduceOp::kSum, col::ReduceOp::kProduct, col::ReduceOp::kMin,
                           col::ReduceOp::kMax, col::ReduceOp::kAvg, col::ReduceOp::kBand,
                           col::ReduceOp::kBor, col::ReduceOp::kBxor}) {
    if (col::reduce_op_name(op) == name) return op;
  }
  throw py::value_error(fmt::format(
      "unknown reduce op \"{}\" (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR)", name));
}

std::shared_ptr<const switchboard::Secret> secret_from(const std::optional<std::string>& file) {
  return file ? std::make_shared<const switchboard::Secret>(switchboard::Secret::from_file(*file))
              : switchboard::Secret::from_environment();
}

// Runs `op` without the GIL.
template <typename F>
auto released(F&& op) {
  py::gil_scoped_release nogil;
  return op();
}

}  // namespace

#ifndef SB_COLLECTIVE_MODULE
#define SB_COLLECTIVE_MODULE _collective
#endif

PYBIND11_MODULE(SB_COLLECTIVE_MODULE, m) {
  m.doc() = "Switchboard's collective groups (see switchboard.collective)";

  py::register_exception<switchboard::TimeoutError>(m, "SwitchboardTimeoutError",
                                                    PyExc_TimeoutError);
  py::register_exception<switchboard::ConnectionError>(m, "SwitchboardConnectionError",
                                                       PyExc_ConnectionError);
  py::register_exception<switchboard::AuthenticationError>(m, "SwitchboardAuthenticationError",
                                                           PyExc_PermissionError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  // A store server in this process (rank 0 starts one; the others connect).
  // module_local: _collective and _collective_cuda may both be loaded.
  py::class_<switchboard::TcpStoreServer>(m, "StoreServer", py::module_local())
      .def(py::init([](const std::string& host, uint16_t port,
                       const std::optional<std::string>& secret_file) {
             switchboard::TcpStoreServerOptions options;
             options.host = host;
             options.port = port;
             options.secret = secret_from(secret_file);
             return std::make_unique<switchboard::TcpStoreServer>(options);
           }),
           py::arg("host") = "127.0.0.1", py::arg("port") = 0, py::arg("secret_file") = py::none())
      .def_property_readonly("port", &switchboard::TcpStoreServer::port)
      .def_property_readonly("host", &switchboard::TcpStoreServer::host)
      .def("stop", &switchboard::TcpStoreServer::stop, py::call_guard<py::gil_scoped_release>());

  m.def(
      "backend_available",
      [](const std::string& name) {
        std::string why_not;
        const bool available = col::is_collective_backend_available(name, &why_not);
        return py::make_tuple(available, why_not);
      },
      py::arg("name"),
      "(available, reason): whether the collective backend `name` (GLOO, NCCL, any case) can "
      "run in this process, and if not, why.");
  m.def(
      "write_secret_file",
      [](const std::string& path) { switchboard::Secret::random().write_file(path); },
      py::arg("path"),
      "Writes a new random job secret to `path` (mode 0600), for secret_file= or "
      "SWITCHBOARD_SECRET_FILE on every rank.");
  m.def(
      "init_collective_group",
      [](int world_size, int rank, const std::string& backend, const std::string& group_name,
         int64_t timeout_ms, const std::optional<std::string>& store_host,
         std::optional<uint16_t> store_port, const std::optional<std::string>& secret_file) {
        std::shared_ptr<switchboard::Store> store;
        if (store_host) {
          switchboard::TcpStoreOptions options;
          options.timeout = Ms(timeout_ms);
          options.secret = secret_from(secret_file);
          store = released([&] {
            return std::make_shared<switchboard::TcpStore>(*store_host, store_port.value_or(0),
                                                           options);
          });
        }
        released([&] {
          col::init_collective_group(world_size, rank, backend, group_name, Ms(timeout_ms),
                                     store);
          return 0;
        });
      },
      py::arg("world_size"), py::arg("rank"), py::arg("backend") = "GLOO",
      py::arg("group_name") = col::kDefaultGroupName, py::arg("timeout_ms") = 300'000,
      py::arg("store_host") = py::none(), py::arg("store_port") = py::none(),
      py::arg("secret_file") = py::none());
  m.def("destroy_collective_group", &col::destroy_collective_group,
        py::arg("group_name") = col::kDefaultGroupName,
        py::call_guard<py::gil_scoped_release>());
  m.def("is_group_initialized", &col::is_group_initialized,
        py::arg("group_name") = col::kDefaultGroupName);
  m.def("get_rank", &col::get_rank, py::arg("group_name") = col::kDefaultGroupName,
        py::call_guard<py::gil_scoped_release>());
  m.def("get_collective_group_size", &col::get_collective_group_size,
        py::arg("group_name") = col::kDefaultGroupName,
        py::call_guard<py::gil_scoped_release>());

  m.def(
      "allreduce",
      [](py::handle tensor, const std::string& group_name, const std::string& op) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "allreduce: tensor");
        released([&] { col::allreduce(t, group_name, reduce_op(op)); return 0; });
      },
      py::arg("tensor"), py::arg("group_name") = col::kDefaultGroupName, py::arg("op") = "SUM");
  m.def(
      "broadcast",
      [](py::handle tensor, int src_rank, const std::string& group_name) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "broadcast: tensor");
        released([&] { col::broadcast(t, src_rank, group_name); return 0; });
      },
      py::arg("tensor"), py::arg("src_rank") = 0, py::arg("group_name") = col::kDefaultGroupName);
  m.def(
      "reduce",
      [](py::handle tensor, int dst_rank, const std::string& group_name, const std::string& op) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "reduce: tensor");
        released([&] { col::reduce(t, dst_rank, group_name, reduce_op(op)); return 0; });
      },
      py::arg("tensor"), py::arg("dst_rank") = 0, py::arg("group_name") = col::kDefaultGroupName,
      py::arg("op") = "SUM");
  m.def(
      "allgather",
      [](const py::sequence& outputs, py::handle tensor, const std::string& group_name) {
        std::vector<Tensor> outs = borrow_all(outputs, "allgather: tensor_list");
        Tensor t = switchboard::py_tensor::borrow(tensor, "allgather: tensor");
        released([&] { col::allgather(outs, t, group_name); return 0; });
      },
      py::arg("tensor_list"), py::arg("tensor"), py::arg("group_name") = col::kDefaultGroupName);
  m.def(
      "gather",
      [](const py::sequence& outputs, py::handle tensor, int dst_rank,
         const std::string& group_name) {
        std::vector<Tensor> outs = borrow_all(outputs, "gather: tensor_list");
        Tensor t = switchboard::py_tensor::borrow(tensor, "gather: tensor");
        released([&] { col::gather(outs, t, dst_rank, group_name); return 0; });
      },
      py::arg("tensor_list"), py::arg("tensor"), py::arg("dst_rank") = 0,
      py::arg("group_name") = col::kDefaultGroupName);
  m.def(
      "scatter",
      [](py::handle tensor, const py::sequence& inputs, int src_rank,
         const std::string& group_name) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "scatter: tensor");
        std::vector<Tensor> ins = borrow_all(inputs, "scatter: tensor_list");
        released([&] { col::scatter(t, ins, src_rank, group_name); return 0; });
      },
      py::arg("tensor"), py::arg("tensor_list"), py::arg("src_rank") = 0,
      py::arg("group_name") = col::kDefaultGroupName);
  m.def(
      "reducescatter",
      [](py::handle tensor, const py::sequence& inputs, const std::string& group_name,
         const std::string& op) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "reducescatter: tensor");
        std::vector<Tensor> ins = borrow_all(inputs, "reducescatter: tensor_list");
        released([&] { col::reduce_scatter(t, ins, group_name, reduce_op(op)); return 0; });
      },
      py::arg("tensor"), py::arg("tensor_list"), py::arg("group_name") = col::kDefaultGroupName,
      py::arg("op") = "SUM");
  m.def(
      "alltoall",
      [](const py::sequence& outputs, const py::sequence& inputs, const std::string& group_name) {
        std::vector<Tensor> outs = borrow_all(outputs, "alltoall: output_list");
        std::vector<Tensor> ins = borrow_all(inputs, "alltoall: input_list");
        released([&] { col::alltoall(outs, ins, group_name); return 0; });
      },
      py::arg("output_list"), py::arg("input_list"),
      py::arg("group_name") = col::kDefaultGroupName);
  m.def(
      "barrier", [](const std::string& group_name) { col::barrier(group_name); },
      py::arg("group_name") = col::kDefaultGroupName, py::call_guard<py::gil_scoped_release>());
  m.def(
      "send",
      [](py::handle tensor, int dst_rank, const std::string& group_name, int tag) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "send: tensor");
        released([&] { col::send(t, dst_rank, group_name, tag); return 0; });
      },
      py::arg("tensor"), py::arg("dst_rank"), py::arg("group_name") = col::kDefaultGroupName,
      py::arg("tag") = 0);
  m.def(
      "recv",
      [](py::handle tensor, int src_rank, const std::string& group_name, int tag) {
        Tensor t = switchboard::py_tensor::borrow(tensor, "recv: tensor");
        released([&] { col::recv(t, src_rank, group_name, tag); return 0; });
      },
      py::arg("tensor"), py::arg("src_rank"), py::arg("group_name") = col::kDefaultGroupName,
      py::arg("tag") = 0);
}
