"""Integration: real Ray Data, real milvus-lite, the packaged MiniLM encoder, ../shared/data."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import shared_corpus
from dhim_ray.connectors.milvus import MilvusTarget, document_ids, ensure_collection, make_rows, upsert_rows
from dhim_ray.codes import bytes_to_codes
from dhim_ray.errors import CodeFormatError, CollectionMismatchError, ConfigError, DataError, StoreUnreachableError

N = 240


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A quickly trained 16-bit model on a slice of dbpedia (real encoder)."""
    from dhim_ray.config import config_for_bits
    from dhim_ray.pipeline import train_corpus

    corpus = shared_corpus("dbpedia")
    out = tmp_path_factory.mktemp("model") / "dbpedia-16"
    cfg = config_for_bits(16, train={"max_epochs": 2, "batch_size": 64})
    train_corpus(str(corpus), cfg, out, progress=False, limit=N)
    return out


@pytest.fixture(scope="module")
def ingested(ray_session, model_dir, tmp_path_factory):
    from dhim_ray.jobs.ingest import ingest

    uri = str(tmp_path_factory.mktemp("db") / "codes.db")
    target = MilvusTarget(uri, "dbp16")
    result = ingest(str(shared_corpus("dbpedia")), model_dir, target, workers=2, limit=N, progress=False)
    return target, result


def stored(target: MilvusTarget):
    from dhim_ray.connectors.milvus import release

    client = target.connect()
    try:
        rows = client.query(target.collection, filter="id >= 0", output_fields=["code", "row", "source"],
                            limit=16384, timeout=30)
    finally:
        client.close()
        release(target.uri)
    rows = sorted(rows, key=lambda r: r["row"])
    codes = [r["code"][0] if isinstance(r["code"], list) else r["code"] for r in rows]
    return rows, bytes_to_codes([bytes(c) for c in codes], 16)


def test_ingest_stores_exactly_the_encoded_codes(ingested, model_dir):
    from dhim_ray.data import load_split
    from dhim_ray.hasher import Hasher

    target, result = ingested
    assert result.n_documents == N and result.rows_in_collection == N and result.as_dict()["verified"]
    rows, codes = stored(target)
    assert [r["row"] for r in rows] == list(range(N))
    texts = load_split(f"{shared_corpus('dbpedia')}:train", limit=N).texts
    assert np.array_equal(codes, Hasher.load(model_dir).encode(texts))


def test_search_own_text_returns_it_at_distance_zero(ingested, model_dir):
    from dhim_ray.data import load_split
    from dhim_ray.jobs.search import CodeSearcher

    target, _ = ingested
    texts = load_split(f"{shared_corpus('dbpedia')}:train", limit=N).texts
    with CodeSearcher(model_dir, target) as s:
        hits = s.search([texts[7]], k=N)[0]  # 16 bits: several documents may share the code
    assert hits[0]["distance"] == 0
    own = [h for h in hits if h["row"] == 7]
    assert own and own[0]["distance"] == 0
    assert own[0]["text"] == texts[7][:1024] and own[0]["source"] == "dbpedia:train"


def test_milvus_precision_equals_in_memory(ingested, model_dir):
    from dhim_ray.pipeline import evaluate_checkpoint
    from dhim_ray.jobs.search import evaluate_in_milvus

    target, _ = ingested
    corpus = shared_corpus("dbpedia")
    in_memory = evaluate_checkpoint(model_dir, f"{corpus}:train", f"{corpus}:val", k=50, progress=False, limit=N)
    milvus = evaluate_in_milvus(model_dir, f"{corpus}:val", target.uri, target.collection, k=50, progress=False,
                                limit=N)
    assert milvus["precision_at_k_tie_aware"] == pytest.approx(in_memory["precision_at_k_tie_aware"], abs=1e-9)
    assert milvus["precision_at_k"] == pytest.approx(in_memory["precision_at_k"], abs=1e-9)


