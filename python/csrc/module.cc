// switchboard._C: the Python side of the SWITCHBOARD torch RPC backend
// (python/switchboard/torch_rpc.py registers it). Needs torch imported
// first: the agent's base class (RpcAgent) and the store type are torch's
// Python types.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

#include "agents/pipe/address.h"
#include "python/csrc/python_thread_state.h"
#include "python/csrc/torch_agent.h"

namespace py = pybind11;
namespace trpc = torch::distributed::rpc;
using switchboard::torch_rpc::AgentConfig;
using switchboard::torch_rpc::SwitchboardAgent;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Switchboard's torch.distributed.rpc backend (see switchboard.torch_rpc)";
  // The base classes must be registered before ours refers to them.
  py::module_::import("torch.distributed.rpc");

  py::class_<AgentConfig>(m, "AgentConfig")
      .def(py::init<>())
      .def_readwrite("name", &AgentConfig::name)
      .def_readwrite("rank", &AgentConfig::rank)
      .def_readwrite("world_size", &AgentConfig::world_size)
      .def_readwrite("rpc_timeout_seconds", &AgentConfig::rpc_timeout_seconds)
      .def_readwrite("init_method", &AgentConfig::init_method)
      .def_readwrite("store_host", &AgentConfig::store_host)
      .def_readwrite("num_worker_threads", &AgentConfig::num_worker_threads)
      .def_readwrite("device_maps", &AgentConfig::device_maps)
      .def_readwrite("devices", &AgentConfig::devices)
      .def_readwrite("secret_file", &AgentConfig::secret_file)
      .def_readwrite("tls_cert_file", &AgentConfig::tls_cert_file)
      .def_readwrite("tls_key_file", &AgentConfig::tls_key_file)
      .def_readwrite("tls_ca_file", &AgentConfig::tls_ca_file)
      .def_readwrite("shm", &AgentConfig::shm)
      .def_readwrite("heartbeat_interval_ms", &AgentConfig::heartbeat_interval_ms)
      .def_readwrite("heartbeat_timeout_ms", &AgentConfig::heartbeat_timeout_ms)
      .def_readwrite("listen_address", &AgentConfig::listen_address)
      .def_readwrite("insecure", &AgentConfig::insecure);

  py::class_<SwitchboardAgent, trpc::RpcAgent, std::shared_ptr<SwitchboardAgent>>(
      m, "SwitchboardAgent")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, AgentConfig config) {
             return std::make_shared<SwitchboardAgent>(
                 store, std::move(config), std::make_unique<trpc::RequestCallbackImpl>());
           }),
           py::arg("store"), py::arg("config"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("is_static_group", &SwitchboardAgent::is_static_group)
      .def(
          "get_worker_info",
          [](const SwitchboardAgent& agent) { return agent.getWorkerInfo(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const SwitchboardAgent& agent, const std::string& name) {
            return agent.getWorkerInfo(name);
          },
          py::arg("worker_name"), py::call_guard<py::gil_scoped_release>())
      .def(
          "get_worker_info",
          [](const SwitchboardAgent& agent, trpc::worker_id_t id) {
            return agent.getWorkerInfo(id);
          },
          py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def("get_worker_infos", &SwitchboardAgent::getWorkerInfos,
           py::call_guard<py::gil_scoped_release>());

  m.def("_kept_python_thread_states", &switchboard::torch_rpc::kept_python_thread_states,
        "How many Python thread states Switchboard's pool threads keep now (for tests).");
  m.def("resolve_listen_address", &switchboard::agents::pipe::resolve_listen_address,
        py::arg("option"), py::arg("store_host") = "",
        "The address a worker would listen on (the option, the SWITCHBOARD_IFNAME "
        "variable, the address that routes to the store, ...).");
}
