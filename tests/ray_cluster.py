"""A real multi-node Ray cluster on one machine, for tests: a head and worker nodes started
with ``ray start``, each in a network namespace of its own (its own address on a bridge, its
own Ray temporary folder), so Ray sees separate hosts. Traffic goes only to loopback and to
the addresses given here. Needs root (``ip netns``, ``ip link``); ``NetnsCluster.why_not()``
says why it cannot run, for a test to fail with.

    with NetnsCluster(workers=2) as cluster:
        cluster.submit(["dhim-ray", "train", ...])     # ray job submit, runs on the head
        uri = cluster.start_milvus()                     # a Milvus server on a host of its own
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Where `ip netns exec` finds the files it mounts over a namespace's /etc.
ETC_NETNS = Path("/etc/netns")


def _run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, **kw)


class NetnsCluster:
    """Head (no CPUs for tasks: the work goes to the workers) and ``workers`` nodes of ``cpus``
    logical CPUs each, on the bridge ``<prefix>br`` at ``subnet``.1 (this host)."""

    def __init__(self, workers: int = 2, cpus: int = 2, prefix: str = "drc", subnet: str = "10.77.0"):
        self.prefix, self.subnet, self.cpus = prefix, subnet, cpus
        self.nodes = [f"{prefix}-head"] + [f"{prefix}-w{i}" for i in range(1, workers + 1)]
        self.hosts = [*self.nodes, f"{prefix}-milvus"]  # Ray's nodes, then the Milvus server's host
        self.ips = {n: f"{subnet}.{i + 2}" for i, n in enumerate(self.hosts)}
        self.bridge = f"{prefix}br"
        self.root = Path(tempfile.mkdtemp(prefix="dhim-ray-cluster-"))
        self.head_ip = self.ips[self.nodes[0]]
        self.driver_only = self.root / "driver-only"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head_ip}:8265"

    @staticmethod
    def why_not() -> str | None:
        """Why this machine cannot run the cluster (None: it can)."""
        if sys.platform != "linux" or shutil.which("ip") is None or shutil.which("ray") is None:
            return "needs Linux with the ip command and Ray's ray command"
        probe = _run(["ip", "netns", "add", "drc-probe"], check=False)
        if probe.returncode != 0:
            return f"cannot create a network namespace here (ip netns add: {probe.stderr.strip()[:120]}); run as root"
        _run(["ip", "netns", "del", "drc-probe"], check=False)
        return None

    def netns(self, node: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return _run(["ip", "netns", "exec", node, *cmd], **kw)

    def _host(self, node: str) -> None:
        """A namespace on the bridge with its address: a host of its own."""
        i = self.hosts.index(node)
        outside, inside = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
        # `ip netns exec` mounts /etc/netns/<node>/* over /etc/: each host knows the cluster's
        # names, and its name lookups stay on loopback (with the machine's own name server, which
        # no namespace reaches, each reverse lookup of a peer, as torch's process group makes,
        # waited out its time-outs: 10 s a lookup)
        etc = ETC_NETNS / node
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n"
                                   + "".join(f"{ip} {name}\n" for name, ip in self.ips.items()))
        (etc / "resolv.conf").write_text("# no name server: the cluster's names are in hosts\n")
        _run(["ip", "netns", "add", node])
        _run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside])
        _run(["ip", "link", "set", inside, "netns", node])
        _run(["ip", "link", "set", outside, "master", self.bridge])
        _run(["ip", "link", "set", outside, "up"])
        self.netns(node, ["ip", "addr", "add", f"{self.ips[node]}/24", "dev", inside])
        self.netns(node, ["ip", "link", "set", inside, "up"])
        self.netns(node, ["ip", "link", "set", "lo", "up"])
        self.netns(node, ["ip", "route", "add", "default", "via", f"{self.subnet}.1"])

    def start_milvus(self, timeout: float = 240) -> str:
        """A Milvus server (tests/milvus_server.py) on a host of its own; returns its URI."""
        import socket

        node = self.hosts[-1]
        self._host(node)
        with open(self.root / "milvus.log", "w") as log:  # the child keeps its own copy of the file
            subprocess.Popen(["ip", "netns", "exec", node, sys.executable,
                              str(Path(__file__).with_name("milvus_server.py")), str(self.root / "milvus")],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.ips[node], 19530), timeout=2).close()
                return f"http://{self.ips[node]}:19530"
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"Milvus did not start on {self.ips[node]} in {timeout:.0f} s: see {self.root / 'milvus.log'}")

    def start(self) -> NetnsCluster:
        self.stop(quiet=True)  # what a killed earlier run left
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for node in self.nodes:
            self._host(node)
        env = self.env()
        head = self.nodes[0]
        # The head (where submitted jobs' drivers run) has a folder of its own, driver_only: a
        # tmpfs in a mount namespace of its own, which the worker nodes see as an empty folder.
        self.driver_only.mkdir(parents=True, exist_ok=True)
        start_head = " ".join(["ray", "start", "--head", f"--node-ip-address={self.head_ip}", "--port=6379",
                               "--num-cpus=0", "--dashboard-host=0.0.0.0", "--disable-usage-stats",
                               f"--temp-dir={self.root / 'head'}"])
        self.netns(head, ["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f"mount -t tmpfs dhim-ray-driver-only {self.driver_only} && exec {start_head}"],
                   env=env, timeout=180)
        for node in self.nodes[1:]:
            self._start_worker(node)
        self.wait_for_nodes(len(self.nodes))
        return self

    def _start_worker(self, node: str) -> None:
        self.netns(node, ["ray", "start", f"--address={self.head_ip}:6379", f"--node-ip-address={self.ips[node]}",
                          f"--num-cpus={self.cpus}", "--disable-usage-stats"], env=self.env(), timeout=180)

    def revive_node(self, node: str) -> None:
        """A killed worker node back: a new raylet on the same host joins the cluster."""
        self.kill_node(node)
        self._start_worker(node)
        self.wait_for_nodes(len(self.nodes))

    def env(self) -> dict[str, str]:
        # The head's GCS checks each node every second, not every 3 s: a killed node (its raylet's
        # port refuses at once) is declared dead after 5 refusals, 5 s instead of 15; a node that is
        # only slow still has 5 x 10 s to answer.
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_health_check_period_ms="1000")
        env.pop("RAY_ADDRESS", None)
        return env

    def alive_nodes(self) -> list[dict]:
        code = ("import json, ray; from ray.util.state import list_nodes; "
                f"print(json.dumps([dict(ip=n.node_ip, state=n.state, id=n.node_id) for n in list_nodes(address='{self.dashboard}')]))")
        out = _run([sys.executable, "-c", code], check=False, env=self.env(), timeout=60)
        import json

        try:
            return [n for n in json.loads(out.stdout.strip().splitlines()[-1]) if n["state"] == "ALIVE"]
        except (ValueError, IndexError):
            return []

    def wait_for_nodes(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.alive_nodes()) >= n:
                return
            time.sleep(2)
        raise RuntimeError(f"the cluster did not reach {n} nodes in {timeout:.0f} s")

    def submit(self, entrypoint: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
        """``ray job submit`` to the head's dashboard; waits for the job and returns its run."""
        return _run(["ray", "job", "submit", f"--address={self.dashboard}", "--", *entrypoint], check=False,
                    env=self.env(), timeout=timeout)

    def kill_node(self, node: str, signal: str = "KILL") -> None:
        """Every process of ``node`` (its raylet, workers, ...), as a host that dies."""
        for pid in _run(["ip", "netns", "pids", node], check=False).stdout.split():
            subprocess.run(["kill", f"-{signal}", pid], capture_output=True)

    def stop(self, quiet: bool = False) -> None:
        """Ray stopped on every node, every process of the namespaces killed, the links and
        namespaces removed: also after a failed test."""
        # Not `ray stop`: it finds Ray's processes by name on the whole host and would stop
        # every other Ray there (a test session's own included); a namespace's processes are its own.
        names = _run(["ip", "netns", "list"], check=False).stdout
        nodes = [n for n in self.hosts if n in names]
        for node in nodes:
            self.kill_node(node, "TERM")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_run(["ip", "netns", "pids", n], check=False).stdout.strip()
                                                  for n in nodes):
            time.sleep(0.5)
        for node in nodes:
            self.kill_node(node)
            _run(["ip", "netns", "del", node], check=False)
        for node in self.hosts:
            shutil.rmtree(ETC_NETNS / node, ignore_errors=True)
        if ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
            ETC_NETNS.rmdir()
        for i in range(len(self.hosts)):
            _run(["ip", "link", "del", f"{self.prefix}v{i}"], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        if not quiet:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> NetnsCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
