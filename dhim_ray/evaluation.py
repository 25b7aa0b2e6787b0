"""The eval command's request (``EvalRequest``, checked when made) and its one entry point.

    >>> request = EvalRequest("runs/bbc-64", database=CorpusSpec.parse("bbc:train"),
    ...                       queries=CorpusSpec.parse("bbc:val"), baselines=("itq",))
    >>> [r["precision_at_k"] for r in evaluate(request)]   # the model's, then ITQ's"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.config import DEFAULT_ENCODER, FeatureConfig
from dhim_ray.connectors.connection import mask_uri
from dhim_ray.connectors.milvus import MAX_SEARCH_K, IndexSpec, MilvusTarget
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError, StoreError
from dhim_ray.evaluate import WindowSpec, codes_found, evaluate_codes, label_free_scores
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.baselines import FLOAT_BASELINES
from dhim_ray.retrieval.fusion import Fusion, check_mode
from dhim_ray.retrieval.metrics import PrecisionResult, cosine_topk, tie_aware_hits
from dhim_ray.retrieval.rerank import check_rerank
from dhim_ray.search import Searcher

logger = logging.getLogger(__name__)

TASKS = ("topic", "known-item")
#: A hashing baseline's width when none is given (ubinary: the encoder's own).
BASELINE_BITS = 64
BASELINE_WORDS = 50


def _shown(spec: CorpusSpec) -> str:
    return f"{spec.name}:{spec.split}" if spec.split else spec.name


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: a ``model_dir`` and/or ``baselines``, scored against a ``database`` corpus
    (in memory) or a Milvus ``collection``, on ``task`` topic (precision@k; cosine-neighbour
    recall without labels) or known-item (``windows`` cut from documents). ``bits``, ``encoder``,
    ``max_words`` apply to baselines; ``nprobe``, ``mode``, ``fusion`` to a collection; ``rerank`` m
    re-ranks k x m candidates; ``curves`` gives precision at every k. See docs/evaluation.md."""

    model_dir: str | Path | None = None
    baselines: tuple[str, ...] = ()
    database: CorpusSpec | None = None
    queries: CorpusSpec | None = None
    collection: MilvusTarget | None = None
    task: str = "topic"
    k: int = 100
    rerank: int = 1
    bits: int | None = None
    encoder: str | None = None
    max_words: int | None = None
    nprobe: int | None = None
    mode: str | None = None
    fusion: Fusion | None = None
    windows: WindowSpec = WindowSpec()
    cache_dir: str | Path | None = None
    curves: bool = False

    def __post_init__(self):
        object.__setattr__(self, "baselines", tuple(dict.fromkeys(self.baselines or ())))
        check_rerank(self.rerank)
        if self.task not in TASKS:
            raise ConfigError(f"task={self.task!r}: choose topic or known-item")
        if self.mode is not None:
            check_mode(self.mode)
        self._check_methods()
        self._check_place()
        if self.cache_dir is not None:
            from dhim_ray.encoding.feature_store import check_cache_dir

            check_cache_dir(self.cache_dir)

    def _check_methods(self) -> None:
        """A model, baselines or both, and the options each takes."""
        if self.model_dir is None and not self.baselines:
            raise ConfigError("give a model folder, baseline=NAME, or both to compare them")
        if self.rerank > 1 and self.model_dir is None:
            raise ConfigError(f"rerank={self.rerank} with baseline={self.baselines[0]}: re-ranking needs a DHIM "
                              "model's scores; drop one")
        if not self.baselines:  # options a model does not take are refused, never ignored
            for name in ("bits", "encoder", "max_words"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name}={getattr(self, name)}: applies to baseline=NAME only; a model uses the "
                                      "width, encoder and words it was trained with, drop it")
        elif self.bits is not None and all(b in FLOAT_BASELINES for b in self.baselines):
            raise ConfigError(f"bits={self.bits}: baseline={self.baselines[0]} searches the float vectors, not codes; "
                              "drop it")

    def _check_place(self) -> None:
        """In memory (a database corpus) or in Milvus (a collection), and what each needs."""
        if self.collection is None:
            for name in ("nprobe", "mode", "fusion"):
                if (value := getattr(self, name)) is not None:
                    raise ConfigError(f"{name}={getattr(value, 'method', value)}: applies to a Milvus collection=NAME only "
                                      "(in-memory eval searches the codes exactly); drop it or add collection=NAME")
            if self.database is None:
                raise ConfigError("eval needs database=CORPUS:SPLIT (or collection=NAME to search Milvus)")
        else:
            name = self.collection.collection
            if self.database is not None:
                raise ConfigError(f"database={_shown(self.database)} and collection={name} both given; the "
                                  "collection is the database, drop one")
            if self.model_dir is None:
                raise ConfigError(f"collection={name}: give the model folder the collection was ingested with")
            if self.baselines:
                raise ConfigError(f"collection={name} searches the model's codes in Milvus; baseline="
                                  f"{self.baselines[0]} is evaluated in memory against database=CORPUS: drop one")
            if self.curves:
                raise ConfigError(f"collection={name}: curves are drawn from in-memory evaluations "
                                  "(database=CORPUS); drop collection=NAME or the plot")
            if self.task == "known-item" and self.queries is not None:
                raise ConfigError(f"queries={_shown(self.queries)}: known-item windows in a collection are cut from "
                                  "its own texts; drop it")
        if self.task == "topic" and self.queries is None:
            raise ConfigError("eval needs queries=CORPUS:SPLIT, e.g. queries=bbc:test")

    def baseline_bits(self, name: str, model_bits: int | None = None) -> int | None:
        """A hashing baseline's width: ``bits``, else the model's beside it, else 64 (ubinary:
        its encoder's)."""
        if self.bits is not None or name == "ubinary":
            return self.bits
        return BASELINE_BITS if model_bits is None else model_bits

    def baseline_features(self, model: FeatureConfig | None = None) -> FeatureConfig:
        """The features the baselines hash: ``encoder`` and ``max_words`` where given, else the
        model's beside them (the same encoder pass: the corpus is encoded once), else the
        packaged encoder and 50 words."""
        if model is None:
            return FeatureConfig(DEFAULT_ENCODER if self.encoder is None else self.encoder,
                                 BASELINE_WORDS if self.max_words is None else self.max_words)
        if self.encoder is None and self.max_words is None:
            return model
        return FeatureConfig(model.encoder if self.encoder is None else self.encoder,
                             model.max_words if self.max_words is None else self.max_words)


