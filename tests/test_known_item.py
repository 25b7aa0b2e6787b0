"""Known-item retrieval: windows cut from documents, ranks with ties averaged, the same
figures in memory and through Milvus."""

from __future__ import annotations

import numpy as np
import pytest

from dhim_ray.codes import pack_codes
from dhim_ray.errors import DataError
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.metrics import hamming_distances


def test_windows_are_consecutive_words_of_their_own_document_and_seeded():
    rng = np.random.default_rng(3)
    texts = [" ".join(f"d{d}w{i}" for i in range(int(rng.integers(3, 30)))) for d in range(50)]
    cut = known_item.cut_windows(texts, n_queries=200, words=5, seed=7)
    assert len(cut.texts) == 200 and cut.words == 5
    for window, target in zip(cut.texts, cut.targets):
        words = window.split()
        assert len(words) == 5 and f" {window} " in f" {texts[target]} "  # nothing from outside its document
        assert all(w.startswith(f"d{target}w") for w in words)
        assert len(texts[target].split()) >= 5
    again = known_item.cut_windows(texts, n_queries=200, words=5, seed=7)
    assert again.texts == cut.texts and np.array_equal(again.targets, cut.targets)
    assert known_item.cut_windows(texts, n_queries=200, words=5, seed=8).texts != cut.texts
    only = known_item.cut_windows(texts, n_queries=30, words=3, seed=0, candidates=np.arange(40, 50))
    assert set(only.targets.tolist()) <= set(range(40, 50))
    assert len(set(only.targets.tolist())) == 10  # drawn without replacement while there are enough


def test_no_document_long_enough_is_a_clear_error():
    with pytest.raises(DataError, match="no document has 8 words"):
        known_item.cut_windows(["too short", "also short"], words=8)


def test_scores_average_over_tied_positions():
    s = known_item.known_item_scores(np.array([0, 0, 5, 200]), np.array([1, 2, 10, 1]), ks=(1, 10, 100))
    assert s["recall_at_1"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    assert s["recall_at_10"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert s["recall_at_100"] == pytest.approx(3 / 4)
    mrr_tied = np.mean([1 / r for r in range(6, 16)])
    assert s["mrr"] == pytest.approx((1 + 0.75 + mrr_tied + 1 / 201) / 4)
    assert s["mean_rank"] == pytest.approx((1 + 1.5 + 10.5 + 201) / 4)


def test_hamming_ranks_equal_a_brute_force_count_and_duplicates_tie():
    rng = np.random.default_rng(0)
    db = pack_codes(rng.integers(0, 2, (300, 16)))
    db[10] = db[20]  # a duplicated document: its windows cannot tell the two apart
    q = pack_codes(rng.integers(0, 2, (40, 16)))
    q[0] = db[10]
    targets = rng.integers(0, 300, 40)
    targets[0] = 10
    better, tied = known_item.hamming_ranks(db, q, targets, memory_mb=1)  # several chunks
    d = hamming_distances(db, q)
    own = d[np.arange(40), targets][:, None]
    assert np.array_equal(better, (d < own).sum(1)) and np.array_equal(tied, (d == own).sum(1))
    assert better[0] == 0 and tied[0] == 2  # itself and its duplicate
    assert known_item.known_item_scores(better[:1], tied[:1])["recall_at_1"] == 0.5


def test_cosine_and_list_ranks():
    x = np.eye(4, dtype=np.float32)
    q = np.array([[1, 0.1, 0, 0], [0.2, 1, 0.3, 0]], dtype=np.float32)
    better, tied = known_item.cosine_ranks(x, q, np.array([0, 2]))
    assert better.tolist() == [0, 1] and tied.tolist() == [1, 1]
    better, tied = known_item.list_ranks(np.array([[3, 1, 2], [0, 1, 2]]), np.array([1, 9]), n_database=50)
    assert better.tolist() == [1, 49] and tied.tolist() == [1, 1]


@pytest.mark.slow
def test_windows_find_their_document_under_float_cosine(tmp_path):
    """On documents that share no words, a window of one ranks it first by cosine of the
    packaged encoder's vectors: the task's answer is known."""
    from dhim_ray.config import FeatureConfig
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.eval_in_memory import Baseline, WindowSpec, known_item_task

    vocab = ["apple", "river", "engine", "violin", "glacier", "senate", "protein", "harbour", "comet", "tractor",
             "opera", "volcano", "bishop", "satellite", "orchard", "copper", "tennis", "lantern", "desert", "fabric"]
    rng = np.random.default_rng(1)
    rows = []
    for d in range(20):
        words = [vocab[d]] * 6 + [f"{vocab[d]}s"] * 6
        rng.shuffle(words)
        rows.append(f'{d},"{" ".join(words)}"')
    (tmp_path / "train.csv").write_text("label,text\n" + "\n".join(rows) + "\n")
    r = known_item_task(Baseline("cosine", None, FeatureConfig(max_words=50)), CorpusSpec(str(tmp_path), "train"),
                        None, WindowSpec(40, 4, 0), progress=False)
    assert r["task"] == "known-item" and r["primary_metric"] == "recall_at_10" and r["n_queries"] == 40
    assert r["recall_at_1"] == 1.0 and r["mrr"] == 1.0


@pytest.mark.slow
def test_the_same_figures_in_memory_and_through_milvus(tmp_path, toy_folder, tiny_model):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.eval_in_memory import Model, WindowSpec, known_item_task
    from dhim_ray.evaluation import EvalRequest, evaluate
    from dhim_ray.hasher import Hasher

    model = tiny_model
    split = load_split(CorpusSpec(str(toy_folder), "train"))
    hasher = Hasher.load(model)
    target = MilvusTarget(str(tmp_path / "k.db"), "toy16")
    with target.open() as collection:
        collection.ensure(16, hasher.model_id)
        rows = np.arange(len(split.texts))
        collection.upsert(code_rows({"id": document_ids("toy@1", rows), "code": hasher.encode(split.texts),
                                     "label": split.labels, "text": split.texts, "row": rows}, 16, "toy@1"))
    spec = WindowSpec(60, 4, 3)
    memory = known_item_task(Model(model), CorpusSpec(str(toy_folder), "train"), None, spec, rerank=4, progress=False)
    milvus = evaluate(EvalRequest(model, collection=target, task="known-item", windows=spec, rerank=4))[0]
    for key in ("recall_at_1", "recall_at_10", "recall_at_100", "mrr", "mean_rank", "n_queries", "n_database"):
        assert milvus[key] == pytest.approx(memory[key]), key
    assert memory["n_database"] == len(split.texts) and memory["recall_at_100"] > memory["recall_at_1"] >= 0
