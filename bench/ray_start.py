"""A local Ray's start beside an open Milvus channel, with grpcio's fork support on (grpcio's
default) and off (what importing dhim_ray sets). Ray starts its GCS and raylet by fork and exec
with a preexec_fn; with fork support on, gRPC restarts its poller in the child, and while a
pymilvus channel is open the child can abort before exec (grpc/grpc#43055): Ray then waits its
fixed 30 s for the process and dhim-ray starts Ray again.

    python -m bench ray_start [--children 1000 --starts 30]   # writes bench/ray_start.json

Two measures, the settings alternating: children forked with Ray's preexec_fn beside a
milvus-lite channel (how many died of a signal before exec), and whole starts, each a fresh
process that opens milvus-lite and then starts Ray as `dhim-ray ingest` does (init_ray).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness import device_name, write_result

SETTINGS = {"fork_support_on": "true", "fork_support_off": "false"}

CHILDREN = """
import collections, signal, subprocess, sys
from dhim_ray.connectors.connection import connect
client = connect(sys.argv[1])  # held, as an ingest holds its collection's
client.list_collections()
ends = collections.Counter(
    subprocess.Popen(["true"], preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})).wait()
    for _ in range(int(sys.argv[2])))
print(dict(ends))  # exit code -> children; a negative code: killed by that signal
"""

START = """
import sys, time
from dhim_ray.connectors.connection import connect
client = connect(sys.argv[1])  # held, as an ingest holds its collection's
client.list_collections()
import ray
from dhim_ray.jobs.ray_env import init_ray
t0 = time.perf_counter()
init_ray(verbose=False)
print(time.perf_counter() - t0)
ray.shutdown()
"""


def _run(code: str, setting: str, *args: str) -> str:
    """The last line ``code`` prints, run in a fresh interpreter with fork support ``setting``."""
    env = dict(os.environ, GRPC_ENABLE_FORK_SUPPORT=setting)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--children", type=int, default=1000, help="children forked per setting")
    ap.add_argument("--starts", type=int, default=30, help="Ray starts per setting")
    args = ap.parse_args()
    result: dict = {"children": args.children, "starts": args.starts}
    with tempfile.TemporaryDirectory() as tmp:
        for name, setting in SETTINGS.items():
            ends = ast.literal_eval(_run(CHILDREN, setting, os.path.join(tmp, f"{name}.db"), str(args.children)))
            result[name] = {"children_killed": sum(n for code, n in ends.items() if code < 0)}
        starts: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for i in range(args.starts):
            for name, setting in SETTINGS.items():
                starts[name].append(float(_run(START, setting, os.path.join(tmp, f"{name}.db"))))
                print(f"{i + 1}/{args.starts} {name}: {starts[name][-1]:.1f} s", flush=True)
                time.sleep(1)
    for name, s in starts.items():
        result[name].update(mean_s=statistics.mean(s), median_s=statistics.median(s), max_s=max(s),
                            over_20_s=sum(x > 20 for x in s))
    result["mean_ratio"] = result["fork_support_on"]["mean_s"] / result["fork_support_off"]["mean_s"]
    result["device"] = device_name("cpu")
    print(json.dumps(result, indent=1))
    write_result("ray_start", result)


if __name__ == "__main__":
    main()
