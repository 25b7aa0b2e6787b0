"""The evaluator's database as a model's ingested collection, searched by Milvus in codes, text or
hybrid mode: ``InMilvus`` (a place for dhim_ray.eval_in_memory's two tasks) and its index.

    >>> model = Model("runs/bbc-64")
    >>> with InMilvus.open(model, MilvusTarget("dhim_ray.db", "bbc_64")) as place:
    ...     topic(model, place, CorpusSpec("bbc", "test"))["precision_at_k"]"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.connectors.connection import mask_uri
from dhim_ray.connectors.lexical import MAX_TEXT_WORK, text_work
from dhim_ray.connectors.milvus import MAX_SEARCH_K, MilvusTarget
from dhim_ray.corpus.data import Split, load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError, DataError, StoreError
from dhim_ray.eval_in_memory import InMemoryCodes, Model, WindowSpec
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.fusion import Fusion
from dhim_ray.retrieval.metrics import PrecisionResult, tie_aware_hits
from dhim_ray.search import Searcher, SearchRequest

logger = logging.getLogger(__name__)

#: Collections up to this size give their windows from every stored text (the same windows
#: an in-memory eval of the same split cuts); larger ones from a seeded sample of rows.
KNOWN_ITEM_ALL_TEXTS = 100_000


class InMilvus:
    """A collection as the evaluator's database: the stored rows, searched by the collection's own
    search in ``mode`` (None: its default), ``fusion`` for hybrid; ``rerank`` as the task asks."""

    def __init__(self, searcher: Searcher, mode: str | None = None, fusion: Fusion | None = None, rerank: int = 1):
        self.searcher, self.rerank = searcher, rerank
        self.mode = searcher.resolve_mode(mode)
        self.fusion = None if self.mode == "codes" else fusion or Fusion()
        self.n_database = searcher.count()
        self.ids: np.ndarray | None = None  # the rows the place's texts come from, in id (source) order
        self.label_of: HitLabels | None = None
        target = searcher.target
        self.about = {"mode": self.mode, "search": f"milvus {mask_uri(target.uri)}/{target.collection}",
                      **({"fusion": str(self.fusion)} if self.mode == "hybrid" else {})}

    @classmethod
    @contextlib.contextmanager
    def open(cls, model: Model, target: MilvusTarget, nprobe: int | None = None, **options):
        """The collection at ``target`` searched with ``model``'s hasher (the one it was ingested with)."""
        with Searcher(model.about["model"], target, hasher=model.hasher, nprobe=nprobe) as searcher:
            yield cls(searcher, **options)

    def topic_queries(self, queries: CorpusSpec, k: int) -> tuple[Split, np.ndarray | None]:
        if k > self.n_database:
            raise ConfigError(f"k={k}: larger than the collection ({self.n_database} codes); use k={self.n_database} "
                              "or less", field="k")
        q = load_split(queries, "val")
        if q.labels is not None:
            self.label_of = HitLabels(None if q.label_names is None else list(q.label_names),
                                      f"queries {queries.display} against collection {self.searcher.target.collection!r}")
            return q, q.labels
        if self.mode != "codes":
            raise ConfigError(f"mode={self.mode}: without labels, eval scores the codes' neighbours; use mode=codes, "
                              "or give queries with labels (label_column=NAME)", field="mode")
        if self.rerank > 1:
            raise ConfigError(f"rerank={self.rerank}: without labels, eval scores the codes alone; drop rerank",
                              field="rerank")
        logger.warning("the queries have no labels: scoring by how many of each query's %d nearest documents by "
                       "cosine of the frozen encoder's sentence vectors the stored codes find (every stored text "
                       "encoded again)", k)
        self.ids = self.searcher.collection.ids()
        return q, None

    def windows(self, queries: CorpusSpec | None, spec: WindowSpec, cleaning: str) -> tuple[known_item.KnownItemQueries, str]:
        """Windows cut from the stored texts (rows in id order, i.e. source order; past
        KNOWN_ITEM_ALL_TEXTS rows, from a seeded sample of them)."""
        ids = self.searcher.collection.ids()
        if len(ids) > KNOWN_ITEM_ALL_TEXTS:
            rng = np.random.default_rng([spec.seed, 1])
            ids = np.sort(rng.choice(ids, size=min(len(ids), 4 * spec.n_queries), replace=False))
        self.ids = ids
        cut = known_item.cut_windows(self._texts(), spec.n_queries, spec.words, spec.seed, cleaning=cleaning)
        return cut, f"windows of the texts stored in {self.searcher.target.collection}"

    def _texts(self) -> list[str]:
        stored = self.searcher.collection.get(self.ids, ["text"])
        return [stored[int(i)]["text"] for i in self.ids]

    def index(self, method: Model, query_texts: list[str], progress: bool, cache_dir: str | Path | None) -> StoredIndex:
        return StoredIndex(self, query_texts)

    def vectors(self, method: Model, progress: bool, cache_dir: str | Path | None) -> np.ndarray:
        """The stored texts (their first 1,024 characters) encoded again."""
        return method.encoder.features(self._texts(), progress=progress, cache_dir=cache_dir).mean


