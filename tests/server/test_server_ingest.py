"""Integration with a real Milvus server: Ray workers upserting in parallel into a
BIN_IVF_FLAT collection, exact counts, search through the IVF index, auth by token.

Runs only inside its own network namespace, where tests/test_milvus_server.py
starts it (the server listens on all interfaces). The token reaches the Ray
workers through the environment, as in production."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import train_bbc16
from milvus_server import ROOT_TOKEN, URI, start_server

from dhim_ray.connectors.milvus import CodeCollection, IndexSpec, MilvusTarget
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import CollectionMismatchError
from dhim_ray.search import SearchRequest

pytestmark = pytest.mark.slow  # a real server and real Ray: run by tests/test_milvus_server.py

os.environ["MILVUS_TOKEN"] = ROOT_TOKEN  # before Ray starts, so its workers inherit it

N = 400
BBC = CorpusSpec("bbc", "train", limit=N)
NLIST = 16


@pytest.fixture(scope="session")
def milvus_uri(tmp_path_factory):
    try:
        server = start_server(tmp_path_factory.mktemp("milvus"), authorization=True)
    except Exception as exc:  # no binaries for this platform, a port taken, ...
        pytest.fail(f"a Milvus server could not start here: {exc}", pytrace=False)
    yield URI
    server.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The outer session's 16-bit BBC model (tests/test_milvus_server.py passes it on), else one
    trained here as conftest's bbc16 is."""
    given = os.environ.get("DHIM_RAY_BBC16")
    return Path(given) if given else train_bbc16(tmp_path_factory.mktemp("model") / "bbc-16", 240)


@pytest.fixture(scope="module")
def ingested(ray_session, milvus_uri, model_dir):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target = MilvusTarget(milvus_uri, "dbp16_ivf")
    result = run_ingest(IngestRequest(BBC, model_dir, target, workers=2, index=IndexSpec("BIN_IVF_FLAT", nlist=NLIST), overwrite=True), progress=False)
    return target, result


def stored_rows(target: MilvusTarget, fields: list[str]) -> tuple[list[dict], np.ndarray]:
    """Every row of the collection (its ``fields`` and id), sorted by source row, and their codes."""
    from dhim_ray.codes import bytes_to_codes

    client = target.connect()
    try:
        rows = client.query(target.collection, filter="id >= 0", output_fields=["code", "row", *fields],
                            limit=16384, consistency_level="Strong", timeout=30)
    finally:
        client.close()
    rows = sorted(rows, key=lambda r: r["row"])
    codes = [bytes(r["code"][0] if isinstance(r["code"], list) else r["code"]) for r in rows]
    return rows, bytes_to_codes(codes, 16)


def stored_codes(target: MilvusTarget) -> tuple[list[int], np.ndarray]:
    rows, codes = stored_rows(target, [])
    return [r["row"] for r in rows], codes


def test_parallel_writers_fill_an_ivf_collection_exactly(ingested, model_dir):
    from dhim_ray.hasher import Hasher

    target, result = ingested
    assert result.rows_written == N and result.rows_in_collection == N
    client = target.connect()
    try:
        index = client.describe_index(target.collection, "code", timeout=30)
    finally:
        client.close()
    assert index["index_type"] == "BIN_IVF_FLAT" and int(index["nlist"]) == NLIST
    assert index["metric_type"] == "HAMMING"
    rows, codes = stored_codes(target)
    assert rows == load_split(BBC).rows.tolist()
    texts = load_split(BBC).texts
    assert np.array_equal(codes, Hasher.load(model_dir).encode(texts))


def test_rerun_upserts_and_the_count_stays_exact(ingested, model_dir):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target, _ = ingested
    again = run_ingest(IngestRequest(BBC, model_dir, target, workers=2), progress=False)
    assert again.rows_in_collection == N
    assert (again.rows_written, again.rows_unchanged) == (0, N)  # stored as they are: not encoded, not written
    rows, _ = stored_codes(target)
    assert len(rows) == N and len(set(rows)) == N


