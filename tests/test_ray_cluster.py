"""dhim-ray on a real multi-node Ray cluster: a head and two worker nodes, each in a network
namespace of its own (tests/ray_cluster.py), the commands submitted as Ray jobs as on a real
cluster. Where the machine cannot make namespaces, the test fails saying why; deselect with
-m 'not cluster'."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ray_cluster import NetnsCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    why = NetnsCluster.why_not()
    if why:
        pytest.fail(f"a multi-node Ray cluster cannot run here: {why}; deselect with -m 'not cluster'", pytrace=False)
    with NetnsCluster(workers=2) as c:
        yield c


def actor_nodes(cluster: NetnsCluster, name_part: str) -> set[str]:
    """The addresses of the nodes that ran actors whose class name holds ``name_part``."""
    code = ("import json; from ray.util.state import list_actors, list_nodes; "
            f"ips = {{n.node_id: n.node_ip for n in list_nodes(address='{cluster.dashboard}')}}; "
            f"print(json.dumps([[a.class_name, ips.get(a.node_id)] for a in list_actors(address='{cluster.dashboard}', "
            "limit=10000, detail=True)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cluster.env(), timeout=120)
    actors = json.loads(out.stdout.strip().splitlines()[-1])
    return {ip for name, ip in actors if name_part in (name or "")}


def test_train_submitted_as_a_job_spreads_its_workers_over_both_nodes(cluster, toy_folder, tiny_bert, tmp_path):
    from dhim_ray.hasher import Hasher

    out = tmp_path / "model"
    run = cluster.submit(["dhim-ray", "-v", "train", str(toy_folder), "--encoder", tiny_bert, "--max-words", "12",
                          "--bits", "16", "--epochs", "2", "--workers", "4", "--address", "auto", "--out", str(out),
                          "--storage-path", str(tmp_path / "ray-storage"), "--json"])
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    workers = actor_nodes(cluster, "TrainWorker")
    assert workers == {cluster.ips[n] for n in cluster.nodes[1:]}, workers
    codes = Hasher.load(out).encode(["goal striker league", "vote parliament minister"])
    assert codes.shape == (2, 2)
