"""Precision@k of query codes against a ``CodeDatabase``, wherever it lives: codes hashed in
memory (``InMemoryCodes``) or a Milvus collection (dhim_ray.eval_in_milvus.MilvusCodes), scored the
same way by ``evaluate_codes`` (both tie rules; re-ranked with ``rerank`` m > 1; label-free
cosine-neighbour recall without labels). No Ray, no Milvus."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dhim_ray.config import DEFAULT_ENCODER, FeatureConfig
from dhim_ray.corpus.data import Split, align_labels, load_corpus, load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.encoding.transforms import fit_transform, transform
from dhim_ray.hasher import Hasher
from dhim_ray.plots import CURVE_KS
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.baselines import FLOAT_BASELINES, check_baseline, make_baseline
from dhim_ray.retrieval.metrics import (
    PrecisionResult,
    check_k,
    cosine_precision_at_k,
    cosine_topk,
    neighbour_recall_at_k,
    precision_at_k,
)
from dhim_ray.retrieval.rerank import BY_BITS, check_rerank, rerank_topk

logger = logging.getLogger(__name__)


class CodeDatabase(Protocol):
    """Where the database's codes are searched: what tells one evaluation from another."""

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult: ...  # both tie rules
    # The labels (n_queries, k), in the queries' numbering, of each query's k x m candidates re-ranked:
    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray: ...


@dataclass
class InMemoryCodes:
    """A database of packed codes and their labels in memory, searched exactly."""

    codes: np.ndarray
    labels: np.ndarray

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult:
        return precision_at_k(self.codes, self.labels, codes, labels, k)

    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray:
        idx, _ = rerank_topk(self.codes, codes, scores, k, m)
        return self.labels[idx]


def evaluate_codes(database: CodeDatabase, codes: np.ndarray, labels: np.ndarray, k: int, rerank: int = 1,
                   scores: np.ndarray | None = None, curve: bool = False) -> dict[str, Any]:
    """Precision@k of query ``codes`` with ``labels`` against ``database``; with ``rerank``
    m > 1 (and the queries' pre-threshold ``scores``) also the precision of the k x m
    candidates re-ranked.

    >>> evaluate_codes(InMemoryCodes(db_codes, db_labels), q_codes, q_labels, k=100)["precision_at_k"]
    """
    rerank = check_rerank(rerank)
    result = database.precision(codes, labels, k)
    out: dict[str, Any] = result.as_dict()
    if curve:  # tie-aware precision at every k of the curve the database holds
        ks = [c for c in CURVE_KS if c <= result.n_database]
        out["curve"] = {"k": ks, "value": [database.precision(codes, labels, c).precision_at_k_tie_aware for c in ks],
                        "metric": "precision@k (tie-aware)"}
    if rerank > 1:
        found = database.reranked_labels(codes, scores, result.k, rerank)
        out.update(rerank=rerank, rerank_by=BY_BITS,
                   precision_at_k_reranked=float((found == labels[:, None]).mean()))
    return out


#: What eval scores without labels (see label_free_scores).
NEIGHBOUR_METRIC = "cosine-neighbour recall@k (tie-aware; no labels)"


def eval_splits(database: CorpusSpec, queries: CorpusSpec, k: int | None = None) -> tuple[Split, Split, np.ndarray | None]:
    """(database split, query split, query labels in the database's label numbering, or
    None where either split has no labels: eval then scores without them). The same
    corpus is read once, so both splits share its label vocabulary. A ``k`` larger than the
    database is refused here, before any encoding."""
    db_spec = database.with_split(database.split or "train")
    q_spec = queries.with_split(queries.split or queries.default_split("val"))
    if db_spec.with_split(None) == q_spec.with_split(None):
        corpus = load_corpus(db_spec.with_split(None))
        db, q = corpus.split(db_spec.split), corpus.split(q_spec.split)
    else:
        db, q = load_split(db_spec), load_split(q_spec)
    labels = None if db.labels is None or q.labels is None else align_labels(db, q)
    if k is not None:
        check_k(k, len(db))
    if labels is None:
        where = " and ".join(f"{role} {spec.display}" for role, spec, split in
                             (("database", db_spec, db), ("queries", q_spec, q)) if split.labels is None)
        logger.warning("%s: no labels (--label-column NAME names them); scoring by how many of each query's "
                       "nearest documents by cosine of the frozen encoder's sentence vectors the codes find", where)
    return db, q, labels