def test_a_shrunk_source_reingested_on_the_server_keeps_exactly_its_rows_with_their_ids(milvus_uri, model_dir,
                                                                                        tmp_path):
    """The server path of a whole-source re-ingest: rows the source no longer has are deleted
    by filter (source and row), the ids (--id-column) written by parallel Ray writers come back."""
    import json

    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    texts = load_split(BBC).texts[:30]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"k{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    target = MilvusTarget(milvus_uri, "shrink16")
    first = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=2, overwrite=True, id_column="id"), progress=False)
    assert (first.rows_of_source, first.stale_rows_removed) == (30, 0)
    path.write_text("".join(json.dumps({"id": f"k{i}", "text": t}) + "\n" for i, t in enumerate(texts[:20])))
    again = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=2, id_column="id"), progress=False)
    assert (again.rows_in_collection, again.rows_of_source, again.stale_rows_removed) == (20, 20, 10)
    with Searcher(model_dir, target) as s:
        hits = s.run(SearchRequest([texts[3]], k=20)).hits[0]
    assert sorted(h["key"] for h in hits) == sorted(f"k{i}" for i in range(20))


def test_ray_workers_write_in_parallel_and_counts_stay_exact(ray_session, milvus_uri, ingested):
    """The sink alone, on many rows ready at once: several write tasks in several
    worker processes upsert at the same time; the count is exact, a rerun adds nothing."""
    import pyarrow as pa
    import ray

    from dhim_ray.connectors.milvus import CodeCollection
    from dhim_ray.connectors.rows import document_ids
    from dhim_ray.jobs.milvus_sink import MilvusDatasink
    from dhim_ray.jobs.ray_env import split_table

    # Enough rows that the eight writes outlast the start of Ray's extra worker processes (about
    # a second): one idle worker would otherwise take every task in turn.
    n = 200_000
    codes = np.random.default_rng(0).integers(0, 256, size=(n, 2), dtype=np.uint8)
    table = pa.table({
        "id": document_ids("synthetic:train", np.arange(n)),
        "code": pa.FixedSizeListArray.from_arrays(pa.array(codes.ravel()), 2),
        "label": np.arange(n) % 7, "text": pa.array([f"doc {i}" for i in range(n)]), "row": np.arange(n),
    })
    target = MilvusTarget(milvus_uri, "parallel16")
    for attempt in range(2):  # Ray calls the sink's hooks: it makes the collection, writes, verifies
        sink = MilvusDatasink(target, 16, "dhim:synthetic", "synthetic:train", overwrite=attempt == 0,
                              index=IndexSpec("BIN_IVF_FLAT", nlist=NLIST))
        ray.data.from_arrow(split_table(table, 8)).write_datasink(
            sink, concurrency=4, ray_remote_args={"num_cpus": 0.25})
        assert sink.figures["rows_written"] == n and sink.figures["rows_in_collection"] == n
        assert sink.figures["writers"] >= 2, sink.figures
        client = target.connect()
        try:
            assert CodeCollection(client, target.collection).count() == n
        finally:
            client.close()


def test_search_through_the_ivf_index(ingested, model_dir):
    """nprobe = nlist probes every cluster: exact, so it must agree with in-memory search."""
    from dhim_ray.eval_in_memory import Model, topic
    from dhim_ray.evaluation import EvalRequest, evaluate
    from dhim_ray.search import Searcher

    target, _ = ingested
    split = load_split(BBC)
    exact = IndexSpec("BIN_IVF_FLAT", nlist=NLIST, nprobe=NLIST)
    with Searcher(model_dir, target, index=exact) as s:
        hits = s.run(SearchRequest([split.texts[11]], k=N)).hits[0]
    own = [h for h in hits if h["row"] == split.rows[11]]
    assert hits[0]["distance"] == 0 and own and own[0]["distance"] == 0
    assert own[0]["label_name"] == split.label_names[split.labels[11]]  # written by the sink's workers
    queries = CorpusSpec("bbc", "val", limit=60)
    in_memory = topic(Model(model_dir), BBC, queries, k=50, progress=False)
    served = evaluate(EvalRequest(model_dir, queries=queries, collection=target, k=50, nprobe=NLIST))[0]
    assert served["precision_at_k_tie_aware"] == pytest.approx(in_memory["precision_at_k_tie_aware"], abs=1e-9)


