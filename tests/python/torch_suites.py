"""PyTorch's own agent-agnostic RPC suites on SWITCHBOARD, and on TENSORPIPE in
the same command.

torch.testing._internal.distributed.rpc_utils.GENERIC_TESTS (PyTorch 2.11:
RpcTest, DistAutogradTest, JitRpcTest, RemoteModuleTest, DistOptimizerTest,
JitDistAutogradTest, DdpUnderDistAutogradTest, DdpComparisonTest,
ThreeWorkersRemoteModuleTest, ParameterServerTest,
ReinforcementLearningRpcTest: 366 tests), or with --suite cuda its
GENERIC_CUDA_TESTS (CudaRpcTest, CudaDistAutogradTest, CudaRemoteModuleTest,
CudaDdpComparisonTest: 9 tests; those that need more GPUs than the machine
has skip themselves), or with --suite tensorpipe the TENSORPIPE_TESTS that
test behaviour rather than TensorPipe's options (TensorPipeAgentRpcTest,
TensorPipeAgentDistAutogradTest less TENSORPIPE_OPTIONS_TESTS below: dynamic
groups, RRef timeouts, sparse tensors), are instantiated once per agent with generate_tests(),
as PyTorch's own test_tensorpipe_agent.py does, with a fixture that names
the backend and its options.

  torch_suites.py [--backend switchboard|tensorpipe|both]
                  [--suite generic|cuda|tensorpipe]...
                  [--subset] [-k TEXT]... [--list]

--subset runs the few tests of each class that tools/test runs (SUBSET below);
-k keeps the tests whose id contains TEXT (any of them). Every test's result
is printed, then one line per backend ("switchboard: P passed, F failed, S
skipped of N"), then the Catch2-style line tools/test counts.
"""

import argparse
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.distributed.rpc as rpc  # noqa: E402
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import (  # noqa: E402
    RpcAgentTestFixture,
)
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (  # noqa: E402
    TensorPipeRpcAgentTestFixture,
)
from torch.testing._internal.distributed.rpc_utils import (  # noqa: E402
    GENERIC_CUDA_TESTS,
    GENERIC_TESTS,
    TENSORPIPE_TESTS,
    generate_tests,
)

import switchboard.torch_rpc  # noqa: E402,F401  (registers SWITCHBOARD)
from summary import run_and_summarize  # noqa: E402


class SwitchboardRpcAgentTestFixture(RpcAgentTestFixture):
    @property
    def rpc_backend(self):
        return rpc.backend_registry.BackendType["SWITCHBOARD"]

    @property
    def rpc_backend_options(self):
        # The tests' workers talk over 127.0.0.1 only.
        return rpc.backend_registry.construct_rpc_backend_options(
            self.rpc_backend, init_method=self.init_method, listen_address="127.0.0.1")

    def get_shutdown_error_regex(self):
        # What a call to a worker that shut down, or that this worker lost,
        # fails with (torch_agent.cc's failure_text and PIPE's errors).
        error_regexes = [
            "RPC to .* failed",
            "shut down",
            "lost its connection",
            "ConnectionError",
            "is shut down: cannot send",
            "Cancelled",
            "cancelled",
        ]
        return "|".join("({})".format(e) for e in error_regexes)

    def get_timeout_error_regex(self):
        return "RPC ran for more than"


SUITES = {"generic": GENERIC_TESTS, "cuda": GENERIC_CUDA_TESTS, "tensorpipe": TENSORPIPE_TESTS}

# TENSORPIPE_TESTS' cases about TensorPipeRpcBackendOptions itself (its type
# check, the backend inferred from it, its fields and their types): they
# construct TensorPipe's options by name, so they say nothing about another
# backend. The rest (dynamic groups, RRef timeouts, invalid arguments,
# sparse tensors, autograd over sparse tensors) test behaviour and run on
# both.
TENSORPIPE_OPTIONS_TESTS = {
    "test_mismatched_type_for_options",
    "test_infer_backend_from_options",
    "test_set_and_get_num_worker_threads",
    "test_tensorpipe_set_default_timeout",
    "test_tensorpipe_options_throw_on_timedelta_timeout",
}
for _suite in SUITES.values():
    globals().update(generate_tests("Switchboard", SwitchboardRpcAgentTestFixture, _suite, __name__))
    globals().update(generate_tests("TensorPipe", TensorPipeRpcAgentTestFixture, _suite, __name__))