def label_free_scores(neighbours: np.ndarray, found, n_database: int) -> dict[str, Any]:
    """Eval without labels: the share of each query's k nearest database documents by cosine
    of the frozen encoder's mean-pooled vectors (``neighbours``, (n_q, k) from
    ``cosine_topk``) that a method finds. ``found``: a callable (neighbours) -> recall in
    [0, 1] (tie-aware for codes)."""
    return {"metric": NEIGHBOUR_METRIC, "k": neighbours.shape[1], "neighbour_recall_at_k": float(found(neighbours)),
            "n_queries": len(neighbours), "n_database": n_database}


def codes_found(db_codes: np.ndarray, q_codes: np.ndarray):
    """label_free_scores' ``found`` for packed codes: tie-aware recall of the neighbours."""
    return lambda neighbours: neighbour_recall_at_k(db_codes, q_codes, neighbours, neighbours.shape[1]).recall_at_k


def _overlap(found: np.ndarray, neighbours: np.ndarray) -> float:
    """Mean share of each row of ``neighbours`` among the same row of ``found`` (index sets)."""
    return float(np.mean([len(np.intersect1d(a, b)) / neighbours.shape[1] for a, b in zip(found, neighbours)]))


def evaluate_checkpoint(
    model_dir: str | Path,
    database: CorpusSpec,
    queries: CorpusSpec,
    k: int = 100,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    rerank: int = 1,
    curve: bool = False,
) -> dict[str, Any]:
    """Precision@k of a trained model: hash database and queries, search exactly.
    ``rerank`` m > 1 also reports the precision of the k x m Hamming candidates
    re-ranked by agreement with the queries' pre-threshold scores."""
    rerank = check_rerank(rerank)
    hasher = Hasher.load(model_dir, device=device)
    db, q, q_labels = eval_splits(database, queries, k)
    t0 = time.perf_counter()
    db_f = hasher.encoder.features(db.texts, progress=progress, cache_dir=cache_dir)
    q_f = hasher.encoder.features(q.texts, progress=progress, cache_dir=cache_dir)
    db_codes = hasher.hash_features(db_f)
    q_codes, q_scores = hasher.score_features(q_f)
    if q_labels is None:
        neighbours = cosine_topk(db_f.mean, q_f.mean, k)  # once: the plain and the re-ranked recall share them
        out = {"method": "dhim", "model": str(model_dir), "n_bits": hasher.n_bits,
               **label_free_scores(neighbours, codes_found(db_codes, q_codes), len(db_codes))}
        if rerank > 1:
            idx, _ = rerank_topk(db_codes, q_codes, q_scores, out["k"], rerank)
            out.update(rerank=rerank, rerank_by=BY_BITS, neighbour_recall_at_k_reranked=_overlap(idx, neighbours))
        return {**out, "seconds": round(time.perf_counter() - t0, 2)}
    scores = evaluate_codes(InMemoryCodes(db_codes, db.labels), q_codes, q_labels, k, rerank, q_scores, curve=curve)
    return {"method": "dhim", "model": str(model_dir), "n_bits": hasher.n_bits, **scores,
            "seconds": round(time.perf_counter() - t0, 2)}


