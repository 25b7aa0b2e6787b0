"""Integration: real Ray Data, real milvus-lite, the packaged MiniLM encoder and the
packaged BBC corpus (no download, no ../shared)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import BBC16_DOCS, write_csv

from dhim_ray.codes import bytes_to_codes
from dhim_ray.connectors.connection import release
from dhim_ray.connectors.milvus import CodeCollection, IndexSpec, MilvusTarget
from dhim_ray.connectors.rows import code_rows, document_ids
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import (
    CheckpointError,
    CodeFormatError,
    CollectionMismatchError,
    ConfigError,
    DataError,
    IngestInterrupted,
    StoreError,
    StoreUnreachableError,
)
from dhim_ray.search import SearchRequest

pytestmark = pytest.mark.slow  # real Ray, real Milvus, the packaged encoder: minutes

N = BBC16_DOCS  # the session collection (conftest.bbc16_collection)
BBC = CorpusSpec("bbc", "train", limit=N)


@pytest.fixture(scope="module")
def model_dir(bbc16):
    return bbc16


@pytest.fixture(scope="module")
def ingested(bbc16_collection):
    return bbc16_collection


def stored(target: MilvusTarget, n_bits: int = 16):
    with target.open(create=False) as collection:
        rows = collection.query(["code", "row", "source", "text"])
    rows = sorted(rows, key=lambda r: (r["source"], r["row"]))
    codes = [r["code"][0] if isinstance(r["code"], list) else r["code"] for r in rows]
    return rows, bytes_to_codes([bytes(c) for c in codes], n_bits)


def test_ingest_stores_exactly_the_encoded_codes(ingested, model_dir):
    from dhim_ray.hasher import Hasher

    target, result = ingested
    assert result.n_documents == N and result.rows_in_collection == N and result.as_dict()["verified"]
    rows, codes = stored(target)
    assert [r["row"] for r in rows] == load_split(BBC).rows.tolist()
    assert np.array_equal(codes, Hasher.load(model_dir).encode(load_split(BBC).texts))


def test_stored_rows_are_marked_by_digest_and_not_encoded(ray_session, model_dir):
    """What a rerun passes over: a row whose id and digest (what it is made from) the
    collection holds is marked ``stored``; an edited text changes the digest. The encoding
    actor encodes only the rows not stored."""
    import pyarrow as pa
    import ray
    import torch

    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import CodeEncoder
    from dhim_ray.jobs.read_tasks import Prepare

    texts = load_split(BBC).texts[:4]
    block = pa.table({"row": np.arange(4), "text": texts, "label": [0, 1, 1, 2]})
    fresh = Prepare("s@1", (0,), 4, None, False)(block, 0, "unicode")
    ids, digests = fresh["id"].to_numpy(), fresh["digest"].to_numpy()
    assert not fresh["stored"].to_numpy().any() and len(set(digests.tolist())) == 4 and (digests != 0).all()
    order = np.argsort(ids[[1, 3]])
    part_ids, part_digests = ids[[1, 3]][order], digests[[1, 3]][order]
    held = ((int(part_ids[0]), int(part_ids[-1]), ray.put((part_ids, part_digests))),)  # one part of what is stored
    again = Prepare("s@1", (0,), 4, None, False, stored=held)(block, 0, "unicode")
    assert again["stored"].to_pylist() == [False, True, False, True]
    assert again["digest"].to_pylist() == digests.tolist()  # the same rows read again: the same digests
    edited = block.set_column(1, "text", pa.array([texts[0], texts[1] + " More.", texts[2], texts[3]]))
    relabelled = block.set_column(2, "label", pa.array([0, 1, 1, 0]))
    for changed, marks in ((edited, [False, False, False, True]), (relabelled, [False, True, False, False])):
        assert Prepare("s@1", (0,), 4, None, False, stored=held)(changed, 0, "unicode")[
            "stored"].to_pylist() == marks
    batch = {name: again[name].to_numpy(zero_copy_only=False) for name in again.column_names}
    codes = CodeEncoder(str(model_dir), threads=torch.get_num_threads())(batch)["code"]
    expected = Hasher.load(model_dir).encode(texts)
    assert np.array_equal(codes[[0, 2]], expected[[0, 2]]) and not codes[[1, 3]].any()  # 1 and 3: not encoded


def test_the_stored_digests_are_read_by_the_sources_id_range(tmp_path):
    """A rerun reads the stored ids and digests of its source by their ids' range (document_ids),
    not by a filter on the source that milvus-lite evaluates over every row's document for each
    page: every row of the source that has a digest, in sorted parts; another source's rows, a
    row in the range that holds another source and a row without a digest are left out."""
    from dhim_ray.connectors.rows import id_range

    def batch(source, rows, digests, ids=None):
        n = len(rows)
        return code_rows({"id": document_ids(source, rows) if ids is None else np.asarray(ids, np.int64),
                          "row": np.asarray(rows), "code": np.zeros((n, 8), np.uint8), "label": np.zeros(n, np.int64),
                          "text": np.array([f"text {r}" for r in rows], dtype=object),
                          "digest": np.asarray(digests, np.int64)}, 64, source)

    target = MilvusTarget(str(tmp_path / "d.db"), "docs")
    try:
        with target.open() as c:
            c.ensure(64, "m", IndexSpec())
            c.upsert(batch("a@1", range(10), range(1, 11)), new=True)
            c.upsert(batch("b@2", range(10), range(1, 11)), new=True)
            c.upsert(batch("a@1", [10], [0]), new=True)  # a row without a digest
            c.upsert(batch("c@3", [11], [5], ids=[id_range("a@1")[0] + 11]), new=True)  # a@1's range, c@3's row
            parts = list(c.digests("a@1", batch_size=4))
    finally:
        release(target.uri)
    assert np.concatenate([i for i, _ in parts]).tolist() == document_ids("a@1", range(10)).tolist()
    assert np.concatenate([d for _, d in parts]).tolist() == list(range(1, 11))
    assert all((np.diff(i) > 0).all() for i, _ in parts)


def test_a_rerun_encodes_and_writes_only_what_is_missing_or_changed(ray_session, model_dir, tmp_path):
    """An ingest that died part-way cost a whole ingest again (every document re-encoded): a
    rerun now passes over the rows stored as they are, and writes the missing and changed ones
    with their codes."""
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    texts = load_split(BBC).texts[:30]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": i % 3}) + "\n" for i, t in enumerate(texts)))
    target = MilvusTarget(str(tmp_path / "c.db"), "docs")
    first = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1), progress=False)
    with target.open() as collection:
        parts = list(collection.digests(first.source, batch_size=7))  # read a part at a time, each sorted
        ids, digests = np.concatenate([i for i, _ in parts]), np.concatenate([d for _, d in parts])
        assert len(parts) == 5 and all((np.diff(i) > 0).all() for i, _ in parts)
        assert len(np.unique(ids)) == 30 and (digests != 0).all()
        late = [r["id"] for r in collection.query(["row"], filter="row >= 20")]
        collection.client.delete(target.collection, ids=late, timeout=30)  # died two thirds in
    texts[3] = "The striker scored twice in the cup final and the league title went to the wire."
    path.write_text("".join(json.dumps({"text": t, "label": 0 if i == 5 else i % 3}) + "\n"
                            for i, t in enumerate(texts)))
    again = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1), progress=False)
    assert (again.rows_written, again.rows_unchanged, again.rows_in_collection) == (12, 18, 30)
    rows, codes = stored(target)
    assert [r["text"] for r in rows] == [t[:1024] for t in texts]
    assert np.array_equal(codes, Hasher.load(model_dir).encode(texts))
    assert run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1), progress=False).rows_unchanged == 30


def test_tokenising_apart_from_the_encoders_stores_the_same_codes(ray_session, ingested, model_dir, tmp_path):
    """The GPU path's pipeline (CPU actors clean and tokenise, the encoding actors only
    encode), run here on the CPU: row for row the codes of the one-stage ingest."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target = MilvusTarget(str(tmp_path / "apart.db"), "bbc16")
    result = run_ingest(IngestRequest(BBC, model_dir, target, workers=2, tokenise_apart=True), progress=False)
    assert result.rows_in_collection == N
    rows, codes = stored(target)
    one_stage_rows, one_stage = stored(ingested[0])
    assert [r["row"] for r in rows] == [r["row"] for r in one_stage_rows]
    assert [r["text"] for r in rows] == [r["text"] for r in one_stage_rows]
    assert np.array_equal(codes, one_stage)