class StoredIndex:
    """The evaluator's database (dhim_ray.eval_in_memory.CodeDatabase) as the collection's search:
    in codes mode precision counts every code tied at the k-th distance; a text or hybrid list is
    scored in the order returned (a fused list has no ties to average)."""

    def __init__(self, place: InMilvus, texts: list[str]):
        self.place, self.texts, self.searcher = place, texts, place.searcher

    def _search(self, codes: np.ndarray, k: int, m: int = 1, scores: np.ndarray | None = None,
                fields: tuple[str, ...] = ()) -> list[list[dict[str, Any]]]:
        hits: list[list[dict[str, Any]]] = []
        for a, b in _parts(self.texts, k if self.place.mode != "codes" else 0):  # each within a request's text work
            request = SearchRequest(self.texts[a:b], k=k, rerank=m, mode=self.place.mode, fields=fields)
            part = (codes[a:b], None if scores is None else scores[a:b])
            hits += self.searcher.run(request, encoded=part, fusion=self.place.fusion).hits
        return hits

    def _stored_codes(self, codes: np.ndarray, k: int, fields: tuple[str, ...]) -> list[list[dict[str, Any]]]:
        """Top-k by Hamming distance past a request's bounds (the tie-aware count reads up to Milvus' cap)."""
        return self.searcher.collection.search(codes, self.searcher.hasher.n_bits, k, self.searcher.index, fields)

    def precision(self, codes: np.ndarray, labels: np.ndarray, k: int) -> PrecisionResult:
        n, n_db = len(codes), self.place.n_database
        if self.place.mode != "codes":
            hits = self._search(codes, k, fields=self.place.label_of.fields)
            p = self._found(hits, labels, k)
            return PrecisionResult(k, p, p, n, n_db)
        ordered = expected = 0.0
        for i in range(n):  # the k nearest and every code tied at the k-th distance
            hits, dist = self._with_ties(codes[i : i + 1], k, i)
            rel = self.place.label_of(hits) == labels[i]
            expected += float(tie_aware_hits(dist[None, :], rel[None, :], k)[0])
            order = np.lexsort((np.array([h["row"] for h in hits]), dist))[:k]  # database order = source order
            ordered += rel[order].sum()
        return PrecisionResult(k, ordered / (n * k), expected / (n * k), n, n_db)

    def _with_ties(self, code: np.ndarray, k: int, i: int) -> tuple[list[dict[str, Any]], np.ndarray]:
        """One query's hits past the k-th distance: 2k, then four times more, up to 16384."""
        n_db, fields = self.place.n_database, (*self.place.label_of.fields, "row")
        limit = min(k * 2, MAX_SEARCH_K, n_db)
        while True:
            hits = self._stored_codes(code, limit, fields)[0]
            dist = np.array([h["distance"] for h in hits])
            if dist[-1] > dist[k - 1] or limit >= min(n_db, MAX_SEARCH_K):
                break
            limit = min(limit * 4, MAX_SEARCH_K, n_db)
        if dist[-1] == dist[k - 1] and limit < n_db:
            raise StoreError(f"query {i}: more than {MAX_SEARCH_K} codes tie at distance {dist[k - 1]}; tie-aware "
                             "precision needs them all")
        return hits, dist

    def _found(self, hits: list[list[dict[str, Any]]], labels: np.ndarray, k: int) -> float:
        """The share of k places per query holding a hit of the query's label (a short list counts its empty places)."""
        found = sum(int((self.place.label_of(row) == label).sum()) for row, label in zip(hits, labels) if row)
        return found / (len(hits) * k)

    def reranked_labels(self, codes: np.ndarray, scores: np.ndarray | None, k: int, m: int) -> np.ndarray:
        hits = self._search(codes, k, m, scores, self.place.label_of.fields)
        out = np.full((len(hits), k), -3)  # a place with no hit matches no label
        for i, row in enumerate(hits):
            if row:
                out[i, : len(row)] = self.place.label_of(row)
        return out

    def neighbour_recall(self, codes: np.ndarray, neighbours: np.ndarray) -> float:
        stored = self.searcher.collection.fetch_codes(self.place.ids, self.searcher.hasher.n_bits)
        return InMemoryCodes(stored).neighbour_recall(codes, neighbours)  # every code, exactly

    def item_ranks(self, codes: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(better, tied) per query: in codes mode from the target's stored code (its distance d) and the
        hits nearer than d and at d, exact while they fit under Milvus' 16384 cap (lower bounds past it,
        far outside any recall@k reported); else the target's place in the top 100 returned."""
        target_ids, n_db = self.place.ids[targets], self.place.n_database
        if self.place.mode != "codes":
            return known_item.list_ranks(_id_lists(self._search(codes, min(max(known_item.RECALL_KS), n_db))),
                                         target_ids, n_db)
        own = np.bitwise_count(self.searcher.collection.fetch_codes(target_ids, self.searcher.hasher.n_bits)
                               ^ codes).sum(1)
        better, tied = np.empty(len(codes), dtype=np.int64), np.empty(len(codes), dtype=np.int64)
        for start in range(0, len(codes), 64):
            hits = self._stored_codes(codes[start : start + 64], min(MAX_SEARCH_K, n_db), ())
            for j, row in enumerate(hits):
                dist, d = np.array([h["distance"] for h in row]), own[start + j]
                better[start + j], tied[start + j] = int((dist < d).sum()), max(1, int((dist == d).sum()))
        return better, tied

    def reranked_ranks(self, codes: np.ndarray, scores: np.ndarray | None, targets: np.ndarray,
                       m: int) -> tuple[np.ndarray, np.ndarray]:
        hits = self._search(codes, max(known_item.RECALL_KS), m, scores)
        return known_item.list_ranks(_id_lists(hits), self.place.ids[targets], self.place.n_database)


