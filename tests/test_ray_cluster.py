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
    return {ip for name, ip in actors if name_part in (name or "") and ip}  # (an actor never placed has none)


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


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """200,000 generated documents of the toy topics (the tiny BERT knows their words)."""
    from conftest import make_toy_corpus, write_csv

    folder = tmp_path_factory.mktemp("big")
    write_csv(folder / "train.csv", make_toy_corpus(50_000, seed=11), header=True)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, toy_folder, tiny_config):
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.training.pipeline import train_corpus

    out = tmp_path_factory.mktemp("tiny-model") / "m"
    train_corpus(CorpusSpec(str(toy_folder)), tiny_config.replace(train={"max_epochs": 1}), out, progress=False)
    return out


def stored_codes(db, collection: str, rows: list[int]):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.retrieval.codes import bytes_to_codes

    target = MilvusTarget(str(db), collection)
    with target.open(create=False) as c:
        got = c.client.query(collection, filter=f"row in {rows}", output_fields=["row", "code"], timeout=60)
    got = sorted(got, key=lambda r: r["row"])
    return bytes_to_codes([bytes(r["code"][0] if isinstance(r["code"], list) else r["code"]) for r in got], 16)


def ingest_job(cluster, corpus, model, db, collection):
    return cluster.submit(["dhim-ray", "-v", "ingest", str(corpus), "--model", str(model), "--uri", str(db),
                           "--collection", collection, "--workers", "2", "--address", "auto", "--json"])


def test_ingest_across_the_cluster_equals_the_single_node_codes(cluster, big_corpus, tiny_model, tmp_path):
    """200,000 documents through encoder actors on both worker nodes into milvus-lite, written
    from the job's driver: exactly one row per document, the codes bit-equal to Hasher.encode
    in this process."""
    import time

    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.hasher import Hasher

    db = tmp_path / "cluster.db"
    t0 = time.monotonic()
    run = ingest_job(cluster, big_corpus, tiny_model, db, "big")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    (tmp_path.parent / "undisturbed_seconds").write_text(str(time.monotonic() - t0))
    summary = json.loads(run.stdout[run.stdout.index('{"collection"'):].split("\n")[0])
    assert summary["verified"] and summary["rows_in_collection"] == 200_000
    print(json.dumps({"ingest_docs_per_s": summary["docs_per_second"], "seconds": summary["seconds"]}))
    assert actor_nodes(cluster, "MapWorker") == {cluster.ips[n] for n in cluster.nodes[1:]}
    rows = [0, 1, 77, 12_345, 199_999]
    texts = CorpusSpec(str(big_corpus)).load_split().texts
    want = Hasher.load(tiny_model).encode([texts[r] for r in rows])
    assert (stored_codes(db, "big", rows) == want).all()


def test_a_worker_node_killed_mid_ingest_loses_no_row(cluster, big_corpus, tiny_model, tmp_path):
    """Kill a worker node (its raylet and every process) about 30% into an ingest: the ingest
    completes on the node left (Ray Data retries the lost work), or a rerun of the same command
    does; either way the collection ends with exactly one row per document."""
    import threading
    import time

    undisturbed = float((tmp_path.parent / "undisturbed_seconds").read_text()) \
        if (tmp_path.parent / "undisturbed_seconds").exists() else 120.0
    db = tmp_path / "killed.db"
    killer = threading.Timer(0.3 * undisturbed, cluster.kill_node, args=(cluster.nodes[2],))
    killer.start()
    t0 = time.monotonic()
    run = ingest_job(cluster, big_corpus, tiny_model, db, "big")
    killer.join()
    first = time.monotonic() - t0
    reran = run.returncode != 0
    if reran:  # the design's second path: the same command again completes it
        run = ingest_job(cluster, big_corpus, tiny_model, db, "big")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    summary = json.loads(run.stdout[run.stdout.index('{"collection"'):].split("\n")[0])
    assert summary["verified"] and summary["rows_in_collection"] == 200_000
    print(json.dumps({"undisturbed_s": round(undisturbed, 1), "killed_run_s": round(first, 1), "reran": reran,
                      "total_s": round(time.monotonic() - t0, 1)}))