def evaluate(request: EvalRequest, progress: bool = True) -> list[dict[str, Any]]:
    """Every method of ``request`` measured, the model first: one result dict each (the
    figures of its task, ``method``, ``n_queries``, ``n_database``; ``curve`` where asked)."""
    r = request
    if r.collection is not None:
        if r.task == "known-item":
            return [known_item_in_milvus(r.model_dir, r.collection, r.windows, nprobe=r.nprobe, rerank=r.rerank,
                                         mode=r.mode, fusion=r.fusion)]
        return [evaluate_in_milvus(r.model_dir, r.queries, r.collection, k=r.k, nprobe=r.nprobe, rerank=r.rerank,
                                   mode=r.mode, fusion=r.fusion)]
    from dhim_ray.encoding.encoder import shared_features

    with shared_features():  # every method encodes the same texts: once, where the settings agree
        return _evaluate_in_memory(r, progress)


def _evaluate_in_memory(r: EvalRequest, progress: bool) -> list[dict[str, Any]]:
    from dhim_ray import evaluate as ev

    model = None
    if r.model_dir is not None and r.baselines:  # compared on the model's own features and width
        from dhim_ray.model.checkpoint import read_checkpoint

        model = read_checkpoint(r.model_dir)
    features = r.baseline_features(None if model is None else model.config.features)
    bits = {name: r.baseline_bits(name, None if model is None else model.n_bits) for name in r.baselines}
    common = {"progress": progress, "cache_dir": r.cache_dir, "curve": r.curves}
    results = []
    if r.task == "known-item":
        if r.model_dir is not None:
            results.append(ev.known_item_checkpoint(r.model_dir, r.database, r.queries, r.windows, r.rerank, **common))
        results += [ev.known_item_baseline(name, bits[name], r.database, r.queries, r.windows, features,
                                           **common) for name in r.baselines]
        return results
    if r.model_dir is not None:
        results.append(ev.evaluate_checkpoint(r.model_dir, r.database, r.queries, r.k, rerank=r.rerank, **common))
    results += [ev.evaluate_baseline(name, bits[name], r.database, r.queries, r.k, features=features,
                                     **common) for name in r.baselines]
    return results