def _id_lists(hits: list[list[dict[str, Any]]]) -> np.ndarray:
    """Each query's hit ids as one (n, longest) array, short lists padded with -1 (no row)."""
    width = max((len(row) for row in hits), default=0)
    out = np.full((len(hits), max(width, 1)), -1, dtype=np.int64)
    for i, row in enumerate(hits):
        out[i, : len(row)] = [h["id"] for h in row]
    return out


class HitLabels:
    """A hit's label in the queries' numbering: where the queries name their labels, the
    stored name looked up in their vocabulary (a class the queries lack matches nothing), so a
    query file holding some of the classes still lines up; else the stored number. Names on
    one side and bare numbers on the other cannot be matched: a DataError."""

    def __init__(self, names: list[str] | None = None, where: str = ""):
        self.index = None if names is None else {n: i for i, n in enumerate(names)}
        self.fields = ("label", "label_name")
        self.where = where

    def __call__(self, hits: list[dict[str, Any]]) -> np.ndarray:
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


def _parts(texts: list[str], k: int) -> list[tuple[int, int]]:
    """``texts`` cut into runs whose text work at ``k`` (0: none, codes only) fits one request's."""
    out, start, work = [], 0, 0
    for i, text in enumerate(texts):
        cost = text_work([text], k)
        if i > start and work + cost > MAX_TEXT_WORK:
            out.append((start, i))
            start, work = i, 0
        work += cost
    return [*out, (start, len(texts))] if texts else out