def test_search_own_text_returns_it_at_distance_zero(ingested, model_dir):
    from dhim_ray.search import Searcher

    target, _ = ingested
    split = load_split(BBC)
    with Searcher(model_dir, target) as s:
        hits = s.run(SearchRequest([split.texts[7]], k=N)).hits[0]  # 16 bits: several documents may share the code
    assert hits[0]["distance"] == 0
    own = [h for h in hits if h["row"] == split.rows[7]]
    assert own and own[0]["distance"] == 0
    assert own[0]["text"] == split.texts[7][:1024] and own[0]["source"].startswith("bbc:train@")
    assert own[0]["label"] == split.labels[7] and own[0]["label_name"] == split.label_names[split.labels[7]]


def test_milvus_precision_equals_in_memory(ingested, model_dir):
    from dhim_ray.eval_in_memory import Model, topic
    from dhim_ray.evaluation import EvalRequest, evaluate

    target, _ = ingested
    queries = CorpusSpec("bbc", "val", limit=60)
    in_memory = topic(Model(model_dir), BBC, queries, k=50, progress=False)
    milvus = evaluate(EvalRequest(model_dir, queries=queries, collection=target, k=50, mode="codes"))[0]
    assert milvus["precision_at_k_tie_aware"] == pytest.approx(in_memory["precision_at_k_tie_aware"], abs=1e-9)
    assert milvus["precision_at_k"] == pytest.approx(in_memory["precision_at_k"], abs=1e-9)


def test_queries_naming_some_of_the_classes_are_matched_by_name(ray_session, model_dir, tmp_path):
    """A query file holding two of the collection's five classes numbers its labels 0..1 by
    itself; through Milvus they must be matched by name, as the in-memory eval does."""
    from dhim_ray.eval_in_memory import Model, topic
    from dhim_ray.evaluation import EvalRequest, evaluate

    bbc = load_split(CorpusSpec("bbc"), "train")
    names = bbc.label_names
    picked = [i for i in range(len(bbc)) if bbc.labels[i] in (1, 3)][:40]  # two classes, by name
    write_csv(tmp_path / "db" / "train.csv", [(names[bbc.labels[i]], bbc.texts[i]) for i in range(0, 1780, 8)],
              header=True)
    write_csv(tmp_path / "q" / "val.csv", [(names[bbc.labels[i]], bbc.texts[i]) for i in picked], header=True)
    target = MilvusTarget(str(tmp_path / "named.db"), "named")
    ingest_job(CorpusSpec(str(tmp_path / "db"), "train"), model_dir, target)
    queries = CorpusSpec(str(tmp_path / "q"), "val")
    milvus = evaluate(EvalRequest(model_dir, queries=queries, collection=target, k=20, mode="codes"))[0]
    in_memory = topic(Model(model_dir), CorpusSpec(str(tmp_path / "db"), "train"), queries, k=20,
                                    progress=False)
    assert milvus["precision_at_k_tie_aware"] == pytest.approx(in_memory["precision_at_k_tie_aware"], abs=1e-9)
    # matched by number, entertainment and sport (0 and 1 in the queries) met the collection's business
    # and entertainment (its 0 and 1); by name the codes find their class above the 0.2 of chance
    assert milvus["precision_at_k_tie_aware"] > 0.2


def ingest_job(corpus, model_dir, target, **kw):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    return run_ingest(IngestRequest(corpus, model_dir, target, workers=1, **kw), progress=False)