def evaluate_in_milvus(
    model_dir: str | Path,
    queries: CorpusSpec,
    target: MilvusTarget,
    k: int = 100,
    index: IndexSpec | None = None,
    nprobe: int | None = None,
    rerank: int = 1,
    mode: str | None = None,
    fusion: Fusion | None = None,
) -> dict[str, Any]:
    """Precision@k with the search done by Milvus. ``mode`` codes: the one evaluator
    (dhim_ray.evaluate.evaluate_codes) over a ``MilvusCodes`` database; tie-aware precision
    needs every database code at the k-th distance, so the search asks for k plus the ties.
    ``rerank`` m > 1 also reports the precision of the k x m candidates re-ranked. ``mode``
    text or hybrid (the default on a collection with a text index): precision of the k hits
    in the order the search returns them (a fused list has no ties to average)."""
    check_rerank(rerank)
    q = load_split(queries, "val")
    q_labels = q.labels
    t0 = time.perf_counter()
    with Searcher(model_dir, target, index=index, nprobe=nprobe) as searcher:
        mode = searcher.resolve_mode(mode)
        n_db = searcher.count()
        if k > n_db:
            raise ConfigError(f"k={k}: larger than the collection ({n_db} codes); use k={n_db} or less")
        if q_labels is None:
            out = {"method": "dhim", "mode": mode, "search": f"milvus {mask_uri(target.uri)}/{target.collection}",
                   "n_bits": searcher.hasher.n_bits, **label_free_in_milvus(searcher, q.texts, k, mode, rerank)}
            return {**out, "seconds": round(time.perf_counter() - t0, 2)}
        codes, scores = searcher.hasher.encode(q.texts, scores=True)[:2]
        label_of = hit_labels(searcher.info.label_names, q.label_names, queries.display, target.collection)
        if mode == "codes":
            result = evaluate_codes(MilvusCodes(searcher, label_of, n_db), codes, q_labels, k, rerank, scores)
        else:
            fusion = fusion or Fusion()
            hits = searcher.search_encoded(q.texts, codes, k, rerank, scores, mode=mode, fusion=fusion,
                                           output_fields=label_of.fields)
            found = sum(int((label_of(row) == label).sum()) for row, label in zip(hits, q_labels) if row)
            result = {"k": k, "precision_at_k": found / (len(hits) * k), "n_queries": len(hits), "n_database": n_db,
                      **({"fusion": str(fusion)} if mode == "hybrid" else {}),
                      **({"rerank": rerank} if rerank > 1 else {})}
        out = {"method": "dhim", "mode": mode, "search": f"milvus {mask_uri(target.uri)}/{target.collection}",
               "n_bits": searcher.hasher.n_bits, **result}
    return {**out, "seconds": round(time.perf_counter() - t0, 2)}


def label_free_in_milvus(searcher: Searcher, queries: list[str], k: int, mode: str, rerank: int = 1) -> dict[str, Any]:
    """Eval without labels on a collection: how many of each query's k nearest stored documents
    by cosine of the frozen encoder's sentence vectors (the stored texts, their first 1,024
    characters, encoded again) the stored codes find, tie-aware, as the in-memory eval scores
    them (``label_free_scores``). It reads every row's text, then every row's code (ranked by
    exact Hamming distance, whatever the index)."""
    if mode != "codes":
        raise ConfigError(f"mode={mode}: without labels, eval scores the codes' neighbours; use mode=codes, or give "
                          "queries with labels (--label-column)")
    if rerank > 1:
        raise ConfigError(f"rerank={rerank}: without labels, eval scores the codes alone; drop rerank")
    logger.warning("the queries have no labels: scoring by how many of each query's %d nearest documents by cosine "
                   "of the frozen encoder's sentence vectors the stored codes find (every stored text encoded again)",
                   k)
    ids = searcher.collection.ids()
    stored = searcher.collection.get(ids, ["text"])
    db_f = searcher.hasher.encoder.features([stored[int(i)]["text"] for i in ids], progress=False)
    q_f = searcher.hasher.encoder.features(queries, progress=False)
    neighbours = cosine_topk(db_f.mean, q_f.mean, k)
    db_codes = searcher.collection.fetch_codes(ids, searcher.hasher.n_bits)
    return label_free_scores(neighbours, codes_found(db_codes, searcher.hasher.hash_features(q_f)), len(ids))


