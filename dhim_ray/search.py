"""The application API: search a Milvus code collection with texts (library + connector, no Ray;
``Searcher.open`` hashes through the model's graph, so it never loads torch).

    >>> with Searcher.open("runs/dbpedia-64", "dhim_ray.db", "dbpedia_64") as s:
    ...     hits = s.run(SearchRequest(["a football club in spain"], k=10)).hits[0]"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dhim_ray.codes import hamming
from dhim_ray.connectors.connection import connect, mask_uri, release
from dhim_ray.connectors.filters import Filter, parse_filter
from dhim_ray.connectors.lexical import MAX_TEXT_WORK, text_work
from dhim_ray.connectors.milvus import (
    MAX_SEARCH_K,
    CodeCollection,
    IndexSpec,
    MilvusTarget,
    check_max_distance,
    check_search_k,
    collections_of_model,
    shown,
)
from dhim_ray.corpus.text import empty_text, has_text, not_text
from dhim_ray.errors import CollectionMismatchError, ConfigError, DataError, StoreError
from dhim_ray.model.checkpoint import read_checkpoint
from dhim_ray.retrieval.fusion import Fusion, check_mode, fuse
from dhim_ray.retrieval.rerank import check_rerank, rerank

if TYPE_CHECKING:  # a one-shot search hashes through the model's graph: torch loads only where asked for
    from dhim_ray.graph_hasher import GraphHasher
    from dhim_ray.hasher import Hasher

logger = logging.getLogger(__name__)


def find_collection(model_dir: str | Path, uri: str, token_env: str = "MILVUS_TOKEN",
                    hasher: Hasher | GraphHasher | None = None, release_file: bool = True) -> str:
    """The one collection at ``uri`` ingested with the model at ``model_dir``: what search
    uses when it is given no collection name. None or several: a StoreError or
    ConfigError that says what is there. ``release_file=False`` leaves a milvus-lite file's
    server up for the Searcher that opens it next (one start instead of two)."""
    model = hasher or read_checkpoint(model_dir)  # its id and width
    client, found = connect(uri, token_env=token_env, create=False), []
    try:
        found = collections_of_model(client, model.model_id, model.n_bits)
    finally:
        client.close()
        if release_file or len(found) != 1:
            release(uri)
    if not found:
        raise StoreError(f"no collection at {mask_uri(uri)} was ingested with {model_dir}; run 'dhim-ray ingest "
                         f"CORPUS --model {model_dir} --uri {mask_uri(uri)}' first, or name one with collection=NAME")
    if len(found) > 1:
        raise ConfigError(f"{mask_uri(uri)} holds {len(found)} collections ingested with {model_dir} "
                          f"({', '.join(found)}); name one with collection=NAME", field="collection")
    logger.info("searching collection %s at %s (the one ingested with %s)", found[0], mask_uri(uri), model_dir)
    return found[0]


@dataclass(frozen=True)
class SearchRequest:
    """One search, as the library, the CLI and the service ask for it, checked once here: ``texts``
    or ``like`` (stored rows' ids), ``k``, ``rerank`` (1 = off), ``filter`` (parsed into a ``Filter``),
    ``max_distance`` (codes only), ``mode`` (None: the collection's default) and the ``fields`` a hit
    carries (None: all). What depends on
    the collection is checked by ``Searcher.run``. A bad field is a ConfigError naming it first."""

    texts: tuple[str, ...] = ()
    like: tuple[int | str, ...] = ()
    k: int = 10
    rerank: int = 1
    filter: str | Filter | None = None  # parsed when made: a Filter
    max_distance: int | None = None
    mode: str | None = None
    fields: tuple[str, ...] | None = None  # the stored fields each hit carries (None: all)

    def __post_init__(self):
        object.__setattr__(self, "texts", (self.texts,) if isinstance(self.texts, str) else tuple(self.texts or ()))
        object.__setattr__(self, "like", tuple(self.like or ()))
        if self.fields is not None:
            object.__setattr__(self, "fields", (self.fields,) if isinstance(self.fields, str) else tuple(self.fields))
        if bool(self.texts) == bool(self.like):
            raise ConfigError("give query texts or like=ID (a stored row's id), not both or neither", field="texts")
        for field, values in (("texts", self.texts), ("like", self.like)):
            for i, t in enumerate(values):
                if isinstance(t, str) and (why := not_text(t, f"{field}[{i}]")):
                    raise ConfigError(why, field=field)
        for i, t in enumerate(self.texts):  # empty to every cleaner: said before a model or Milvus is opened
            if isinstance(t, str) and not has_text(t):
                raise empty_text(i, t)
        check_search_k(self.k)
        if check_rerank(self.rerank) > 1 and self.k * self.rerank > MAX_SEARCH_K:
            raise ConfigError(f"rerank={self.rerank}: k x rerank = {self.k * self.rerank} Hamming candidates, at most "
                              f"{MAX_SEARCH_K}; lower k or rerank", field="rerank")
        if self.mode is not None:
            check_mode(self.mode)
        if self.max_distance is not None and (isinstance(self.max_distance, bool) or not isinstance(
                self.max_distance, (int, np.integer)) or self.max_distance < 0):
            raise ConfigError(f"max_distance={self.max_distance!r}: must be a whole number of bits, 0 or more", field="max_distance")
        if not isinstance(self.filter, Filter):  # parsed once, here; Searcher.run checks its fields
            object.__setattr__(self, "filter", parse_filter(self.filter))
        if self.like and self.rerank > 1:
            raise ConfigError(f"rerank={self.rerank} with like: a stored row has no query scores to re-rank by; "
                              "drop one", field="rerank")
        if self.like and self.mode not in (None, "codes"):
            raise ConfigError(f"mode={self.mode} with like: more-like-this searches a stored row's code; drop mode", field="mode")


@dataclass(frozen=True)
class SearchResult:
    """A request's answer: one list of hits per query (``queries``: the texts, or "like ID"),
    and the mode that ran."""

    queries: list[str]
    hits: list[list[dict[str, Any]]]
    mode: str


class Searcher:
    """Text search over a Milvus code collection with the model it was ingested with; on open it
    checks the collection exists, holds codes of the model's width and names this model.

        >>> s = Searcher("runs/bbc-64", MilvusTarget("dhim_ray.db", "bbc_64"))
        >>> s.run(SearchRequest(["oil prices rise"], k=5)).hits[0][0]   # {"id", "distance", "label", ...}"""

    def __init__(self, model_dir: str | Path, target: MilvusTarget, index: IndexSpec | None = None,
                 hasher: Hasher | GraphHasher | None = None, nprobe: int | None = None):
        if nprobe is not None and (isinstance(nprobe, bool) or nprobe < 1):
            raise ConfigError(f"nprobe={nprobe}: must be >= 1 (clusters to probe; nlist is exact)", field="nprobe")
        if hasher is None:
            from dhim_ray.hasher import Hasher

            hasher = Hasher.load(model_dir)
        self.hasher = hasher
        self.target = target
        self.index = index or IndexSpec()
        self.client = target.connect(create=False)
        self.collection = target.bind(self.client)
        info = self.collection.describe()
        if info is None:  # a typo: name the collections this model's codes are in, where there are some
            mine = collections_of_model(self.client, self.hasher.model_id, self.hasher.n_bits)
            self.close()
            raise StoreError(f"collection {target.collection!r} does not exist at {mask_uri(target.uri)}; " + (
                f"the model's codes are in {', '.join(mine)}" if mine else
                "run 'dhim-ray ingest' first or check the collection name"))
        try:  # not made by dhim-ray, another width, metric or model: refused as ingest refuses it
            self.collection.check(self.hasher.n_bits, self.hasher.model_id)
        except CollectionMismatchError as exc:
            self.close()
            raise CollectionMismatchError(f"{str(exc).split('; pick another')[0]}; search with the model it was "
                                          f"ingested with ({model_dir} is {self.hasher.model_id}), or re-ingest") from None
        self.info = info
        if info.name != target.collection:  # an alias: search the collection it points at now
            self.collection = CodeCollection(self.client, info.name, target.timeout)
        self.collection.load()  # a milvus-lite file loads its collection on first use: minutes at a million rows
        if index is None:
            self.index = info.search_index(nprobe)
        self._incomplete: tuple[float, str | None] = (-1e9, None)
        if (incomplete := self.incomplete()) is not None:
            logger.warning("%s", incomplete)

    def incomplete(self) -> str | None:
        """One line saying the collection is incomplete (an ingest began and has not verified
        it), else None; read from the ledger at most every 2 s."""
        from dhim_ray.connectors import ledger

        read_at, line = self._incomplete
        if time.monotonic() - read_at > 2:
            line = ledger.unfinished(self.client, self.collection.name, self.target.timeout)
            self._incomplete = (time.monotonic(), line)
        return line

    @classmethod
    def open(cls, model_dir: str | Path, uri: str, collection: str | None = None, token_env: str = "MILVUS_TOKEN",
             nprobe: int | None = None) -> Searcher:
        """``Searcher.open("runs/bbc-64", "dhim_ray.db", "bbc_64")``; a server: uri="http://host:19530".
        Without ``collection``: the one collection at ``uri`` ingested with the model."""
        from dhim_ray.graph_hasher import load_query_hasher

        hasher = load_query_hasher(model_dir)
        if collection is None:
            collection = find_collection(model_dir, uri, token_env, hasher, release_file=False)
        return cls(model_dir, MilvusTarget(uri, collection, token_env=token_env), hasher=hasher, nprobe=nprobe)

    def pointed_at(self) -> str:
        """The collection the target's name points at now: itself, or where its alias moved."""
        info = self.target.bind(self.client).describe()
        return self.info.name if info is None else info.name

    @property
    def filter_fields(self) -> list[str]:
        """The fields a filter may name: every stored field but the code."""
        return ["id", *self.info.output_fields]

    @property
    def has_text_index(self) -> bool:
        """Whether the collection keeps BM25 over its text (text and hybrid search)."""
        return self.info.text_index

    def resolve_mode(self, mode: str | None, max_distance: int | None = None) -> str:
        """The search mode to run: ``mode`` as given (checked against the collection), or by
        default hybrid where the collection has a text index and codes elsewhere. A radius
        (``max_distance``) is a Hamming radius: codes only."""
        if mode is None:
            if self.has_text_index and max_distance is not None:
                logger.info("max_distance=%d: searching the codes only (a radius is in bits)", max_distance)
            return "hybrid" if self.has_text_index and max_distance is None else "codes"
        check_mode(mode)
        if mode != "codes" and not self.has_text_index:
            raise ConfigError(f"mode={mode}: collection {self.info.name!r} has no text index; search mode=codes, or "
                              "re-ingest it into a collection with one (the default where Milvus has BM25)", field="mode")
        if mode != "codes" and max_distance is not None:
            raise ConfigError(f"max_distance={max_distance}: a radius in bits applies to the codes only; search "
                              "mode=codes or drop max_distance", field="max_distance")
        return mode

    def run(self, request: SearchRequest, encoded: tuple | None = None, fusion: Fusion | None = None) -> SearchResult:
        """``request`` against this collection: the one search of the library, the CLI and the HTTP
        service (``fusion``: how hybrid fuses the two lists). ``encoded``: the texts' (codes, scores),
        already made (the service hashes concurrent requests together); else they are hashed here."""
        if request.filter is not None:
            request.filter.check_fields(self.filter_fields)
        if request.max_distance is not None:
            check_max_distance(request.max_distance, self.hasher.n_bits)
        if request.fields is not None and (unknown := sorted(set(request.fields) - set(self.info.output_fields))):
            raise ConfigError(f"fields: the collection has no field {unknown[0]!r}; it has "
                              f"{', '.join(self.info.output_fields)}", field="fields")
        if request.like:
            hits = self._like(request, **self._like_targets(list(request.like)))
            return SearchResult([f"like {x}" for x in request.like], hits, "codes")
        texts, mode = list(request.texts), self.resolve_mode(request.mode, request.max_distance)
        if mode != "codes" and (work := text_work(texts, request.k)) > MAX_TEXT_WORK:
            raise ConfigError(f"texts: {len(texts)} texts' distinct words x k={request.k} is {work:,} units of text "
                              f"work, at most {MAX_TEXT_WORK:,} a request; send fewer texts or words, a smaller k, or "
                              "mode codes", field="texts")
        if encoded is not None:
            codes, scores = encoded
        elif request.rerank == 1 or mode == "text":
            codes, scores = self.hasher.encode(texts), None
        else:
            codes, scores = self.hasher.encode(texts, scores=True)[:2]
        return SearchResult(texts, self._encoded(texts, codes, scores, request, mode, fusion or Fusion()), mode)

    def _encoded(self, texts: list[str], codes: np.ndarray, scores: np.ndarray | None, request: SearchRequest,
                 mode: str, fusion: Fusion) -> list[list[dict[str, Any]]]:
        """The request's hits for texts already hashed (``scores`` where it re-ranks)."""
        k, fields = request.k, self.info.output_fields if request.fields is None else list(request.fields)
        if mode != "text":
            depth = k if mode == "codes" else fusion.code_hits_needed(k)
            code_hits = (self._codes(codes, depth, fields, request) if request.rerank == 1 else
                         self._reranked(codes, scores, fields, request))
            if mode == "codes":
                return code_hits
        depth = k if mode == "text" else fusion.text_hits_needed(k)
        read_text = mode == "hybrid" and fusion.method == "phrase" and "text" not in fields  # the gate reads it
        text_hits = self.collection.search_text(texts, depth, [*fields, *(["text"] if read_text else [])],
                                                filter=request.filter, codes=codes)
        out = text_hits if mode == "text" else [fuse(c, t, k, fusion, q) for c, t, q in zip(code_hits, text_hits, texts)]
        if read_text:
            out = [[{f: v for f, v in h.items() if f != "text"} for h in row] for row in out]
        return self._with_distances(codes, out)

    def _with_distances(self, codes: np.ndarray, hits: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """Every hit with its Hamming distance to its query's code (a text hit has none of its own)."""
        missing = sorted({h["id"] for row in hits for h in row if "distance" not in h})
        if missing:
            stored = dict(zip(missing, self.collection.fetch_codes(missing, self.hasher.n_bits)))
            for i, row in enumerate(hits):
                for h in row:
                    if "distance" not in h:
                        h["distance"] = hamming(stored[h["id"]], codes[i])
        return hits

    def _like(self, request: SearchRequest, ids: list[int] | None = None,
              keys: list[str] | None = None) -> list[list[dict[str, Any]]]:
        """More like rows ``ids`` (or documents ``keys``): their stored codes searched, each row not its own hit."""
        if keys is not None:
            bad = next((key for key in keys if not key.strip() or any(ord(c) < 32 for c in key)), None)
            if bad is not None:
                why = "is empty" if not bad.strip() else "holds a line break or another control character"
                raise ConfigError(f"like: the id {shown(bad, 40)} {why}, which no Milvus filter matches; give a hit's "
                                  "row id (its 'id') or a document's own id", field="like")
            found = self.collection.ids_of_keys(keys)
            missing = [key for key in keys if key not in found]
            if missing:
                raise DataError(f"like: collection {self.target.collection!r} holds no document with id "
                                f"{', '.join(shown(m, 40) for m in missing[:5])}; give @RANK (a hit of the last search, e.g. "
                                "@1), a hit's id (--json shows it) or a document's own id (ingest --id-column)",
                                field="like")
            shared = next((key for key in keys if len(found[key]) > 1), None)
            if shared is not None:
                raise DataError(f"like: {len(found[shared])} documents in collection {self.target.collection!r} have "
                                f"the id {shown(shared, 40)} (row ids {', '.join(map(str, found[shared][:5]))}); give "
                                "one of those row ids", field="like")
            ids = [found[key][0] for key in keys]
        codes = self.collection.fetch_codes(ids, self.hasher.n_bits)  # held: _like_targets or ids_of_keys read them
        fields = self.info.output_fields if request.fields is None else list(request.fields)
        hits = self._codes(codes, min(request.k + 1, MAX_SEARCH_K), fields, request)
        return [[h for h in row if h["id"] != own][: request.k] for row, own in zip(hits, ids)]

    def _like_targets(self, values: list[int | str]) -> dict[str, list]:
        """Values as a user gives them: row ids where they are numbers the collection holds, else keys."""
        ids = [v if isinstance(v, int) else int(v) if re.fullmatch(r"-?[0-9]{1,19}", str(v)) else None
               for v in values]
        if all(i is not None and -(2**63) < i < 2**63 for i in ids) and \
                len(self.collection.get(ids, ["id"])) == len(set(ids)):
            return {"ids": ids}
        return {"keys": [str(v) for v in values]}

    def _reranked(self, codes: np.ndarray, scores: np.ndarray, fields: list[str],
                  request: SearchRequest) -> list[list[dict[str, Any]]]:
        """k x rerank Hamming candidates per query, the k best by agreement with its ``scores`` kept."""
        out = []
        for i, hits in enumerate(self._codes(codes, request.k * request.rerank, fields, request)):
            if not hits:
                out.append([])
                continue
            cand = self.collection.fetch_codes([h["id"] for h in hits], self.hasher.n_bits)
            order, score = rerank(scores[i : i + 1], cand[None], request.k)
            out.append([{**hits[j], "rerank_score": round(float(a), 4)} for j, a in zip(order[0], score[0])])
        return out

    def _codes(self, codes: np.ndarray, k: int, fields: list[str], request: SearchRequest):
        """Top-k rows by Hamming distance per packed code, under the request's filter and radius."""
        return self.collection.search(codes, self.hasher.n_bits, k, self.index, fields, filter=request.filter,
                                      max_distance=request.max_distance)

    def count(self) -> int:
        return self.collection.count()

    def close(self) -> None:
        self.collection.close()
        self.client.close()
        release(self.target.uri)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