def test_interrupted_ingest_rerun_ends_with_one_row_per_document(ray_session, model_dir, tmp_path, monkeypatch):
    import dhim_ray.jobs.ingest as job
    from dhim_ray.search import Searcher

    target = MilvusTarget(str(tmp_path / "c.db"), "partial")
    real_upsert, calls = CodeCollection.upsert, []

    def upsert_then_ctrl_c(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real_upsert(*args, **kwargs)

    monkeypatch.setattr(CodeCollection, "upsert", upsert_then_ctrl_c)
    with pytest.raises(IngestInterrupted, match="rerun the same ingest"):
        job.run_ingest(job.IngestRequest(BBC, model_dir, target, workers=2, write_batch=50), progress=False)
    monkeypatch.undo()
    left = len(stored(target)[0])
    assert 0 < left < N  # the interruption left a partial collection
    # searched before the rerun, it says it is incomplete: the library, the CLI (exit 0, one line)
    with Searcher(model_dir, target) as s:
        assert "'partial' may be incomplete: an ingest of" in s.incomplete()
        assert "rerun the same ingest to complete it" in s.incomplete()
    run = subprocess.run(["dhim-ray", "search", "oil prices", "--model", str(model_dir), "--uri", target.uri,
                          "--collection", "partial", "-k", "3"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "may be incomplete" in run.stderr, run.stderr[-2000:]
    again = job.run_ingest(job.IngestRequest(BBC, model_dir, target, workers=2), progress=False)
    assert again.rows_in_collection == N
    # what the interrupted run stored is read back and left alone; only the rest is written
    assert (again.rows_unchanged, again.rows_written) == (left, N - left)
    rows, _ = stored(target)
    assert len(rows) == N and len({r["row"] for r in rows}) == N
    with Searcher(model_dir, target) as s:
        assert s.incomplete() is None


def test_limited_reingest_verifies_the_rows_it_covers(ray_session, ingested, model_dir):
    """Issue 11.7: after a full ingest, --limit 50 failed forever ('holds 300 ... source has 50')."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target, _ = ingested
    result = run_ingest(IngestRequest(CorpusSpec("bbc", "train", limit=50), model_dir, target, workers=1), progress=False)
    assert result.verified and result.rows_in_collection == 50 and result.rows_of_source == N


def test_corpora_with_the_same_folder_name_keep_their_own_rows(ray_session, model_dir, tmp_path):
    """Issue 11.1: a different corpus whose folder had the same base name overwrote the first's rows."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    a, b = tmp_path / "a" / 'news"x', tmp_path / "b" / 'news"x'  # same base name, with a quote in it
    write_csv(a / "train.csv", [(1, f"oil prices rise number {i}") for i in range(30)], header=True)
    write_csv(b / "train.csv", [(2, f"football club wins match {i}") for i in range(20)], header=True)
    target = MilvusTarget(str(tmp_path / "same.db"), "same")
    first = run_ingest(IngestRequest(CorpusSpec(str(a)), model_dir, target, workers=1), progress=False)
    second = run_ingest(IngestRequest(CorpusSpec(str(b)), model_dir, target, workers=1), progress=False)
    assert first.source != second.source and first.verified and second.verified
    rows, _ = stored(target)
    assert len(rows) == 50 and len({r["source"] for r in rows}) == 2
    assert sum(r["text"].startswith("oil") for r in rows) == 30


def test_an_id_clash_with_another_source_is_refused(model_dir, tmp_path):
    """A hash collision of two sources' ids must be refused, never overwritten."""
    from dhim_ray.connectors.milvus import CodeCollection

    target = MilvusTarget(str(tmp_path / "clash.db"), "clash")
    client = target.connect()
    try:
        clash = CodeCollection(client, "clash")
        clash.ensure(16, "m")
        ids = document_ids("first@1", np.arange(3))
        clash.upsert(code_rows({"id": ids, "code": np.zeros((3, 2), np.uint8), "text": ["a", "b", "c"],
                                "row": np.arange(3)}, 16, "first@1"))
        with pytest.raises(CollectionMismatchError, match="already hold rows of first@1; refusing to overwrite"):
            clash.refuse_foreign_rows(ids, "second@2")
        clash.refuse_foreign_rows(ids, "first@1")  # its own rows: an upsert is fine
    finally:
        client.close()
        release(target.uri)


def test_corrupt_model_is_refused_before_a_collection_exists(model_dir, tmp_path):
    """Issue 11.6: a corrupt model left an empty collection stamped with its id."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    target = MilvusTarget(str(tmp_path / "fresh.db"), "fresh")
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        run_ingest(IngestRequest(BBC, bad, target), progress=False)
    assert not (tmp_path / "fresh.db").exists()


def test_bin_ivf_flat_on_milvus_lite_is_refused(model_dir, tmp_path):
    """Issue 11.8: --index BIN_IVF_FLAT on milvus-lite silently became BIN_FLAT."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    with pytest.raises(ConfigError, match="milvus-lite files take BIN_FLAT only"):
        run_ingest(IngestRequest(BBC, model_dir, MilvusTarget(str(tmp_path / "x.db"), "x"), index=IndexSpec("BIN_IVF_FLAT")), progress=False)


def test_searching_a_missing_db_file_does_not_create_it(model_dir, tmp_path):
    """Issue 11.8: searching a .db path that did not exist created an empty file."""
    from dhim_ray.search import Searcher

    with pytest.raises(StoreError, match="no such milvus-lite file"):
        Searcher(model_dir, MilvusTarget(str(tmp_path / "typo.db"), "c"))
    assert not (tmp_path / "typo.db").exists()


def test_collection_of_another_width_is_refused(ray_session, model_dir, tmp_path):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target = MilvusTarget(str(tmp_path / "w.db"), "wide")
    client = target.connect()
    CodeCollection(client, "wide").ensure(64, "other-model")
    client.close()
    release(target.uri)
    with pytest.raises(CollectionMismatchError, match="its codes have 64 bits, these have 16.*overwrite=True"):
        run_ingest(IngestRequest(BBC, model_dir, target), progress=False)


def test_wrong_length_code_refused_before_insert(tmp_path):
    target = MilvusTarget(str(tmp_path / "x.db"), "x")
    client = target.connect()
    try:
        CodeCollection(client, "x").ensure(64, "m")
        bad = np.zeros((2, 7), dtype=np.uint8)
        batch = {"id": document_ids("s", [0, 1]), "code": bad, "text": ["a", "b"], "row": np.arange(2)}
        with pytest.raises(CodeFormatError, match="56 bits .* expected 64 bits"):
            code_rows(batch, 64, "s")
        with pytest.raises(CodeFormatError, match="codes of dtype int64"):
            code_rows({**batch, "code": np.zeros((2, 8), np.int64)}, 64, "s")
        rows = code_rows({**batch, "code": np.zeros((2, 8), np.uint8)}, 64, "s")
        rows["code"][1] = rows["code"][1][:7]
        with pytest.raises(CodeFormatError, match="codes of \\[7, 8\\] bytes"):
            CodeCollection(client, "x").upsert(rows)
        assert client.query("x", filter="", output_fields=["count(*)"])[0]["count(*)"] == 0
    finally:
        client.close()
        release(target.uri)


class PublicOnly:
    """A MilvusClient showing only its public names, as a pymilvus without the private ones."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._client, name)


def test_a_pymilvus_without_the_column_write_stores_the_same_rows_by_its_public_insert(tmp_path):
    """The connector writes by column through pymilvus' connection handler, which is not its
    public API; where a pymilvus lacks it, the public row insert stores the very same rows."""
    codes = np.random.default_rng(0).integers(0, 256, (300, 8), dtype=np.uint8)
    batch = {"id": document_ids("s", range(300)), "code": codes, "text": [f"doc {i}" for i in range(300)],
             "row": np.arange(300), "label": np.arange(300) % 3}
    stored = {}
    for way in ("columns", "public rows"):
        target = MilvusTarget(str(tmp_path / f"{way.split()[-1]}.db"), "x")
        client = target.connect()
        try:
            # the pymilvus installed has the column path; a client showing only its public names has not
            assert callable(getattr(client, "_get_connection", None))
            collection = CodeCollection(client if way == "columns" else PublicOnly(client), "x")
            collection.ensure(64, "m")
            assert collection.upsert(code_rows(batch, 64, "s"), new=True) == 300
            rows = CodeCollection(client, "x").query(["code", "text", "row", "label"])
            stored[way] = sorted((r["id"], bytes(r["code"][0] if isinstance(r["code"], list) else r["code"]),
                                  r["text"], r["row"], r["label"]) for r in rows)
        finally:
            client.close()
            release(target.uri)
    assert len(stored["columns"]) == 300 and stored["columns"] == stored["public rows"]


def test_unreachable_server_is_an_environment_error_and_credentials_in_a_uri_are_refused_masked():
    with pytest.raises(StoreUnreachableError, match=r"cannot reach Milvus at http://127.0.0.1:1 .*check uri") as e:
        MilvusTarget("http://127.0.0.1:1", "c").connect()
    assert e.value.retriable
    with pytest.raises(ConfigError, match=r"uri=http://\*\*\*@127.0.0.1:1: credentials do not go in the URI") as e:
        MilvusTarget("http://user:secret@127.0.0.1:1", "c")
    assert "secret" not in str(e.value)


def test_missing_split_and_bad_queries(ingested, model_dir):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    target, _ = ingested
    with pytest.raises(DataError, match="has no split 'holdout'; it has: train, val, test"):
        run_ingest(IngestRequest(CorpusSpec("bbc", "holdout"), model_dir, target), progress=False)
    with Searcher(model_dir, target) as s:
        with pytest.raises(DataError, match="text 0 .* is empty"):
            s.run(SearchRequest([""], k=5))
        with pytest.raises(ConfigError, match="k=20000: must be between 1 and 16384"):
            s.run(SearchRequest(["a query"], k=20000))


def test_document_ids_are_deterministic_and_distinct():
    a = document_ids("dbpedia:train", np.arange(1000))
    assert np.array_equal(a, document_ids("dbpedia:train", np.arange(1000)))
    assert len(set(a.tolist())) == 1000 and (a >= 0).all()
    assert not set(a.tolist()) & set(document_ids("dbpedia:val", np.arange(1000)).tolist())


def test_ingest_ids_identify_the_source_not_its_folder_name(tmp_path):
    from dhim_ray.connectors.rows import source_label

    a, b = tmp_path / "x" / "corpus", tmp_path / "y" / "corpus"
    for p in (a, b):
        write_csv(p / "train.csv", [(1, "text")], header=True)
    ids = {source_label(f"{CorpusSpec(str(p)).source_id}:train", "corpus:train") for p in (a, b)}
    assert len(ids) == 2 and all(s.startswith("corpus:train@") for s in ids)
    assert json.dumps(sorted(ids))  # plain strings


@pytest.mark.parametrize("columns", [80, 100])
def test_search_output_keeps_rank_distance_label_and_the_text_on_narrow_terminals(ingested, model_dir, columns,
                                                                                   tmp_path):
    """At 80 columns the text gets the width (at least 40 characters) and the rank is the handle
    --like takes (@RANK); from 100 the id is shown too."""
    import os
    import subprocess
    import sys

    target, _ = ingested
    env = dict(os.environ, COLUMNS=str(columns), HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(tmp_path))
    base = [sys.executable, "-m", "dhim_ray.cli", "search", "--model", str(model_dir), "--uri", target.uri,
            "--collection", target.collection, "-k", "3"]
    run = subprocess.run([*base, "oil prices"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    header = next(line for line in run.stdout.splitlines() if "rank" in line)
    assert all(col in header for col in ("rank", "distance", "label", "text")) and ("id" in header) == (columns >= 100)
    assert max(len(line) for line in run.stdout.splitlines()) <= columns
    # rank, distance, label, (id,) (bm25,) text: no borders (the text keeps the width), cells two spaces apart
    body = [re.split(r"\s{2,}", line.strip()) for line in run.stdout.splitlines() if re.match(r"\s*\d+\s", line)]
    cells_per_row = (4, 5) if columns < 100 else (5, 6)
    assert len(body) == 3 and all(len(cells) in cells_per_row and all(cells) for cells in body), run.stdout
    assert [int(cells[0]) for cells in body] == [1, 2, 3]
    assert all(cells[2] in load_split(BBC).label_names for cells in body)  # names, not numbers
    assert min(len(cells[-1]) for cells in body) >= (40 if columns == 80 else 44), run.stdout  # the text shows
    if columns >= 100:
        assert all(cells[3].lstrip("-").isdigit() for cells in body)  # whole: what --like takes
        return
    assert "--like @RANK" in run.stdout
    # --like @2 is the second hit of that search, as its id is
    hits = json.loads(subprocess.run([*base, "oil prices", "--json"], capture_output=True, text=True, env=env,
                                     timeout=300).stdout)[0]["hits"]
    by_rank = subprocess.run([*base, "--like", "@2", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert by_rank.returncode == 0, by_rank.stderr
    by_id = subprocess.run([*base, "--like", str(hits[1]["id"]), "--json"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert json.loads(by_rank.stdout)[0]["hits"] == json.loads(by_id.stdout)[0]["hits"]
    # the id search above is now the last one: it has 3 hits, so @9 is refused in one line
    beyond = subprocess.run([*base, "--like", "@9"], capture_output=True, text=True, env=env, timeout=300)
    assert beyond.returncode == 2 and "--like @9: the last search has no such hit (hits per query: 3)" in beyond.stderr


def test_sharded_parquet_folder_streams_with_one_label_vocabulary(ray_session, model_dir, tmp_path):
    """Issue 13: Ray Data reads a split of many files itself; ids are (source, row) across
    files and reruns; string labels use the corpus-wide vocabulary (val holds a class
    train lacks); --drop-empty leaves the empty rows out and the count stays exact."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    texts = load_split(BBC).texts[:90]
    classes = ["sport", "tech"]  # "politics" (sorted between them) only in val
    records = [{"text": t, "label": classes[i % 2]} for i, t in enumerate(texts)]
    records[40]["text"] = " ... "
    folder = tmp_path / "news"
    (folder / "train").mkdir(parents=True)
    for p in range(3):
        pq.write_table(pa.Table.from_pylist(records[p * 30 : (p + 1) * 30]), folder / "train" / f"part-{p}.parquet",
                       row_group_size=7)
    write_csv(folder / "val.csv", [("politics", texts[0]), ("sport", texts[1])], header=True)
    spec = CorpusSpec(str(folder), "train", drop_empty=True)
    target = MilvusTarget(str(tmp_path / "c.db"), "news")
    first = run_ingest(IngestRequest(spec, model_dir, target, workers=2), progress=False)
    again = run_ingest(IngestRequest(spec, model_dir, target, workers=1), progress=False)
    assert first.n_documents == again.n_documents == again.rows_in_collection == again.rows_of_source == 89
    with target.open(create=False) as collection:
        rows = collection.query(["row", "label", "label_name", "source"])
    rows = sorted(rows, key=lambda r: r["row"])
    expected = [r for r in range(90) if r != 40]
    assert [r["row"] for r in rows] == expected
    assert [r["id"] for r in rows] == document_ids(first.source, expected).tolist()
    loaded = load_split(spec)
    assert loaded.label_names == ["politics", "sport", "tech"]
    assert [r["label"] for r in rows] == loaded.labels.tolist()
    assert [r["label_name"] for r in rows] == [records[r]["label"] for r in expected]


def test_reranked_search_in_milvus_reorders_its_candidates_by_agreement(ingested, model_dir):
    """search --rerank M: the k x M nearest in the collection, re-ranked by agreement with the
    query's scores. Which codes tied at the (k x M)-th distance the store returns is its own
    choice, so the check re-ranks exactly the candidates the store returned."""
    from dhim_ray.eval_in_memory import Model, topic
    from dhim_ray.evaluation import EvalRequest, evaluate
    from dhim_ray.hasher import Hasher
    from dhim_ray.retrieval.rerank import agreement, rerank_topk
    from dhim_ray.search import Searcher

    target, _ = ingested
    rows, db = stored(target)
    by_row = {r["row"]: i for i, r in enumerate(rows)}
    queries = load_split(CorpusSpec("bbc", "val", limit=20)).texts
    codes, scores, _ = Hasher.load(model_dir).encode(queries, scores=True)
    with Searcher(model_dir, target) as s:
        hits = s.run(SearchRequest(queries, k=10, rerank=4, mode="codes")).hits
        candidates = s.collection.search(codes, s.hasher.n_bits, 40, s.index, ("row",))
        plain = s.run(SearchRequest(queries[:1], k=10, mode="codes")).hits
    assert "rerank_score" not in plain[0][0]
    for q, (row_hits, cand) in enumerate(zip(hits, candidates)):
        cand = sorted(cand, key=lambda h: (h["distance"], h["id"]))
        agree = agreement(scores[q : q + 1], db[[by_row[h["row"]] for h in cand]][None])[0]
        best = np.argsort(-agree, kind="stable")[:10]
        assert [h["rerank_score"] for h in row_hits] == pytest.approx(agree[best].tolist(), abs=1e-3)
        assert all(np.diff([h["rerank_score"] for h in row_hits]) <= 0)
    # eval --rerank: the plain precisions are unchanged and the re-ranked one is the in-memory re-rank's
    queries_spec = CorpusSpec("bbc", "val", limit=40)
    in_memory = topic(Model(model_dir), BBC, queries_spec, k=20, progress=False, rerank=4)
    plain_eval = topic(Model(model_dir), BBC, queries_spec, k=20, progress=False)
    assert in_memory["precision_at_k_tie_aware"] == plain_eval["precision_at_k_tie_aware"]
    split, q_split = load_split(BBC), load_split(queries_spec)
    hasher = Hasher.load(model_dir)
    q_codes, q_scores, _ = hasher.encode(q_split.texts, scores=True)
    idx, _ = rerank_topk(hasher.encode(split.texts), q_codes, q_scores, 20, 4)
    assert in_memory["precision_at_k_reranked"] == pytest.approx(
        float((split.labels[idx] == q_split.labels[:, None]).mean()))
    milvus = evaluate(EvalRequest(model_dir, queries=queries_spec, collection=target, k=20, rerank=4,
                                  mode="codes"))[0]
    assert milvus["rerank"] == 4 and 0 < milvus["precision_at_k_reranked"] <= 1


def test_search_cli_rerank_shows_the_score_and_json_carries_it(ingested, model_dir):
    import json
    import os
    import subprocess
    import sys

    target, _ = ingested
    env = dict(os.environ, COLUMNS="120", HF_HUB_OFFLINE="1")
    base = [sys.executable, "-m", "dhim_ray.cli", "search", "oil prices", "--model", str(model_dir),
            "--uri", target.uri, "--collection", target.collection, "-k", "3", "--rerank", "4", "--mode", "codes"]
    table = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    assert table.returncode == 0, table.stderr
    assert all(col in next(line for line in table.stdout.splitlines() if "rank" in line)
               for col in ("distance", "score", "label"))
    as_json = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, timeout=300)
    hits = json.loads(as_json.stdout)[0]["hits"]
    assert len(hits) == 3 and [h["rerank_score"] for h in hits] == sorted((h["rerank_score"] for h in hits),
                                                                          reverse=True)


def test_a_search_that_finds_nothing_says_so(ingested, model_dir, capsys):
    from dhim_ray.cli import main

    target, _ = ingested
    with pytest.raises(SystemExit) as done:
        main(["search", "oil prices", "--model", str(model_dir), "--uri", target.uri, "--collection",
              target.collection, "--filter", "label == 999"])
    assert done.value.code in (0, None)
    assert "no hits" in capsys.readouterr().out


def test_ingest_keeps_ray_and_grpc_chatter_out_of_the_terminal(model_dir, tmp_path):
    """Without -v the terminal shows our own lines only: not Ray's C++ core (every Ray Data
    actor pool of Ray 2.60 logs a false 'constructor arguments in the object store' ERROR),
    not Ray workers' output, not gRPC's transport logs."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_BACKEND_LOG_LEVEL", "RAY_ADDRESS")}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="120")
    run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "ingest", "bbc", "--split", "val", "--limit", "80",
                          "--model", str(model_dir), "--uri", str(tmp_path / "quiet.db"), "--workers", "2"],
                         capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    assert "80" in run.stdout
    foreign = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+ [DIWEF] \d+ \d+\]"  # Ray's C++ core
                         r"|^[DIWEF]\d{4} \d\d:\d\d"  # gRPC / glog
                         r"|^\((raylet|pid=|\w+ pid=)"  # Ray workers' forwarded output
                         r"|constructor arguments in the object store|core_worker\.cc|chttp2")
    leaked = [line for line in run.stderr.splitlines() if foreign.search(line.strip())]
    assert not leaked, "\n".join(leaked)


def test_a_collection_of_an_earlier_layout_is_refused_and_ingested_again_with_overwrite(ray_session, model_dir,
                                                                                       tmp_path):
    """A collection stamped with another layout (or none: before layouts were stamped) is refused in
    one line by search and ingest, which say how to move it; overwrite=True ingests it again."""
    from dhim_ray.connectors.milvus import FORMAT, FORMAT_VERSION, _schema, create_loaded
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    target = MilvusTarget(str(tmp_path / "old.db"), "old16")
    meta = {"format": FORMAT, "n_bits": 16, "model": Hasher.load(model_dir).model_id}  # no version: layout 1
    with target.open() as collection:
        index = collection.client.prepare_index_params()
        index.add_index(field_name="code", index_type="BIN_FLAT", metric_type="HAMMING")
        create_loaded(collection.client, target.collection, _schema(16, meta), index, 30)
    spec = CorpusSpec("bbc", "train", limit=20)
    said = f"collection 'old16': its rows have layout 1 and this dhim-ray reads {FORMAT_VERSION}; ingest it again"
    with pytest.raises(CollectionMismatchError, match=re.escape(said)):
        run_ingest(IngestRequest(spec, model_dir, target, workers=1), progress=False)
    with pytest.raises(CollectionMismatchError, match="its rows have layout 1"):
        Searcher(model_dir, target)
    assert run_ingest(IngestRequest(spec, model_dir, target, workers=1, overwrite=True), progress=False).verified
    with Searcher(model_dir, target) as s:
        assert s.info.version == FORMAT_VERSION and s.info.meta["version"] == FORMAT_VERSION


def test_search_without_a_collection_name_finds_the_one_ingested_with_the_model(model_dir, tmp_path):
    """`dhim-ray search` asked for --collection though ingest had named it: now the one
    collection at --uri ingested with the model is used; several or none is a one-line
    error naming what is there."""
    import os
    import subprocess
    import sys

    from dhim_ray.hasher import Hasher
    from dhim_ray.search import Searcher, find_collection

    hasher = Hasher.load(model_dir)
    texts = load_split(BBC).texts[:30]
    target = MilvusTarget(str(tmp_path / "codes.db"), "news_16")
    client = target.connect()
    try:
        CodeCollection(client, "news_16").ensure(16, hasher.model_id)
        CodeCollection(client, "news_16").upsert(code_rows({"id": document_ids("bbc@1", range(30)),
                                                            "code": hasher.encode(texts), "text": texts,
                                                            "row": np.arange(30)}, 16, "bbc@1"))
        CodeCollection(client, "other_16").ensure(16, "another-model")  # another model's codes: not a candidate
    finally:
        client.close()
        release(target.uri)
    assert find_collection(model_dir, target.uri) == "news_16"
    with Searcher.open(model_dir, target.uri) as s:
        assert s.target.collection == "news_16"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "search", texts[4][:300], "--model", str(model_dir),
                          "--uri", target.uri, "-k", "30", "--json"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "searching collection news_16" in run.stderr
    hits = json.loads(run.stdout)[0]["hits"]
    assert len(hits) == 30 and next(h for h in hits if h["row"] == 4)["distance"] == 0

    client = target.connect()
    try:
        CodeCollection(client, "news_copy_16").ensure(16, hasher.model_id)
    finally:
        client.close()
        release(target.uri)
    with pytest.raises(ConfigError, match=r"holds 2 collections ingested with .* \(news_16, news_copy_16\); "
                                          r"name one with collection=NAME"):
        find_collection(model_dir, target.uri)
    empty = MilvusTarget(str(tmp_path / "empty.db"), "unused")
    empty.connect().close()
    release(empty.uri)
    with pytest.raises(StoreError, match="no collection at .*empty.db was ingested with"):
        find_collection(model_dir, empty.uri)


def test_id_column_is_kept_as_each_rows_key_and_returned_with_hits(ray_session, model_dir, tmp_path):
    """ingest --id-column: the documents' own ids go into the key field as text (7 -> "7",
    "007" stays "007" in CSV and JSON Lines alike), come back with every hit and in the CLI's
    table; a row without an id is refused before a collection exists."""
    import os
    import subprocess
    import sys

    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    texts = load_split(BBC).texts[:24]
    ids = [7, "007", "a-1"] + [f"doc/{i}" for i in range(3, 24)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"doc_id": d, "body": t}) + "\n" for d, t in zip(ids, texts)))
    csv_path = tmp_path / "docs.csv"
    with open(csv_path, "w", newline="") as f:
        import csv

        w = csv.writer(f)
        w.writerow(["doc_id", "text"])
        w.writerows([("007", texts[0]), ("12", texts[1])])
    target = MilvusTarget(str(tmp_path / "keys.db"), "docs")
    result = run_ingest(IngestRequest(CorpusSpec(str(jsonl), text_column="body"), model_dir, target, workers=1, id_column="doc_id"), progress=False)
    assert result.rows_in_collection == 24
    with Searcher(model_dir, target) as s:
        hits = s.run(SearchRequest([texts[2]], k=24)).hits[0]
    assert sorted(h["key"] for h in hits) == sorted(str(d) for d in ids)
    assert next(h for h in hits if h["row"] == 2)["key"] == "a-1"
    assert {h["row"]: h["key"] for h in hits}[0] == "7" and {h["row"]: h["key"] for h in hits}[1] == "007"

    # a rerun without the id column would erase every key: refused, the keys kept
    with pytest.raises(CollectionMismatchError, match="would erase them: pass the same id column again"):
        run_ingest(IngestRequest(CorpusSpec(str(jsonl), text_column="body"), model_dir, target, workers=1), progress=False)
    with Searcher(model_dir, target) as s:
        assert sorted(h["key"] for h in s.run(SearchRequest([texts[2]], k=24)).hits[0]) == sorted(str(d) for d in ids)

    other = MilvusTarget(str(tmp_path / "keys.db"), "docs_csv")
    run_ingest(IngestRequest(CorpusSpec(str(csv_path)), model_dir, other, workers=1, id_column="doc_id"), progress=False)
    with Searcher(model_dir, other) as s:
        assert sorted(h["key"] for h in s.run(SearchRequest([texts[0]], k=2)).hits[0]) == ["007", "12"]

    env = dict(os.environ, COLUMNS="120", HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "search", texts[2][:200], "--model", str(model_dir),
                          "--uri", target.uri, "--collection", "docs", "-k", "3"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    header = next(line for line in run.stdout.splitlines() if "distance" in line)
    assert " id " in header and " row " not in header and " label " not in header  # no labels: no label column
    assert re.search(r"^\s*\d+\s+\d+\s+a-1\s", run.stdout, flags=re.M), run.stdout  # rank, distance, then the id

    holes = tmp_path / "holes.jsonl"
    holes.write_text("".join(json.dumps({"doc_id": None if i in (3, 5) else f"d{i}", "text": t}) + "\n"
                             for i, t in enumerate(texts[:8])) + json.dumps({"doc_id": " ", "text": texts[8]}) + "\n")
    fresh = MilvusTarget(str(tmp_path / "keys.db"), "holes")
    with pytest.raises(DataError, match=r"3 rows have no id in column 'doc_id' \(rows 3, 5, 8\); fill them in"):
        run_ingest(IngestRequest(CorpusSpec(str(holes)), model_dir, fresh, workers=1, id_column="doc_id"), progress=False)
    with pytest.raises(DataError, match=r"no id column 'key'; columns are \['doc_id', 'text'\]"):
        run_ingest(IngestRequest(CorpusSpec(str(holes)), model_dir, fresh, workers=1, id_column="key"), progress=False)
    with fresh.open() as collection:
        assert collection.describe() is None


def test_reingesting_a_changed_source_leaves_exactly_its_rows(ray_session, model_dir, tmp_path):
    """Ids are (source, row): a source that lost documents (its end, or a text now empty and
    skipped with --drop-empty) used to keep the old rows, so search returned documents that
    were gone, and a deletion in the middle left the last document twice. A whole-source
    ingest now removes them; a limited one (--limit) leaves later rows alone, as before."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    texts = load_split(BBC).texts[:12]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    target = MilvusTarget(str(tmp_path / "c.db"), "docs")
    first = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1), progress=False)
    assert (first.rows_of_source, first.stale_rows_removed) == (12, 0)
    limited = run_ingest(IngestRequest(CorpusSpec(str(path), limit=5), model_dir, target, workers=1), progress=False)
    assert (limited.rows_in_collection, limited.rows_of_source, limited.stale_rows_removed) == (5, 12, 0)

    assert (limited.rows_written, limited.rows_unchanged) == (0, 5)  # stored as they are: left alone

    edited = "The striker scored twice in the cup final and the league title went to the wire."
    kept = texts[:1] + [edited] + texts[2:3] + [" "] + texts[4:9]  # row 1 edited, row 3 now empty, 9-11 gone
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in kept))
    again = run_ingest(IngestRequest(CorpusSpec(str(path), drop_empty=True), model_dir, target, workers=1), progress=False)
    assert (again.n_documents, again.rows_in_collection, again.rows_of_source, again.stale_rows_removed) == (8, 8, 8, 4)
    assert (again.rows_written, again.rows_unchanged) == (1, 7)  # the edited row is written again, with its code
    rows, codes = stored(target)
    from dhim_ray.hasher import Hasher

    assert next(r["text"] for r in rows if r["row"] == 1) == edited
    assert (codes[[r["row"] for r in rows].index(1)] == Hasher.load(model_dir).encode([edited])[0]).all()
    with Searcher(model_dir, target) as s:
        assert s.count() == 8
        hits = s.run(SearchRequest([texts[10]], k=8)).hits[0]
    assert sorted(h["row"] for h in hits) == [0, 1, 2, 4, 5, 6, 7, 8]
    assert all(h["text"] != texts[10][:1024] for h in hits)