def test_collection_of_another_width_is_refused_on_the_server(ingested):
    target, _ = ingested
    client = target.connect()
    try:
        with pytest.raises(CollectionMismatchError, match="16 bits, these have 32"):
            CodeCollection(client, target.collection).ensure(32, "dhim:other", IndexSpec("BIN_IVF_FLAT"))
    finally:
        client.close()


@pytest.mark.parametrize("token", ["root:not-the-password", None])
def test_wrong_or_missing_credentials_fail_clearly_without_echoing_them(milvus_uri, token):
    """In a fresh process: pymilvus caches connections per address."""
    env = {k: v for k, v in os.environ.items() if k != "MILVUS_TOKEN"}
    if token:
        env["MILVUS_TOKEN"] = token
    code = (
        "from dhim_ray.connectors.milvus import MilvusTarget\n"
        "from dhim_ray.errors import StoreUnreachableError\n"
        f"t = MilvusTarget({milvus_uri!r}, 'dbp16_ivf', timeout=10)\n"
        "try:\n    t.connect().list_collections()\nexcept StoreUnreachableError as e:\n    print('REFUSED', e)\n"
        "else:\n    print('ACCEPTED')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert "REFUSED" in out.stdout, out.stdout + out.stderr
    assert "$MILVUS_TOKEN" in out.stdout
    assert "not-the-password" not in out.stdout + out.stderr
    assert "REFUSED cannot" in out.stdout  # a StoreUnreachableError: the CLI's one line, exit 1


def test_filter_and_radius_on_the_server_equal_a_brute_force_scan(ingested, model_dir):
    """On the server's IVF collection, probing every cluster: a filtered search gives the
    filtered brute force's distances, a radius search every row within the radius."""
    from dhim_ray.search import Searcher

    target, _ = ingested
    rows, codes = stored_rows(target, ["label"])
    ids = np.array([r["id"] for r in rows])
    labels = np.array([r["label"] for r in rows])
    with Searcher(model_dir, target, nprobe=NLIST) as searcher:  # every cluster probed: exact
        query = searcher.hasher.encode(["oil prices rise as markets fall"])
        d = np.bitwise_count(codes ^ query[0]).sum(1)
        label = int(labels[0])
        hits = searcher.collection.search(query, searcher.hasher.n_bits, 10, searcher.index, searcher.info.output_fields, filter=f"label == {label}")[0]
        want = sorted((int(d[i]), int(ids[i])) for i in np.flatnonzero(labels == label))
        assert [h["distance"] for h in hits] == [x for x, _ in want[:10]]
        assert all(h["label"] == label for h in hits)
        near = searcher.collection.search(query, searcher.hasher.n_bits, 1000, searcher.index, searcher.info.output_fields, max_distance=3)[0]
        assert sorted(h["id"] for h in near) == sorted(int(i) for i in ids[d <= 3])


def another_model(model_dir: Path, folder: Path) -> Path:
    """A second model of the same encoder and width, as a retraining makes one: ``model_dir``'s
    weights, each moved by noise (another weights digest, so another model id, and other codes)."""
    import torch

    from dhim_ray.model.checkpoint import load_checkpoint, save_checkpoint

    model, config, info = load_checkpoint(model_dir)
    noise = torch.Generator().manual_seed(7)
    state = {k: v + v.std() * torch.randn(v.shape, generator=noise) if v.is_floating_point() and v.numel() > 1
             else v for k, v in model.state_dict().items()}
    return save_checkpoint(folder, state, config, info.encoder_fingerprint, info.summary)


def test_a_service_on_an_alias_follows_a_model_upgrade_without_an_error(ray_session, milvus_uri, model_dir,
                                                                        tmp_path_factory):
    """ingest --alias on the server: a service answering through the alias keeps answering, with
    no error, while a new model's ingest completes and the alias moves; then it answers with the
    new model's codes from the new collection (the replica loads the model the collection names).
    Metadata columns come back through the service too."""
    import socket
    import threading
    import time

    import httpx
    from ray import serve

    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.jobs.serve import ServeOptions
    from dhim_ray.jobs.service_life import start_service
    from dhim_ray.model.checkpoint import read_checkpoint
    from dhim_ray.search import Searcher

    new_model = another_model(model_dir, tmp_path_factory.mktemp("upgrade") / "bbc-16-new")
    old_id, new_id = read_checkpoint(model_dir).model_id, read_checkpoint(new_model).model_id
    assert old_id != new_id
    small = CorpusSpec("bbc", "train", limit=120)
    first = run_ingest(IngestRequest(small, model_dir, MilvusTarget(milvus_uri, "news_v1"), workers=1, alias="news", overwrite=True), progress=False)
    assert (first.alias, first.alias_was) == ("news", "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = start_service(ServeOptions(str(model_dir), milvus_uri, "news"), port=port)
    failures, served = [], []
    stop = threading.Event()

    def ask() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                r = client.post(f"{url}/search", json={"texts": ["oil prices rise"], "k": 3})
                if r.status_code != 200:
                    failures.append((r.status_code, r.text[:200]))
                served.append(client.get(f"{url}/health").json().get("model"))

    try:
        with httpx.Client(timeout=120) as client:  # the first answer: the old model's
            assert client.get(f"{url}/health").json()["model"] == old_id
        asker = threading.Thread(target=ask)
        asker.start()
        second = run_ingest(IngestRequest(small, new_model, MilvusTarget(milvus_uri, "news_v2"), workers=1, alias="news", overwrite=True), progress=False)
        assert (second.alias, second.alias_was) == ("news", "news_v1")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not served or served[-1] != new_id):
            time.sleep(0.5)
        stop.set()
        asker.join()
        assert failures == []
        assert served[-1] == new_id and old_id in served
        with httpx.Client(timeout=120) as client:
            got = client.post(f"{url}/search", json={"texts": ["oil prices rise"], "k": 3}).json()["results"][0]
        with Searcher(new_model, MilvusTarget(milvus_uri, "news_v2")) as searcher:
            want = searcher.run(SearchRequest(["oil prices rise"], k=3)).hits[0]
        assert [(h["id"], h["distance"]) for h in got] == [(h["id"], h["distance"]) for h in want]
        # a CLI search through the alias with the old model is refused: the alias names the new one
        with pytest.raises(CollectionMismatchError, match=f"holds codes of model {new_id}"):
            Searcher(model_dir, MilvusTarget(milvus_uri, "news"))
    finally:
        stop.set()
        serve.shutdown()


def test_a_text_index_asked_of_the_2_3_server_is_refused_before_anything_is_written(ray_session, milvus_uri,
                                                                                    model_dir):
    from dhim_ray.errors import ConfigError
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target = MilvusTarget(milvus_uri, "text_index_refused")
    with pytest.raises(ConfigError, match=r"text_index=True: .* cannot keep one \(Milvus v?2\.3\.\d+\S* has no BM25"):
        run_ingest(IngestRequest(CorpusSpec("bbc", "train", limit=40), model_dir, target, workers=1, text_index=True), progress=False)
    with target.open() as collection:
        assert collection.describe() is None


def test_by_default_the_2_3_server_keeps_codes_only_and_says_so(ray_session, milvus_uri, model_dir, caplog):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    target = MilvusTarget(milvus_uri, "text_index_default")
    with caplog.at_level("WARNING", logger="dhim_ray"):
        result = run_ingest(IngestRequest(CorpusSpec("bbc", "train", limit=40), model_dir, target, workers=1, overwrite=True), progress=False)
    assert not result.text_index and result.verified
    said = [r.getMessage() for r in caplog.records if "no text index" in r.getMessage()]
    assert len(said) == 1 and "has no BM25 function" in said[0] and "keeps codes only" in said[0], said
    with Searcher(model_dir, target) as s:
        assert s.resolve_mode(None) == "codes" and s.run(SearchRequest(["oil prices"], k=3)).hits[0]