#: Collections up to this size give their windows from every stored text (the same windows
#: an in-memory eval of the same split cuts); larger ones from a seeded sample of rows.
KNOWN_ITEM_ALL_TEXTS = 100_000


def known_item_in_milvus(model_dir: str | Path, target: MilvusTarget, windows: WindowSpec = WindowSpec(),
                         nprobe: int | None = None, rerank: int = 1, mode: str | None = None,
                         fusion: Fusion | None = None) -> dict[str, Any]:
    """Known-item retrieval with the search done by Milvus: windows cut from the stored texts
    (rows in id order, i.e. source order), hashed, searched; each target's rank from the hits
    (``mode`` codes: see ``known_item_ranks``; text or hybrid, the default on a collection with
    a text index: its place in the top 100 returned). ``rerank`` m > 1 also scores the
    re-ranked top 100."""
    check_rerank(rerank)
    t0 = time.perf_counter()
    with Searcher(model_dir, target, nprobe=nprobe) as searcher:
        mode = searcher.resolve_mode(mode)
        ids = searcher.collection.ids()
        if len(ids) > KNOWN_ITEM_ALL_TEXTS:
            rng = np.random.default_rng([windows.seed, 1])
            ids = np.sort(rng.choice(ids, size=min(len(ids), 4 * windows.n_queries), replace=False))
        texts = searcher.collection.get(ids, ["text"])
        cut = known_item.cut_windows([texts[int(i)]["text"] for i in ids], windows.n_queries, windows.words,
                                     windows.seed, cleaning=searcher.hasher.config.features.cleaning)
        target_ids = ids[cut.targets]
        codes, scores, _ = searcher.hasher.encode(cut.texts, scores=True)
        n_db = searcher.count()
        if mode == "codes":
            better, tied = known_item_ranks(searcher, codes, target_ids, n_db)
        else:
            fusion = fusion or Fusion()
            hits = searcher.search_encoded(cut.texts, codes, min(max(known_item.RECALL_KS), n_db), mode=mode,
                                           fusion=fusion, output_fields=())
            better, tied = known_item.list_ranks(_id_lists(hits), target_ids, n_db)
        out = {"task": known_item.TASK, "method": "dhim", "mode": mode,
               **({"fusion": str(fusion)} if mode == "hybrid" else {}),
               "search": f"milvus {mask_uri(target.uri)}/{target.collection}",
               "n_bits": searcher.hasher.n_bits, "bytes_per_doc": searcher.hasher.n_bytes,
               **known_item.known_item_scores(better, tied), "primary_metric": known_item.PRIMARY,
               "window_words": windows.words, "n_queries": len(cut.texts), "n_database": n_db, "seed": windows.seed}
        if rerank > 1:
            hits = searcher.search_encoded(cut.texts, codes, max(known_item.RECALL_KS), rerank, scores, mode=mode,
                                           fusion=fusion, output_fields=())
            ranked = _id_lists(hits)
            reranked = known_item.known_item_scores(*known_item.list_ranks(ranked, target_ids, n_db))
            out.update(rerank=rerank, **{f"{k}_reranked": v for k, v in reranked.items()})
    return {**out, "seconds": round(time.perf_counter() - t0, 2)}


def _id_lists(hits: list[list[dict[str, Any]]]) -> np.ndarray:
    """Each query's hit ids as one (n, longest) array, short lists padded with -1 (no row)."""
    width = max((len(row) for row in hits), default=0)
    out = np.full((len(hits), max(width, 1)), -1, dtype=np.int64)
    for i, row in enumerate(hits):
        out[i, : len(row)] = [h["id"] for h in row]
    return out


def known_item_ranks(searcher: Searcher, codes: np.ndarray, target_ids: np.ndarray,
                     n_database: int) -> tuple[np.ndarray, np.ndarray]:
    """(better, tied) per query from the store's own search: the target's stored code gives
    its distance d; the hits (up to Milvus' 16384 cap) count the codes nearer than d and at
    d. Exact while better + tied fits under the cap (every collection of 16384 rows or
    fewer); past it the counts are lower bounds, and such a target is far outside any
    recall@k reported."""
    stored = searcher.collection.fetch_codes(target_ids, searcher.hasher.n_bits)
    own = np.bitwise_count(stored ^ codes).sum(1)
    limit = min(MAX_SEARCH_K, n_database)
    better = np.empty(len(codes), dtype=np.int64)
    tied = np.empty(len(codes), dtype=np.int64)
    for start in range(0, len(codes), 64):
        hits = searcher.search_codes(codes[start : start + 64], limit, output_fields=())
        for j, row in enumerate(hits):
            dist = np.array([h["distance"] for h in row])
            d = own[start + j]
            better[start + j] = int((dist < d).sum())
            tied[start + j] = max(1, int((dist == d).sum()))
    return better, tied