def test_a_full_disk_is_said_at_once_and_a_rerun_with_room_completes(ray_session, model_dir, tmp_path, capsys):
    """milvus-lite on a full disk retried each write for 30 s and failed with an RPC error: the
    ingest now says 'no space left' at once (exit 1: retriable), leaves no file where no row
    landed, and a rerun with room completes."""
    import os

    from dhim_ray.cli import main
    from dhim_ray.connectors.milvus import LITE_MIN_FREE_BYTES

    assert os.geteuid() == 0, "this test mounts a small tmpfs (a full disk): run the suite as root"
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={LITE_MIN_FREE_BYTES * 2}", "tmpfs", str(disk)], check=True)
    try:
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (LITE_MIN_FREE_BYTES + LITE_MIN_FREE_BYTES // 4))
        args = ["ingest", "bbc", "--limit", "40", "--model", str(model_dir), "--uri", str(disk / "c.db"),
                "--collection", "c", "--workers", "1"]
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 1
        assert "no space left on the device holding" in capsys.readouterr().err
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # refused before a row landed: no file left
        filler.unlink()
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code in (0, None)
        with MilvusTarget(str(disk / "c.db"), "c").open(create=False) as collection:
            assert collection.count() == 40
    finally:
        release(str(disk / "c.db"))
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_lite_collection_past_the_advised_size_says_to_move_to_a_server(ray_session, model_dir, tmp_path,
                                                                          monkeypatch, caplog):
    """Past LITE_ADVISED_CODES (10 million, from bench/store.py) an ingest into milvus-lite says
    once where a server serves better, and past LITE_OPEN_ADVISED_DOCS (5 million: a file slow to
    open) that each process opening it waits; below them, nothing."""
    import dhim_ray.jobs.ingest as job
    import dhim_ray.jobs.milvus_sink as sink

    target = MilvusTarget(str(tmp_path / "big.db"), "big")
    job.run_ingest(job.IngestRequest(CorpusSpec("bbc", "train", limit=40), model_dir, target, workers=1), progress=False)
    assert "codes in milvus-lite" not in caplog.text and "waits over 30 s" not in caplog.text  # below them: nothing
    monkeypatch.setattr(sink, "LITE_ADVISED_CODES", 30)  # the same rules, at sizes a test can write
    monkeypatch.setattr(sink, "LITE_OPEN_ADVISED_DOCS", 30)
    job.run_ingest(job.IngestRequest(CorpusSpec("bbc", "train", limit=40), model_dir, target, workers=1), progress=False)
    assert "big holds 40 codes in milvus-lite" in caplog.text and "a Milvus server with BIN_IVF_FLAT" in caplog.text
    assert "own text index" not in caplog.text  # the default keeps its words beside the file: no limit at 1 million
    assert "big will hold 40 documents in milvus-lite: past 30, each process that opens the file waits over 30 s" \
        in caplog.text


def test_a_rerun_finds_stored_rows_in_whichever_part_of_the_collection_holds_them(ray_session):
    """The driver hands the read tasks the stored rows as parts (first id, last id, a reference),
    never the whole collection's: a block's rows are matched against every part that overlaps
    them, by id and digest."""
    import ray

    from dhim_ray.jobs.read_tasks import Prepare

    ids = np.arange(100, 130, dtype=np.int64)
    parts = tuple((int(p[0]), int(p[-1]), ray.put((p, p * 7))) for p in (ids[:10], ids[10:20], ids[20:]))
    prepare = Prepare("s", (0,), 30, None, False, stored=parts)
    block = np.array([95, 105, 115, 125, 135], dtype=np.int64)  # outside, in each part, outside
    changed = block * 7
    changed[2] += 1  # row 115 stored with another digest: not as stored
    assert prepare._stored(block, changed).tolist() == [False, True, False, True, False]
    assert Prepare("s", (0,), 30, None, False)._stored(block, changed).tolist() == [False] * 5


def test_the_milvus_datasink_writes_a_plain_ray_dataset_of_ids_and_codes(ray_session, tmp_path):
    """Any Ray dataset with an id and a code column goes through MilvusDatasink, without dhim-ray's
    ingest: its hooks make the collection, write and verify; the same rows again write nothing;
    Ray's own write tasks are refused on a milvus-lite file (one process per file) in one line."""
    import ray

    from dhim_ray.jobs.milvus_sink import MilvusDatasink, write_dataset

    rng = np.random.default_rng(0)
    rows = [{"id": i, "code": rng.integers(0, 256, 2, dtype=np.uint8), "text": f"doc {i}"} for i in range(50)]
    target = MilvusTarget(str(tmp_path / "plain.db"), "plain16")
    figures = write_dataset(ray.data.from_items(rows), MilvusDatasink(target, 16, "mine", "items"))
    assert (figures["rows_written"], figures["rows_in_collection"], figures["writers"]) == (50, 50, 1)
    again = write_dataset(ray.data.from_items(rows), MilvusDatasink(target, 16, "mine", "items"))
    assert (again["rows_written"], again["rows_unchanged"], again["rows_in_collection"]) == (0, 50, 50)
    with target.open(create=False) as collection:
        assert collection.get([7], ["text"])[7]["text"] == "doc 7"
        assert (collection.fetch_codes([7], 16)[0] == rows[7]["code"]).all()
    with pytest.raises(ConfigError, match="call write_dataset"):
        ray.data.from_items(rows).write_datasink(MilvusDatasink(target, 16, "mine", "items"))