# A few tests of each class: calls, RRefs, errors, timeouts, shutdown,
# autograd, the optimizer, TorchScript, RemoteModule, DDP. DdpComparisonTest
# has none: with Python 3.11, torch 1.13's DistributedDataParallel fails to
# import torch.distributed._shard (a dataclass with a mutable default), on
# every backend.
SUBSET = {
    "RpcTest": [
        "test_self_add",
        "test_add_with_id",
        "test_py_built_in",
        "test_nested_rpc",
        "test_py_raise_in_user_func",
        "test_rref_forward_chain",
        "test_rpc_timeouts",
        "test_wait_all_workers_timeout",
        "test_local_shutdown",
        "test_multi_layer_nested_async_rpc",
    ],
    "DistAutogradTest": [
        "test_backward_simple",
        "test_error_in_context",
        "test_backward_rref_nested",
    ],
    "DistOptimizerTest": ["test_dist_optim"],
    "JitRpcTest": ["test_rref_as_arg_and_return", "test_torchscript_functions_not_supported",
                   "test_call_script_function_that_raises_remotely_from_script"],
    "JitDistAutogradTest": ["test_get_gradients"],
    "RemoteModuleTest": ["test_send_remote_module_with_a_new_attribute_not_pickled_over_the_wire",
                         "test_remote_module_py_pickle_not_supported"],
    "ThreeWorkersRemoteModuleTest": ["test_send_remote_module_over_the_wire"],
    "DdpUnderDistAutogradTest": ["test_backward_no_ddp"],
    "ParameterServerTest": ["test_batch_updating_parameter_server"],
    "ReinforcementLearningRpcTest": ["test_rl_rpc"],
    # --suite tensorpipe: a dynamic worker meeting a static group, an RRef
    # proxy call that times out while its owner still runs it (the leak
    # check at shutdown), sparse tensors through calls and autograd.
    "TensorPipeAgentRpcTest": ["test_dynamic_and_static_init_rpc_together",
                               "test_rref_proxy_timeout", "test_send_to_rank_sparse"],
    "TensorPipeAgentDistAutogradTest": ["test_backward_simple_sparse"],
}

BACKENDS = {"switchboard": "Switchboard", "tensorpipe": "TensorPipe"}


def selected_tests(backends, suites, subset, patterns):
    loader = unittest.TestLoader()
    tests = []
    for backend, suite in ((b, s) for b in backends for s in suites):
        prefix = BACKENDS[backend]
        for test_class in SUITES[suite]:
            generated = globals()[prefix + test_class.__name__]
            names = loader.getTestCaseNames(generated)
            if subset:
                names = [n for n in names if n in SUBSET.get(test_class.__name__, [])]
            if suite == "tensorpipe":
                names = [n for n in names if n not in TENSORPIPE_OPTIONS_TESTS]
            for name in names:
                test = generated(name)
                if patterns and not any(p in test.id() for p in patterns):
                    continue
                tests.append(test)
    return tests


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["switchboard", "tensorpipe", "both"], default="both")
    parser.add_argument("--suite", choices=sorted(SUITES), action="append", dest="suites")
    parser.add_argument("--subset", action="store_true")
    parser.add_argument("-k", action="append", default=[], dest="patterns")
    parser.add_argument("--list", action="store_true")
    args, _ = parser.parse_known_args()
    backends = ["switchboard", "tensorpipe"] if args.backend == "both" else [args.backend]
    tests = selected_tests(backends, args.suites or ["generic"], args.subset, args.patterns)
    if args.list:
        for t in tests:
            print(t.id())
        return 0
    # torch's MultiProcessTestCase reads sys.argv: keep only the script.
    sys.argv = sys.argv[:1]
    results = {}

    class Recording(unittest.TextTestResult):
        def _record(self, test, outcome):
            backend = "switchboard" if ".Switchboard" in test.id() else "tensorpipe"
            results.setdefault(backend, {}).setdefault(outcome, []).append(test.id())

        def addSuccess(self, test):
            super().addSuccess(test)
            self._record(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._record(test, "failed")

        def addError(self, test, err):
            super().addError(test, err)
            self._record(test, "failed")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._record(test, "skipped")

    status = run_and_summarize(unittest.TestSuite(tests), result_class=Recording)
    for backend in backends:
        r = results.get(backend, {})
        n = sum(len(v) for v in r.values())
        print(f"{backend}: {len(r.get('passed', []))} passed, {len(r.get('failed', []))} failed, "
              f"{len(r.get('skipped', []))} skipped of {n}")
    if len(backends) == 2:
        tp_passed = {t.split(".", 1)[1].replace("TensorPipe", "", 1) for t in results.get("tensorpipe", {}).get("passed", [])}
        sb_passed = {t.split(".", 1)[1].replace("Switchboard", "", 1) for t in results.get("switchboard", {}).get("passed", [])}
        for name in sorted(tp_passed - sb_passed):
            print(f"passes on TENSORPIPE only: {name}")
        for name in sorted(sb_passed - tp_passed):
            print(f"passes on SWITCHBOARD only: {name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
