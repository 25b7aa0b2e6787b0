"""The evaluator: a method (``Model`` or ``Baseline``: features -> an index of the database and the
queries' side), a place for the database (``InMemory``: a corpus indexed by each method; an ingested
collection: dhim_ray.eval_in_milvus.InMilvus) and two tasks, ``topic`` (precision@k, both tie rules;
cosine-neighbour recall without labels) and ``known_item_task``, whichever the place. Run through
dhim_ray.evaluation.evaluate. No Ray, no Milvus."""

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
from dhim_ray.encoding.encoder import Features, FrozenEncoder
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
    """The database indexed for one method: what the tasks ask of it, wherever it is searched."""

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult: ...  # both tie rules
    # The labels (n_queries, k), in the queries' numbering, of each query's k x m candidates re-ranked:
    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray: ...
    def neighbour_recall(self, codes: np.ndarray, neighbours: np.ndarray) -> float: ...  # no labels
    # known-item: (better, tied) per query for ``targets`` (indices of the place's texts), plain and re-ranked
    def item_ranks(self, codes: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
    def reranked_ranks(self, codes: np.ndarray, scores: np.ndarray | None, targets: np.ndarray,
                       m: int) -> tuple[np.ndarray, np.ndarray]: ...


class Place(Protocol):
    """Where the database is (``InMemory``, dhim_ray.eval_in_milvus.InMilvus); ``about``: what a
    result says of it; ``n_database``: its documents, once the queries are read."""

    about: dict[str, Any]
    n_database: int

    def topic_queries(self, queries: CorpusSpec, k: int) -> tuple[Split, np.ndarray | None]: ...
    def windows(self, queries: CorpusSpec | None, spec: WindowSpec, cleaning: str) -> tuple[known_item.KnownItemQueries, str]: ...
    def index(self, method: Method, query_texts: list[str], progress: bool, cache_dir: str | Path | None) -> CodeDatabase: ...
    def vectors(self, method: Method, progress: bool, cache_dir: str | Path | None) -> np.ndarray: ...  # no labels


@dataclass
class InMemoryCodes:
    """A database of packed codes (and their labels) in memory, searched exactly by Hamming distance."""

    codes: np.ndarray
    labels: np.ndarray | None = None

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult:
        return precision_at_k(self.codes, self.labels, codes, labels, k)

    def reranked(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray:
        return rerank_topk(self.codes, codes, scores, k, m)[0]

    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray:
        return self.labels[self.reranked(codes, scores, k, m)]

    def neighbour_recall(self, codes: np.ndarray, neighbours: np.ndarray) -> float:
        return neighbour_recall_at_k(self.codes, codes, neighbours, neighbours.shape[1]).recall_at_k

    def item_ranks(self, codes: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return known_item.hamming_ranks(self.codes, codes, targets)

    def reranked_ranks(self, codes: np.ndarray, scores: np.ndarray | None, targets: np.ndarray,
                       m: int) -> tuple[np.ndarray, np.ndarray]:
        return known_item.list_ranks(self.reranked(codes, scores, max(known_item.RECALL_KS), m), targets,
                                     len(self.codes))


@dataclass
class InMemoryVectors:
    """A database of float vectors in memory, searched exactly by cosine (no ties: distances are continuous,
    so both tie rules give the same figure)."""

    vectors: np.ndarray
    labels: np.ndarray | None = None

    def precision(self, queries: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult:
        p = cosine_precision_at_k(self.vectors, self.labels, queries, labels, k)
        return PrecisionResult(k, p, p, len(queries), len(self.vectors))

    def precision_curve(self, queries: np.ndarray, labels: np.ndarray, ks: list[int]) -> list[float]:
        """Precision at every k of ``ks`` (ascending) from one search for the largest."""
        hits = np.cumsum(self.labels[cosine_topk(self.vectors, queries, ks[-1])] == labels[:, None], axis=1).mean(0)
        return [float(hits[c - 1] / c) for c in ks]

    def neighbour_recall(self, queries: np.ndarray, neighbours: np.ndarray) -> float:
        return _overlap(cosine_topk(self.vectors, queries, neighbours.shape[1]), neighbours)

    def item_ranks(self, queries: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return known_item.cosine_ranks(self.vectors, queries, targets)


def evaluate_codes(database: CodeDatabase, codes: np.ndarray, labels: np.ndarray, k: int, rerank: int = 1,
                   scores: np.ndarray | None = None, curve: bool = False) -> dict[str, Any]:
    """Precision@k of query ``codes`` with ``labels`` against ``database``; with ``rerank``
    m > 1 (and the queries' pre-threshold ``scores``) also the precision of the k x m
    candidates re-ranked.

    >>> evaluate_codes(InMemoryCodes(db_codes, db_labels), q_codes, q_labels, k=100)["precision_at_k"]
    """
    rerank = check_rerank(rerank)
    result = database.precision(codes, labels, k)
    out: dict[str, Any] = {**result.as_dict(), "primary_metric": "precision_at_k_tie_aware"}
    if curve:  # tie-aware precision at every k of the curve the database holds
        ks = [c for c in CURVE_KS if c <= result.n_database]
        at = getattr(database, "precision_curve", None) or (
            lambda q, y, ks: [database.precision(q, y, c).precision_at_k_tie_aware for c in ks])
        out["curve"] = {"k": ks, "value": at(codes, labels, ks), "metric": "precision@k (tie-aware)"}
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


def label_free_scores(neighbours: np.ndarray, recall: float, n_database: int) -> dict[str, Any]:
    """Eval without labels: ``recall``, the share of each query's k nearest database documents by
    cosine of the frozen encoder's mean-pooled vectors (``neighbours``, (n_q, k) from
    ``cosine_topk``) that a method finds (tie-aware for codes)."""
    return {"metric": NEIGHBOUR_METRIC, "k": neighbours.shape[1], "neighbour_recall_at_k": float(recall),
            "primary_metric": "neighbour_recall_at_k", "n_queries": len(neighbours), "n_database": n_database}


def _overlap(found: np.ndarray, neighbours: np.ndarray) -> float:
    """Mean share of each row of ``neighbours`` among the same row of ``found`` (index sets)."""
    return float(np.mean([len(np.intersect1d(a, b)) / neighbours.shape[1] for a, b in zip(found, neighbours)]))


# ---- what is measured: a model or a baseline --------------------------------------------------
class Model:
    """A trained DHIM model as an evaluated method: codes of the features, and the queries'
    pre-threshold scores that re-rank (``rerank`` m > 1)."""

    reranks = True

    def __init__(self, model_dir: str | Path, device: str = "cpu"):
        self.hasher = Hasher.load(model_dir, device=device)
        self.encoder = self.hasher.encoder
        self.about = {"method": "dhim", "model": str(model_dir), "n_bits": self.hasher.n_bits,
                      "bytes_per_doc": self.hasher.n_bytes}

    def fit(self, database: Features, labels: np.ndarray | None = None) -> InMemoryCodes:
        return InMemoryCodes(self.hasher.hash_features(database), labels)

    def queries(self, features: Features) -> tuple[np.ndarray, np.ndarray | None]:
        return self.hasher.score_features(features)

    def query_texts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        return self.hasher.encode(texts, scores=True)[:2]


class Baseline:
    """A classic hashing baseline (fitted on the database's mean-pooled vectors) or a float one
    (``FLOAT_BASELINES``: exact cosine kNN after its transform fitted on the database; ``n_bits`` unused)."""

    reranks = False

    def __init__(self, name: str, n_bits: int | None, features: FeatureConfig | None = None, seed: int = 0):
        check_baseline(name)
        self.name = name
        self.model = None if name in FLOAT_BASELINES else make_baseline(name, n_bits, seed)  # fail fast on a width
        self.encoder = FrozenEncoder(features or FeatureConfig(encoder=DEFAULT_ENCODER))
        self.fitted = None
        self.about: dict[str, Any] = {"method": name}

    def fit(self, database: Features, labels: np.ndarray | None = None) -> InMemoryCodes | InMemoryVectors:
        x = np.asarray(database.mean, np.float32)
        if self.model is None:
            kind = FLOAT_BASELINES[self.name]
            self.fitted = None if kind is None else fit_transform(kind, x)
            x = transform(self.fitted, x)
            self.about.update(dims=x.shape[1], bytes_per_doc=4 * x.shape[1])
            return InMemoryVectors(x, labels)
        self.model.fit(x)
        self.about.update(n_bits=self.model.n_bits, bytes_per_doc=self.model.n_bits // 8)
        return InMemoryCodes(self.model.hash(x), labels)

    def queries(self, features: Features) -> tuple[np.ndarray, None]:
        x = np.asarray(features.mean, np.float32)
        return (transform(self.fitted, x) if self.model is None else self.model.hash(x)), None

    def query_texts(self, texts: list[str]) -> tuple[np.ndarray, None]:
        return self.queries(self.encoder.features(texts))


Method = Model | Baseline


@dataclass(frozen=True)
class WindowSpec:
    """How known-item queries are cut (dhim_ray.retrieval.known_item.cut_windows)."""

    n_queries: int = 1000
    words: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        known_item.check_window(self.words, self.n_queries)


class InMemory:
    """The database as a corpus split in memory, encoded and indexed exactly by each method."""

    about: dict[str, Any] = {}

    def __init__(self, database: CorpusSpec):
        self.spec, self.texts, self.labels, self.features = database, [], None, None

    @property
    def n_database(self) -> int:
        return len(self.texts)

    def topic_queries(self, queries: CorpusSpec, k: int) -> tuple[Split, np.ndarray | None]:
        db, q, labels = eval_splits(self.spec, queries, k)
        self.texts, self.labels = db.texts, db.labels
        return q, labels

    def windows(self, queries: CorpusSpec | None, spec: WindowSpec, cleaning: str) -> tuple[known_item.KnownItemQueries, str]:
        """Windows of the database's documents; with ``queries`` the query split's documents join the
        database and windows are cut from them alone (held out, never trained on)."""
        db = load_split(self.spec, "train")
        self.texts, self.labels, candidates = db.texts, None, None
        where = f"windows of {self.spec.display}, each to find its document among them"
        if queries is not None:
            q = load_split(queries, "val")
            self.texts, candidates = db.texts + q.texts, np.arange(len(db.texts), len(db.texts) + len(q.texts))
            where = f"windows of {queries.display}, each to find its document among {self.spec.display} and {queries.display}"
        return known_item.cut_windows(self.texts, spec.n_queries, spec.words, spec.seed, candidates, cleaning), where

    def index(self, method: Method, query_texts: list[str], progress: bool, cache_dir: str | Path | None):
        self.features = method.encoder.features(self.texts, progress=progress, cache_dir=cache_dir)
        return method.fit(self.features, self.labels)

    def vectors(self, method: Method, progress: bool, cache_dir: str | Path | None) -> np.ndarray:
        return self.features.mean


def topic(method: Method, database: CorpusSpec | Place, queries: CorpusSpec, k: int = 100, rerank: int = 1,
          progress: bool = True, cache_dir: str | Path | None = None, curve: bool = False) -> dict[str, Any]:
    """Precision@k of ``method``: the queries encoded and searched in the database (a corpus, indexed
    exactly in memory, or a ``Place``); without labels, cosine-neighbour recall@k. ``rerank`` m > 1
    (a model) also reports the k x m Hamming candidates re-ranked by the queries' pre-threshold scores.

    >>> topic(Model("runs/bbc-64"), CorpusSpec("bbc", "train"), CorpusSpec("bbc", "test"))["precision_at_k"]"""
    rerank = check_rerank(rerank) if method.reranks else 1
    place = InMemory(database) if isinstance(database, CorpusSpec) else database
    q, q_labels = place.topic_queries(queries, k)
    t0 = time.perf_counter()
    index = place.index(method, q.texts, progress, cache_dir)
    q_f = method.encoder.features(q.texts, progress=progress, cache_dir=cache_dir)
    q_codes, q_scores = method.queries(q_f)
    if q_labels is None:
        neighbours = cosine_topk(place.vectors(method, progress, cache_dir), q_f.mean, k)  # once for both recalls
        out = label_free_scores(neighbours, index.neighbour_recall(q_codes, neighbours), place.n_database)
        if rerank > 1:
            out.update(rerank=rerank, rerank_by=BY_BITS, neighbour_recall_at_k_reranked=_overlap(
                index.reranked(q_codes, q_scores, out["k"], rerank), neighbours))
    else:
        out = evaluate_codes(index, q_codes, q_labels, k, rerank, q_scores, curve=curve)
    return {**method.about, **place.about, **out, "seconds": round(time.perf_counter() - t0, 2)}


# ---- known-item retrieval ----------------------------------------------------------------------
#: What a model's known-item figures measured: the codes alone, which a phrase rarely finds (the
#: hybrid search of an ingested collection, BM25 first, finds nearly every one).
IN_MEMORY_CODES = ("the codes alone, in memory; an ingested collection searches hybrid (BM25 first): "
                   "dhim-ray eval {model} --task known-item --collection NAME")


def known_item_result(method: str, better, tied, windows: known_item.KnownItemQueries, n_database: int,
                       where: str, curve: bool = False, **extra) -> dict[str, Any]:
    out = {"task": known_item.TASK, "method": method, **extra, **known_item.known_item_scores(better, tied),
           "primary_metric": known_item.PRIMARY, "window_words": windows.words, "n_queries": len(windows.texts),
           "n_database": n_database, "seed": windows.seed, "queries": where}
    if curve:
        ks = [c for c in CURVE_KS if c <= n_database]
        at = known_item.known_item_scores(better, tied, ks)
        out["curve"] = {"k": ks, "value": [at[f"recall_at_{c}"] for c in ks], "metric": "known-item recall@k"}
    return out


def known_item_task(method: Method, database: CorpusSpec | Place, queries: CorpusSpec | None = None,
                    windows: WindowSpec = WindowSpec(), rerank: int = 1, progress: bool = True,
                    cache_dir: str | Path | None = None, curve: bool = False) -> dict[str, Any]:
    """Known-item retrieval of ``method``: each query is a window of words cut from a document, the one
    relevant result that document (dhim_ray.retrieval.known_item). With ``rerank`` m > 1 (a model) also
    the re-ranked list's figures (suffix ``_reranked``).

    >>> known_item_task(Model("runs/bbc-64"), CorpusSpec("bbc", "train"))["recall_at_10"]"""
    rerank = check_rerank(rerank) if method.reranks else 1
    place = InMemory(database) if isinstance(database, CorpusSpec) else database
    cut, where = place.windows(queries, windows, method.encoder.config.cleaning)
    t0 = time.perf_counter()
    index = place.index(method, cut.texts, progress, cache_dir)
    q_codes, q_scores = method.query_texts(cut.texts)
    about = {**method.about, **place.about}
    if isinstance(method, Model) and isinstance(place, InMemory):
        about["searched"] = IN_MEMORY_CODES.format(model=about["model"])
    out = known_item_result(about.pop("method"), *index.item_ranks(q_codes, cut.targets), cut, place.n_database,
                             where, curve, **about)
    if rerank > 1:
        reranked = known_item.known_item_scores(*index.reranked_ranks(q_codes, q_scores, cut.targets, rerank))
        out.update(rerank=rerank, rerank_by=BY_BITS, **{f"{k}_reranked": v for k, v in reranked.items()})
    return {**out, "seconds": round(time.perf_counter() - t0, 2)}
