"""Switchboard as a backend of torch.distributed.rpc.

Importing this module registers ``BackendType.SWITCHBOARD``::

    import torch.distributed.rpc as rpc
    import switchboard.torch_rpc  # noqa: F401  (registers SWITCHBOARD)

    rpc.init_rpc("worker0", rank=0, world_size=2,
                 backend=rpc.BackendType.SWITCHBOARD,
                 rpc_backend_options=switchboard.torch_rpc.SwitchboardRpcBackendOptions(
                     init_method="tcp://10.0.0.1:29500", secret_file="/run/job.secret"))

Everything torch builds on its RpcAgent interface (rpc_sync, rpc_async,
remote and RRefs, distributed autograd, the distributed optimizer,
RemoteModule, TorchScript RPC) runs over Switchboard's PIPE agent. See
docs/torch_rpc.md for the options, what differs from TensorPipe, and the
security rule: a worker refuses to listen beyond loopback without the job
secret unless ``insecure=True``.
"""

import atexit
import functools
import urllib.parse

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api, backend_registry
from torch.distributed.rpc import constants as rpc_constants

from . import _C

__all__ = ["SwitchboardRpcBackendOptions", "BACKEND_NAME"]

BACKEND_NAME = "SWITCHBOARD"


def _device_str(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        raise ValueError(f"SWITCHBOARD: device {device} needs an index (cuda:N)")
    return str(device)


class SwitchboardRpcBackendOptions(rpc.RpcBackendOptions):
    """Options of the SWITCHBOARD backend.

    torch's common ones: ``rpc_timeout`` (seconds; 0 waits for ever),
    ``init_method`` (``tcp://``, ``file://`` or ``env://``), ``num_worker_threads``,
    ``device_maps`` and ``devices`` (as TensorPipe's). Switchboard's own:

    - ``secret_file``: the job secret every connection proves (default: the
      file ``SWITCHBOARD_SECRET_FILE`` names, else none);
    - ``tls_cert_file``, ``tls_key_file``, ``tls_ca_file``: mutual TLS (all
      three or none; default: the ``SWITCHBOARD_TLS_*`` variables);
    - ``shm``: the same-host shared-memory lane on (default) or off;
    - ``heartbeat_interval_ms``, ``heartbeat_timeout_ms`` (0: off): how fast a
      dead or cut-off peer is noticed (defaults 250 and 5000);
    - ``listen_address``: an address or interface name (default: the one that
      routes to the store);
    - ``insecure``: allow listening beyond loopback without a secret.
    """

    def __init__(
        self,
        *,
        num_worker_threads=rpc_constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout=rpc_constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method=rpc_constants.DEFAULT_INIT_METHOD,
        device_maps=None,
        devices=None,
        secret_file=None,
        tls_cert_file=None,
        tls_key_file=None,
        tls_ca_file=None,
        shm=None,
        heartbeat_interval_ms=None,
        heartbeat_timeout_ms=None,
        listen_address=None,
        insecure=False,
    ):
        super().__init__(rpc_timeout=rpc_timeout, init_method=init_method)
        if num_worker_threads < 1:
            raise ValueError(f"SWITCHBOARD: num_worker_threads must be at least 1, not {num_worker_threads}")
        self.num_worker_threads = num_worker_threads
        self.device_maps = {}
        for to, device_map in (device_maps or {}).items():
            self.set_device_map(to, device_map)
        self.devices = []
        if devices:
            self.set_devices(devices)
        self.secret_file = secret_file
        self.tls_cert_file = tls_cert_file
        self.tls_key_file = tls_key_file
        self.tls_ca_file = tls_ca_file
        self.shm = shm
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.listen_address = listen_address
        self.insecure = insecure

    def set_device_map(self, to, device_map):
        """Maps this worker's devices to ``to``'s, as TensorPipe's does: merged
        into what is there; a map that would not be one-to-one is refused."""
        merged = dict(self.device_maps.get(to, {}))
        for src, dst in device_map.items():
            merged[torch.device(src)] = torch.device(dst)
        targets = list(merged.values())
        if len(set(targets)) != len(targets):
            raise ValueError(
                f"SWITCHBOARD: the device map to {to} would not be one-to-one: {merged}")
        self.device_maps[to] = merged

    def set_devices(self, devices):
        self.devices = [torch.device(d) for d in devices]


def _store_host(init_method):
    url = urllib.parse.urlparse(init_method)
    if url.scheme == "tcp":
        return url.hostname or ""
    if url.scheme == "env":
        import os
        return os.environ.get("MASTER_ADDR", "")
    return ""


def _config(name, rank, world_size, options):
    config = _C.AgentConfig()
    config.name = name
    config.rank = rank
    config.world_size = world_size if world_size else None
    config.rpc_timeout_seconds = float(options.rpc_timeout)
    config.init_method = options.init_method
    config.store_host = _store_host(options.init_method)
    config.num_worker_threads = int(options.num_worker_threads)
    config.device_maps = {
        to: {_device_str(s): _device_str(d) for s, d in m.items()}
        for to, m in options.device_maps.items()
    }
    config.devices = [_device_str(d) for d in options.devices]
    config.secret_file = options.secret_file or ""
    config.tls_cert_file = options.tls_cert_file or ""
    config.tls_key_file = options.tls_key_file or ""
    config.tls_ca_file = options.tls_ca_file or ""
    config.shm = options.shm
    if options.heartbeat_interval_ms is not None:
        config.heartbeat_interval_ms = int(options.heartbeat_interval_ms)
    if options.heartbeat_timeout_ms is not None:
        config.heartbeat_timeout_ms = int(options.heartbeat_timeout_ms)
    config.listen_address = options.listen_address or ""
    config.insecure = bool(options.insecure)
    return config


def _construct_rpc_backend_options_handler(
    rpc_timeout,
    init_method,
    num_worker_threads=rpc_constants.DEFAULT_NUM_WORKER_THREADS,
    **kwargs,
):
    return SwitchboardRpcBackendOptions(
        rpc_timeout=rpc_timeout,
        init_method=init_method,
        num_worker_threads=num_worker_threads,
        **kwargs,
    )


def _init_backend_handler(store, name, rank, world_size, rpc_backend_options):
    if not isinstance(store, dist.Store):
        raise TypeError(f"`store` must be a c10d::Store, not {store!r}")
    if not isinstance(rpc_backend_options, SwitchboardRpcBackendOptions):
        raise TypeError(
            "`rpc_backend_options` must be a SwitchboardRpcBackendOptions, not "
            f"{type(rpc_backend_options).__name__}")
    if torch.cuda.is_available() and (rpc_backend_options.devices or rpc_backend_options.device_maps):
        # As TensorPipe: CUDA's state exists before a peer's request needs it.
        torch.cuda.init()
    agent = _C.SwitchboardAgent(store, _config(name, rank, world_size, rpc_backend_options))
    api._init_rpc_states(agent)
    if world_size:
        # As TensorPipe: one round of calls, then a barrier, so that no
        # worker goes on (and perhaps shuts down) before all took part.
        api._all_gather(None, timeout=rpc_backend_options.rpc_timeout)
        agent.join(shutdown=False)
    return agent


_torch_shutdown = api.shutdown


@functools.wraps(_torch_shutdown)
def _shutdown(graceful=True, timeout=rpc_constants.DEFAULT_SHUTDOWN_TIMEOUT):
    """torch's rpc.shutdown, except for a worker of a dynamic SWITCHBOARD group,
    whose graceful shutdown leaves the group while the others go on (torch's
    own path would wait for every worker it saw at init, as in a static
    group: it knows dynamic groups of TensorPipe agents only)."""
    agent = api._get_current_rpc_agent() if api._is_current_rpc_agent_set() else None
    if graceful and isinstance(agent, _C.SwitchboardAgent) and not agent.is_static_group:
        try:
            agent.join(shutdown=True, timeout=timeout)
        finally:
            api._finalize_shutdown()
        return
    return _torch_shutdown(graceful, timeout)


def _stop_at_exit():
    """Stops a SWITCHBOARD agent still running when the interpreter exits (a
    program that never called rpc.shutdown()): ungracefully, as torch's
    shutdown(graceful=False) would, so that the agent's threads are joined
    while the process is whole. Left to the C++ exit handlers, the agent
    would be destroyed after the libraries it logs through, and a thread
    still reporting a lost peer could corrupt the exiting process's heap
    (seen: a worker that hung at exit instead of ending)."""
    if not api._is_current_rpc_agent_set():
        return
    agent = api._get_current_rpc_agent()
    if isinstance(agent, _C.SwitchboardAgent):
        agent.shutdown()


if not backend_registry.backend_registered(BACKEND_NAME):
    atexit.register(_stop_at_exit)
    backend_registry.register_backend(
        BACKEND_NAME,
        _construct_rpc_backend_options_handler,
        _init_backend_handler,
    )
    # register_backend makes a new BackendType enum; torch.distributed.rpc
    # still holds the old one (whose TENSORPIPE init_rpc's default would
    # then fail its own type check), so it gets the new one too.
    rpc.BackendType = backend_registry.BackendType
    api.shutdown = _shutdown
    rpc.shutdown = _shutdown
