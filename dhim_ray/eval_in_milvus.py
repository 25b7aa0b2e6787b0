"""Evaluation with the search done by Milvus: precision@k (``evaluate_in_milvus``, the in-memory
evaluator's ``evaluate_codes`` over a ``MilvusCodes`` database) and known-item retrieval
(``known_item_in_milvus``) of a model's ingested collection, in codes, text or hybrid mode.

    >>> evaluate_in_milvus("runs/bbc-64", CorpusSpec("bbc", "test"), MilvusTarget("dhim_ray.db", "bbc_64"))"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.connectors.connection import mask_uri
from dhim_ray.connectors.milvus import MAX_SEARCH_K, IndexSpec, MilvusTarget
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError, StoreError
from dhim_ray.eval_in_memory import InMemoryCodes, WindowSpec, evaluate_codes, known_item_result, label_free_scores
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.fusion import Fusion
from dhim_ray.retrieval.metrics import PrecisionResult, cosine_topk, tie_aware_hits
from dhim_ray.retrieval.rerank import check_rerank
from dhim_ray.search import Searcher

logger = logging.getLogger(__name__)


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
    (dhim_ray.eval_in_memory.evaluate_codes) over a ``MilvusCodes`` database; tie-aware precision
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
            raise ConfigError(f"k={k}: larger than the collection ({n_db} codes); use k={n_db} or less", field="k")
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
            result = {"k": k, "precision_at_k": found / (len(hits) * k), "primary_metric": "precision_at_k",
                      "n_queries": len(hits), "n_database": n_db,
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
                          "queries with labels (label_column=NAME)", field="mode")
    if rerank > 1:
        raise ConfigError(f"rerank={rerank}: without labels, eval scores the codes alone; drop rerank", field="rerank")
    logger.warning("the queries have no labels: scoring by how many of each query's %d nearest documents by cosine "
                   "of the frozen encoder's sentence vectors the stored codes find (every stored text encoded again)",
                   k)
    ids = searcher.collection.ids()
    stored = searcher.collection.get(ids, ["text"])
    db_f = searcher.hasher.encoder.features([stored[int(i)]["text"] for i in ids], progress=False)
    q_f = searcher.hasher.encoder.features(queries, progress=False)
    neighbours = cosine_topk(db_f.mean, q_f.mean, k)
    db_codes = searcher.collection.fetch_codes(ids, searcher.hasher.n_bits)
    recall = InMemoryCodes(db_codes).neighbour_recall(searcher.hasher.hash_features(q_f), neighbours)
    return label_free_scores(neighbours, recall, len(ids))


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
        out = known_item_result("dhim", better, tied, cut, n_db, f"windows of the texts stored in {target.collection}",
                                 mode=mode, **({"fusion": str(fusion)} if mode == "hybrid" else {}),
                                 search=f"milvus {mask_uri(target.uri)}/{target.collection}",
                                 n_bits=searcher.hasher.n_bits, bytes_per_doc=searcher.hasher.n_bytes)
        if rerank > 1:
            hits = searcher.search_encoded(cut.texts, codes, max(known_item.RECALL_KS), rerank, scores, mode=mode,
                                           fusion=fusion, output_fields=())
            reranked = known_item.known_item_scores(*known_item.list_ranks(_id_lists(hits), target_ids, n_db))
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
    """The evaluator's database (dhim_ray.eval_in_memory.CodeDatabase) as a Milvus
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
