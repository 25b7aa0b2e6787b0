"""The server path against a real Milvus server (PyPI ``milvus`` 2.3.5).

The server listens on all interfaces, so the suite in tests/server runs, with the
server, Ray and its workers, inside a fresh network namespace that has only
loopback (``unshare -n``). Where that is not possible (not root, no ``unshare``, no
``milvus`` package) or the server cannot start, the test FAILS saying why; leave the
server out explicitly with ``-m "not server"``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.server, pytest.mark.slow]


def _namespace_command() -> list[str]:
    if importlib.util.find_spec("milvus") is None:
        pytest.fail("the 'milvus' package is not installed: pip install -e '.[test]', or deselect with -m 'not server'", pytrace=False)
    if sys.platform != "linux" or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("needs Linux with unshare and ip to give the server a network namespace of its own; "
                    "deselect with -m 'not server'", pytrace=False)
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail(f"cannot create a network namespace here (unshare -n: {probe.stderr.decode().strip()[:120]}); "
                    "run as root or deselect with -m 'not server'", pytrace=False)
    inner = f"ip link set lo up && exec {sys.executable} -m pytest tests/server -n 0 -q -p no:cacheprovider -rs --durations=15"
    return ["unshare", "-n", "sh", "-c", inner]


def test_server_suite_in_its_own_network_namespace(bbc16):
    env = dict(os.environ, DHIM_RAY_NETNS="1", RAY_AUTH_MODE="disabled", DHIM_RAY_BBC16=str(bbc16))
    env.pop("MILVUS_TOKEN", None)
    run = subprocess.run(_namespace_command(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    out = run.stdout + run.stderr
    print(out[-6000:])
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    assert run.returncode == 0, out[-6000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 6 and "skipped" not in summary and "failed" not in summary, summary