def evaluate_baseline(
    baseline: str,
    n_bits: int | None,
    database: CorpusSpec,
    queries: CorpusSpec,
    k: int = 100,
    features: FeatureConfig | None = None,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    curve: bool = False,
) -> dict[str, Any]:
    """Precision@k of a classic hashing baseline on the frozen mean-pooled features, or of a
    float baseline (``FLOAT_BASELINES``: exact cosine kNN, ``n_bits`` unused)."""
    check_baseline(baseline)
    model = None if baseline in FLOAT_BASELINES else make_baseline(baseline, n_bits, seed)  # fail fast on a width
    enc = FrozenEncoder(features or FeatureConfig(encoder=DEFAULT_ENCODER))
    db, q, q_labels = eval_splits(database, queries, k)
    db_f = enc.features(db.texts, progress=progress, cache_dir=cache_dir)
    q_f = enc.features(q.texts, progress=progress, cache_dir=cache_dir)
    if model is None:
        return _float_baseline(baseline, db_f.mean, db.labels, q_f.mean, q_labels, k, curve)
    model.fit(db_f.mean)
    n_bits = model.n_bits
    if q_labels is None:
        found = codes_found(model.hash(db_f.mean), model.hash(q_f.mean))
        return {"method": baseline, "n_bits": n_bits, "bytes_per_doc": n_bits // 8,
                **label_free_scores(cosine_topk(db_f.mean, q_f.mean, k), found, len(db_f.mean))}
    scores = evaluate_codes(InMemoryCodes(model.hash(db_f.mean), db.labels), model.hash(q_f.mean), q_labels, k,
                            curve=curve)
    return {"method": baseline, "n_bits": n_bits, "bytes_per_doc": n_bits // 8, **scores}


def _transformed(name: str, database, queries) -> tuple[np.ndarray, np.ndarray]:
    """A float baseline's database and query vectors, float32, through its transform fitted on
    the database (as they are for cosine)."""
    kind = FLOAT_BASELINES[name]
    fitted = None if kind is None else fit_transform(kind, np.asarray(database, np.float32))
    return transform(fitted, np.asarray(database, np.float32)), transform(fitted, np.asarray(queries, np.float32))


def _float_baseline(name: str, database, database_labels, queries, query_labels, k: int,
                    curve: bool = False) -> dict[str, Any]:
    """Cosine kNN precision@k on float vectors, after the baseline's transform fitted on the database."""
    plain_x, plain_q = np.asarray(database, np.float32), np.asarray(queries, np.float32)
    x, qv = _transformed(name, plain_x, plain_q)
    if query_labels is None:  # without labels: the plain vectors' neighbours the transformed ones find
        return {"method": name, "dims": x.shape[1], "bytes_per_doc": 4 * x.shape[1],
                **label_free_scores(cosine_topk(plain_x, plain_q, k),
                                    lambda nb: _overlap(cosine_topk(x, qv, nb.shape[1]), nb), len(plain_x))}
    p = cosine_precision_at_k(x, database_labels, qv, query_labels, k)
    # distances are continuous: no ties to break, so both tie rules give the same figure
    out = {"method": name, "dims": x.shape[1], "bytes_per_doc": 4 * x.shape[1], "k": k, "precision_at_k": p,
           "precision_at_k_tie_aware": p, "n_queries": len(qv), "n_database": len(x)}
    if curve:
        ks = [c for c in CURVE_KS if c <= len(x)]
        relevant = np.asarray(database_labels)[cosine_topk(x, qv, ks[-1])] == np.asarray(query_labels)[:, None]
        hits = np.cumsum(relevant, axis=1).mean(axis=0)
        out["curve"] = {"k": ks, "value": [float(hits[c - 1] / c) for c in ks], "metric": "precision@k"}
    return out


# ---- known-item retrieval ----------------------------------------------------------------------
@dataclass(frozen=True)
class WindowSpec:
    """How known-item queries are cut (dhim_ray.retrieval.known_item.cut_windows)."""

    n_queries: int = 1000
    words: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        known_item.check_window(self.words, self.n_queries)


#: What a model's known-item figures measured: the codes alone, which a phrase rarely finds (the
#: hybrid search of an ingested collection, BM25 first, finds nearly every one).
IN_MEMORY_CODES = ("the codes alone, in memory; an ingested collection searches hybrid (BM25 first): "
                   "dhim-ray eval {model} --task known-item --collection NAME")


def known_item_corpus(database: CorpusSpec, queries: CorpusSpec | None) -> tuple[list[str], np.ndarray | None, str]:
    """(database texts, indices of the documents windows are cut from or None for all, what
    they are). With ``queries`` the query split's documents join the database and windows are
    cut from them alone: held-out documents, never trained on, among the training ones."""
    db = load_split(database, "train")
    if queries is None:
        return db.texts, None, f"windows of {database.display}, each to find its document among them"
    q = load_split(queries, "val")
    return db.texts + q.texts, np.arange(len(db.texts), len(db.texts) + len(q.texts)), \
        f"windows of {queries.display}, each to find its document among {database.display} and {queries.display}"


def _known_item_result(method: str, better, tied, windows: known_item.KnownItemQueries, n_database: int,
                       where: str, curve: bool = False, **extra) -> dict[str, Any]:
    out = {"task": known_item.TASK, "method": method, **extra, **known_item.known_item_scores(better, tied),
           "primary_metric": known_item.PRIMARY, "window_words": windows.words, "n_queries": len(windows.texts),
           "n_database": n_database, "seed": windows.seed, "queries": where}
    if curve:
        ks = [c for c in CURVE_KS if c <= n_database]
        at = known_item.known_item_scores(better, tied, ks)
        out["curve"] = {"k": ks, "value": [at[f"recall_at_{c}"] for c in ks], "metric": "known-item recall@k"}
    return out


def known_item_checkpoint(model_dir: str | Path, database: CorpusSpec, queries: CorpusSpec | None = None,
                          windows: WindowSpec = WindowSpec(), rerank: int = 1, progress: bool = True,
                          cache_dir: str | Path | None = None, device: str = "cpu",
                          curve: bool = False) -> dict[str, Any]:
    """Known-item retrieval of a trained model: each query is a window of words cut from a
    document, the one relevant result that document (dhim_ray.retrieval.known_item). With
    ``rerank`` m > 1 also the re-ranked list's figures (suffix ``_reranked``)."""
    rerank = check_rerank(rerank)
    hasher = Hasher.load(model_dir, device=device)
    texts, candidates, where = known_item_corpus(database, queries)
    cut = known_item.cut_windows(texts, windows.n_queries, windows.words, windows.seed, candidates,
                                 hasher.config.features.cleaning)
    t0 = time.perf_counter()
    db_codes = hasher.hash_features(hasher.encoder.features(texts, progress=progress, cache_dir=cache_dir))
    q_codes, q_scores, _ = hasher.encode(cut.texts, scores=True)
    better, tied = known_item.hamming_ranks(db_codes, q_codes, cut.targets)
    out = _known_item_result("dhim", better, tied, cut, len(texts), where, curve, model=str(model_dir),
                             n_bits=hasher.n_bits, bytes_per_doc=hasher.n_bytes,
                             searched=IN_MEMORY_CODES.format(model=model_dir))
    if rerank > 1:
        idx, _ = rerank_topk(db_codes, q_codes, q_scores, max(known_item.RECALL_KS), rerank)
        reranked = known_item.known_item_scores(*known_item.list_ranks(idx, cut.targets, len(texts)))
        out.update(rerank=rerank, rerank_by=BY_BITS, **{f"{k}_reranked": v for k, v in reranked.items()})
    return {**out, "seconds": round(time.perf_counter() - t0, 2)}


def known_item_baseline(baseline: str, n_bits: int | None, database: CorpusSpec, queries: CorpusSpec | None = None,
                        windows: WindowSpec = WindowSpec(), features: FeatureConfig | None = None, seed: int = 0,
                        progress: bool = True, cache_dir: str | Path | None = None,
                        curve: bool = False) -> dict[str, Any]:
    """Known-item retrieval of a hashing baseline (fitted on the database's vectors) or of a
    float baseline (cosine on the vectors, after its transform)."""
    check_baseline(baseline)
    model = None if baseline in FLOAT_BASELINES else make_baseline(baseline, n_bits, seed)
    enc = FrozenEncoder(features or FeatureConfig(encoder=DEFAULT_ENCODER))
    texts, candidates, where = known_item_corpus(database, queries)
    cut = known_item.cut_windows(texts, windows.n_queries, windows.words, windows.seed, candidates,
                                 enc.config.cleaning)
    x = enc.features(texts, progress=progress, cache_dir=cache_dir).mean
    qv = enc.features(cut.texts).mean
    if model is None:
        x, qv = _transformed(baseline, x, qv)
        better, tied = known_item.cosine_ranks(x, qv, cut.targets)
        return _known_item_result(baseline, better, tied, cut, len(texts), where, curve, dims=x.shape[1],
                                  bytes_per_doc=4 * x.shape[1])
    model.fit(x)
    better, tied = known_item.hamming_ranks(model.hash(x), model.hash(qv), cut.targets)
    return _known_item_result(baseline, better, tied, cut, len(texts), where, curve, n_bits=model.n_bits,
                              bytes_per_doc=model.n_bits // 8)