def test_interrupted_ingest_rerun_ends_with_one_row_per_document(ray_session, model_dir, tmp_path):
    from dhim_ray.jobs.ingest import ingest

    target = MilvusTarget(str(tmp_path / "c.db"), "partial")
    corpus = str(shared_corpus("dbpedia"))
    first = ingest(corpus, model_dir, target, workers=2, limit=N, progress=False, stop_after=100,
                   write_batch=50)
    assert 100 <= first.rows_in_collection < N  # the "crash" left a partial collection
    again = ingest(corpus, model_dir, target, workers=2, limit=N, progress=False)
    assert again.rows_in_collection == N
    rows, _ = stored(target)
    assert len(rows) == N and len({r["row"] for r in rows}) == N


def test_collection_of_another_width_is_refused(ray_session, model_dir, tmp_path):
    from dhim_ray.connectors.milvus import release
    from dhim_ray.jobs.ingest import ingest

    target = MilvusTarget(str(tmp_path / "w.db"), "wide")
    client = target.connect()
    ensure_collection(client, "wide", 64, "other-model")
    client.close()
    release(target.uri)
    t0 = time.perf_counter()
    with pytest.raises(CollectionMismatchError, match="its codes have 64 bits, these have 16.*--overwrite"):
        ingest(str(shared_corpus("dbpedia")), model_dir, target, limit=10, progress=False)
    assert time.perf_counter() - t0 < 10  # refused before any encoding


def test_wrong_length_code_refused_before_insert(tmp_path):
    from dhim_ray.connectors.milvus import release

    target = MilvusTarget(str(tmp_path / "x.db"), "x")
    client = target.connect()
    try:
        ensure_collection(client, "x", 64, "m")
        bad = np.zeros((2, 7), dtype=np.uint8)
        with pytest.raises(CodeFormatError, match="56 bits .* expected 64 bits"):
            make_rows(document_ids("s", [0, 1]), bad, 64, None, ["a", "b"], "s", np.arange(2))
        rows = make_rows(document_ids("s", [0, 1]), np.zeros((2, 8), np.uint8), 64, None, ["a", "b"], "s",
                         np.arange(2))
        rows[1]["code"] = rows[1]["code"][:7]
        with pytest.raises(CodeFormatError, match="codes of \\[7, 8\\] bytes"):
            upsert_rows(client, "x", rows)
        assert client.query("x", filter="", output_fields=["count(*)"])[0]["count(*)"] == 0
    finally:
        client.close()
        release(target.uri)


def test_unreachable_server_fails_within_seconds():
    t0 = time.perf_counter()
    with pytest.raises(StoreUnreachableError, match="cannot reach Milvus at http://127.0.0.1:1 .*check --uri"):
        MilvusTarget("http://127.0.0.1:1", "c").connect()
    assert time.perf_counter() - t0 < 6


def test_missing_split_and_bad_queries(ingested, model_dir):
    from dhim_ray.jobs.ingest import ingest
    from dhim_ray.jobs.search import CodeSearcher

    target, _ = ingested
    with pytest.raises(DataError, match="has no split 'test'"):
        ingest(f"{shared_corpus('dbpedia')}:test", model_dir, target, progress=False)
    with CodeSearcher(model_dir, target) as s:
        with pytest.raises(DataError, match="text 0 .* is empty"):
            s.search([""], k=5)
        with pytest.raises(ConfigError, match="-k 20000: must be between 1 and 16384"):
            s.search(["a query"], k=20000)


def test_document_ids_are_deterministic_and_distinct():
    a = document_ids("dbpedia:train", np.arange(1000))
    assert np.array_equal(a, document_ids("dbpedia:train", np.arange(1000)))
    assert len(set(a.tolist())) == 1000 and (a >= 0).all()
    assert not set(a.tolist()) & set(document_ids("dbpedia:val", np.arange(1000)).tolist())