class MilvusCodes:
    """The evaluator's database (dhim_ray.evaluate.CodeDatabase) as a Milvus
    collection: precision from the store's own search, ties fetched in full."""

    def __init__(self, searcher: Searcher, label_of: HitLabels, n_database: int):
        self.searcher, self.label_of, self.n_database = searcher, label_of, n_database

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult:
        """Both precisions from store results: the k nearest, then every code tied at the
        k-th distance (the hits needed for the expectation over random tie-breaking).
        Ties are fetched with a larger top-k (2k, then four times more each round, up to Milvus' 16384 cap, or the
        whole collection); ordered precision sorts hits by (distance, row): the store's
        own tie order is not specified."""
        label_of, n_db, searcher = self.label_of, self.n_database, self.searcher
        ordered = expected = 0.0
        for i in range(len(codes)):
            limit = min(k * 2, MAX_SEARCH_K, n_db)
            while True:
                hits = searcher.search_codes(codes[i : i + 1], limit, output_fields=(*label_of.fields, "row"))[0]
                dist = np.array([h["distance"] for h in hits])
                kth = dist[k - 1]
                if dist[-1] > kth or limit >= min(n_db, MAX_SEARCH_K):
                    break
                limit = min(limit * 4, MAX_SEARCH_K, n_db)
            if dist[-1] == kth and limit < n_db:
                raise StoreError(f"query {i}: more than {MAX_SEARCH_K} codes tie at distance {kth}; tie-aware "
                                 "precision needs them all")
            rel = label_of(hits) == labels[i]
            expected += float(tie_aware_hits(dist[None, :], rel[None, :], k)[0])
            rows = np.array([h["row"] for h in hits])
            order = np.lexsort((rows, dist))[:k]  # database order = source row order
            ordered += rel[order].sum()
        n = len(codes)
        return PrecisionResult(k, ordered / (n * k), expected / (n * k), n, n_db)

    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray:
        hits = self.searcher.search_reranked(codes, scores, k, m, output_fields=self.label_of.fields)
        return np.array([self.label_of(row) for row in hits])


class HitLabels:
    """A hit's label in the queries' numbering: where the queries name their labels, the
    stored name looked up in their vocabulary (a class the queries lack matches nothing), so a
    query file holding some of the classes still lines up; else the stored number. Names on
    one side and bare numbers on the other cannot be matched: a DataError."""

    def __init__(self, names: list[str] | None = None, stored_names: bool = False, where: str = ""):
        self.index = None if names is None else {n: i for i, n in enumerate(names)}
        self.fields = ("label", "label_name") if stored_names else ("label",)
        self.where = where

    def __call__(self, hits: list[dict[str, Any]]) -> np.ndarray:
        from dhim_ray.errors import DataError

        named = [bool(h.get("label_name")) for h in hits]
        if self.index is None:
            if any(named):
                raise DataError(f"{self.where}: the collection labels its rows by name but the queries number "
                                "theirs, so they cannot be matched; give queries labelled with the same names")
            return np.array([h["label"] for h in hits])
        if not all(named):
            raise DataError(f"{self.where}: the queries label by name but the collection's rows hold numbers "
                            "only, so they cannot be matched; give numbered queries, or re-ingest from named labels")
        return np.array([self.index.get(h["label_name"], -2) for h in hits])


def hit_labels(stored_names: bool, query_names: list[str] | None, queries: str, collection: str) -> HitLabels:
    """How to compare a collection's labels with the queries' (see HitLabels)."""
    if query_names is not None and not stored_names:
        from dhim_ray.errors import DataError

        raise DataError(f"queries {queries} label by name but collection {collection!r} keeps no label names "
                        "(ingested before names were kept); give numbered queries, or re-ingest")
    return HitLabels(None if query_names is None else list(query_names), stored_names,
                     f"queries {queries} against collection {collection!r}")
