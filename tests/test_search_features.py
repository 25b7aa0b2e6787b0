"""What applications do with a collection beyond k-nearest, on real milvus-lite: filtered
search equal to a brute-force filter, radius search equal to an exact scan, more-like-this
by a stored row's id or its own id."""

from __future__ import annotations

import numpy as np
import pytest

from dhim_ray.errors import ConfigError, DataError
from dhim_ray.search import SearchRequest

pytestmark = pytest.mark.slow  # real milvus-lite


@pytest.fixture(scope="module")
def store(tmp_path_factory, toy_folder, tiny_model):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.hasher import Hasher
    from dhim_ray.search import Searcher

    root = tmp_path_factory.mktemp("features")
    model = tiny_model
    split = load_split(CorpusSpec(str(toy_folder), "train"))
    hasher = Hasher.load(model)
    codes = hasher.encode(split.texts)
    rows = np.arange(len(split.texts))
    ids = document_ids("toy@1", rows)
    target = MilvusTarget(str(root / "f.db"), "toy16")
    with target.open() as collection:
        collection.ensure(16, hasher.model_id)
        collection.upsert(code_rows({"id": ids, "code": codes, "label": split.labels, "text": split.texts, "row": rows,
                                     "key": [f"doc-{r}" for r in rows]}, 16, "toy@1"))
    searcher = Searcher(model, target)
    yield {"searcher": searcher, "codes": codes, "ids": ids, "labels": split.labels, "texts": split.texts,
           "hasher": hasher, "model": model}
    searcher.close()


def exact(store, code: np.ndarray, keep: np.ndarray) -> list[tuple[int, int]]:
    """(distance, id) of every kept row, nearest first, ties by id: a brute-force scan."""
    d = np.bitwise_count(store["codes"] ^ code).sum(1)
    return sorted((int(d[i]), int(store["ids"][i])) for i in np.flatnonzero(keep))


def test_a_filtered_search_equals_a_brute_force_filter(store):
    searcher, labels = store["searcher"], store["labels"]
    label = int(labels[0])
    query = store["texts"][3]
    hits = searcher.run(SearchRequest([query], k=10, filter=f"label == {label}")).hits[0]
    want = exact(store, store["hasher"].encode([query])[0], labels == label)
    assert [h["distance"] for h in hits] == [d for d, _ in want[:10]]
    kth = want[9][0]
    assert {h["id"] for h in hits if h["distance"] < kth} == {i for d, i in want if d < kth}
    assert all(h["label"] == label for h in hits)
    assert searcher.run(SearchRequest([query], k=10, filter="label in [-5]")).hits == [[]]


@pytest.mark.parametrize("expr", ["lable == 3", "label ==", "label == 'x' and", "nosuch > 1"])
def test_a_filter_milvus_cannot_use_is_one_clear_error(store, expr):
    with pytest.raises(ConfigError, match="filter="):
        store["searcher"].run(SearchRequest(["football"], k=5, filter=expr))


def test_a_radius_search_returns_every_row_within_the_radius(store):
    searcher = store["searcher"]
    code = store["codes"][5]
    for radius in (0, 2, 4):
        hits = searcher.collection.search(code[None], searcher.hasher.n_bits, 1000, searcher.index, searcher.info.output_fields, max_distance=radius)[0]
        want = exact(store, code, np.ones(len(store["codes"]), bool))
        assert [(h["distance"], h["id"]) for h in hits] == [w for w in want if w[0] <= radius]
    capped = searcher.collection.search(code[None], searcher.hasher.n_bits, 3, searcher.index, searcher.info.output_fields, max_distance=16)[0]
    assert len(capped) == 3 and [h["distance"] for h in capped] == sorted(h["distance"] for h in capped)
    with pytest.raises(ConfigError, match="max_distance=17"):
        searcher.run(SearchRequest(["football"], k=5, max_distance=17))


def test_more_like_a_stored_row_by_id_or_key_leaves_the_row_out(store):
    searcher, ids = store["searcher"], store["ids"]
    by_id = searcher.run(SearchRequest(like=[int(ids[7])], k=5)).hits[0]
    by_key = searcher.run(SearchRequest(like=["doc-7"], k=5)).hits[0]
    assert by_id == by_key and len(by_id) == 5 and int(ids[7]) not in {h["id"] for h in by_id}
    want = [w for w in exact(store, store["codes"][7], np.ones(len(ids), bool)) if w[1] != int(ids[7])]
    assert [h["distance"] for h in by_id] == [d for d, _ in want[:5]]
    with pytest.raises(DataError, match="holds no document with id 'nope'"):
        searcher.run(SearchRequest(like=["nope"]))
    with pytest.raises(DataError, match="holds no document with id '12345'"):  # neither a row id nor a key
        searcher.run(SearchRequest(like=[12345]))


def test_more_like_an_id_two_documents_share_names_both_rows(store, tmp_path):
    """Ingest keeps the ids it is given, unique or not; --like of an id two documents share
    would search with either one's code: refused, naming both rows, either of which it takes."""
    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.search import Searcher

    rows = np.arange(3)
    ids = document_ids("dup@1", rows)
    target = MilvusTarget(str(tmp_path / "dup.db"), "dup")
    with target.open() as collection:
        collection.ensure(16, store["hasher"].model_id)
        collection.upsert(code_rows({"id": ids, "code": store["codes"][:3], "label": store["labels"][:3],
                                     "text": store["texts"][:3], "row": rows, "key": ["a", "b", "a"]}, 16, "dup@1"))
    try:
        with Searcher(store["model"], target) as searcher:
            with pytest.raises(DataError, match=f"2 documents in collection 'dup' have the id 'a' "
                                                f"\\(row ids {ids[0]}, {ids[2]}\\)"):
                searcher.run(SearchRequest(like=["a"], k=2))
            assert [h["key"] for h in searcher.run(SearchRequest(like=["b"], k=2)).hits[0]] != []
            assert searcher.run(SearchRequest(like=[int(ids[2])], k=2)).hits[0][0]["id"] in (int(ids[0]), int(ids[1]))
    finally:
        release(target.uri)


def test_rerank_orders_the_hamming_candidates_by_the_querys_bit_scores(store, tmp_path):
    """--rerank M takes k x M Hamming candidates (ties by id) and orders them by how well their
    codes agree with the query's pre-threshold scores."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.retrieval.rerank import agreement
    from dhim_ray.search import Searcher

    hasher, texts = store["hasher"], store["texts"]
    codes = hasher.encode(texts)
    rows = np.arange(len(texts))
    ids = document_ids("toy@2", rows)
    target = MilvusTarget(str(tmp_path / "s.db"), "toy16s")
    with target.open() as collection:
        collection.ensure(16, hasher.model_id)
        collection.upsert(code_rows({"id": ids, "code": codes, "text": texts, "row": rows}, 16, "toy@2"))
    query = ["football match goal"]
    q_codes, q_scores, _ = hasher.encode(query, scores=True)
    d_code = np.bitwise_count(codes ^ q_codes[0]).sum(1)
    candidates = sorted(range(len(texts)), key=lambda i: (d_code[i], ids[i]))[:5 * 4]
    agree = agreement(q_scores, codes[candidates][None])[0]  # the re-rank's own score, over the candidates
    want = [candidates[j] for j in np.argsort(-agree, kind="stable")[:5]]
    with Searcher(store["model"], target) as searcher:
        hits = searcher.run(SearchRequest(query, k=5, rerank=4, mode="codes")).hits[0]
    assert [h["id"] for h in hits] == [int(ids[i]) for i in want]
