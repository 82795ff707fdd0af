"""A real Ray cluster on test hosts made of network namespaces, for the
ported distributed collective tests (ray_suites.py --suite distributed).

    cluster = NetnsRayCluster(hosts=3, cpus_per_host=3)
    cluster.start()         # `ray start --head` on host 0,
                            # `ray start --address` on the others
    cluster.driver([python, "job.py"])   # run in host 0, RAY_ADDRESS set
    cluster.stop()          # every process, by PID; the namespaces

The hosts follow the C++ tests' NetnsCluster (testkit/netns_cluster.h), and
share its names, so that its sweep also removes a cluster whose process was
killed: namespaces "sbt<pid>-<n>-h<i>", host i at 198.18.0.(i+1)/24 on eth0,
all joined by a bridge in a namespace of their own ("...-sw"). Nothing of
the machine's own network changes. Each host has a default route on eth0, so
that Ray finds its node address as on a real host.

The cluster uses Ray's token authentication with a token of its own
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH under its temporary directory),
which driver() also gives its driver. A driver waits for the nodes itself
(ray.nodes()): `ray start` returns before a node has joined.

Every Ray node runs `ray start --block` in a session of its own; stop()
sends each session SIGTERM, then kills every process still in the
namespaces (`ip netns pids`: actors, raylets, the GCS) and deletes them.

Errors: RuntimeError naming the `ip` or `ray start` that failed, and what
it printed. Needs root and iproute2.
"""

import itertools
import os
import secrets
import signal
import subprocess
import sys
import time

_PREFIX = "sbt"  # testkit/netns_cluster.cc's kPrefix
_next = itertools.count()


def unavailable():
    """Why a cluster cannot be made here; empty when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        return "iproute2's `ip` is not installed"
    return ""


def _ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ray_cluster: `ip {' '.join(args)}` failed "
                           f"(exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout


class NetnsRayCluster:
    def __init__(self, hosts=3, cpus_per_host=3, env=None):
        self.hosts = hosts
        self.cpus_per_host = cpus_per_host
        self.env = dict(env or {})
        self.prefix = f"{_PREFIX}{os.getpid()}-{next(_next)}"
        self.switch = self.prefix + "-sw"
        self.namespaces = [f"{self.prefix}-h{h}" for h in range(hosts)]
        self.temp_dir = f"/tmp/sbray-{self.prefix}"
        # Ray's token authentication, with a token of this cluster's own.
        self.auth_env = {"RAY_AUTH_MODE": "token",
                         "RAY_AUTH_TOKEN_PATH": os.path.join(self.temp_dir, "auth_token")}
        self.nodes = []  # the `ray start --block` processes

    @staticmethod
    def host_address(host):
        return f"198.18.0.{host + 1}"

    @property
    def address(self):
        return f"{self.host_address(0)}:6379"

    @staticmethod
    def _remove_namespace(ns):
        for _ in range(3):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    @classmethod
    def _sweep_stale(cls):
        """Removes the namespaces of clusters whose process is gone."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for name in (line.split()[0] for line in listing.splitlines() if line.strip()):
            owner = name[len(_PREFIX):].split("-", 1)[0]
            if not name.startswith(_PREFIX) or not owner.isdigit():
                continue
            if not os.path.exists(f"/proc/{owner}"):
                cls._remove_namespace(name)

    def _build_network(self):
        self._sweep_stale()
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for h, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            port = f"p{h}n0"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", self.host_address(h) + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "dev", "eth0")

    def _ray_start(self, host, args):
        ray = os.path.join(sys.prefix, "bin", "ray")  # the venv's
        cmd = ["ip", "netns", "exec", self.namespaces[host], ray, "start", "--block",
               f"--node-ip-address={self.host_address(host)}",
               f"--num-cpus={self.cpus_per_host}", "--num-gpus=0",
               "--object-store-memory=100000000", "--disable-usage-stats",
               # A folder per node: in one shared folder, nodes starting
               # together race for their sockets' names.
               f"--temp-dir={self.temp_dir}/h{host}", *args]
        env = dict(os.environ, **self.env, **self.auth_env)
        env.pop("RAY_ADDRESS", None)
        env.pop("RAY_AUTH_TOKEN", None)
        log = open(os.path.join(self.temp_dir, f"ray_start_h{host}.log"), "w")
        self.nodes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def start(self):
        """Builds the hosts and starts Ray on each."""
        os.makedirs(self.temp_dir, exist_ok=True)
        fd = os.open(self.auth_env["RAY_AUTH_TOKEN_PATH"], os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            self._build_network()
            self._ray_start(0, ["--head", "--port=6379", "--include-dashboard=false"])
            for h in range(1, self.hosts):
                self._ray_start(h, [f"--address={self.address}"])
        except BaseException:
            self.stop()
            raise

    def driver(self, argv, env=None):
        """Runs `argv` in host 0, where a driver reaches every node, with
        RAY_ADDRESS naming the cluster, this cluster's token and `env`; waits
        for it and returns its exit status. Raises RuntimeError first if a
        node's `ray start` has exited."""
        self._check_nodes_running()
        full_env = dict(os.environ, **self.env, **self.auth_env, **(env or {}),
                        RAY_ADDRESS=self.address)
        full_env.pop("RAY_AUTH_TOKEN", None)
        return subprocess.run(["ip", "netns", "exec", self.namespaces[0], *argv],
                              env=full_env).returncode

    def _check_nodes_running(self):
        for h, p in enumerate(self.nodes):
            if p.poll() is not None:
                raise RuntimeError(f"ray_cluster: `ray start` on host {h} exited "
                                   f"({p.returncode}); see {self.temp_dir}/ray_start_h{h}.log")

    def stop(self):
        for p in self.nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.nodes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for ns in self.namespaces + [self.switch]:
            self._remove_namespace(ns)
        subprocess.run(["rm", "-rf", self.temp_dir])
