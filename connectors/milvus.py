"""Milvus connector for packed binary codes (pymilvus + numpy; never torch): one row per document,
its ``code`` a BINARY_VECTOR searched by HAMMING (the fields: docs/ingest-and-search.md); the
collection's description holds its format, width and model, so other codes are refused."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dhim_ray.codes import bytes_to_codes, check_codes, check_n_bits
from dhim_ray.connectors.collection_words import CollectionWords
from dhim_ray.connectors.connection import (
    DEFAULT_TIMEOUT,
    check_server_uri,
    connect,
    is_lite,
    lite_path_error,
    looks_like_url,
    release,
)
from dhim_ray.connectors.filter_words import MAX_FILTER_CHARS, shown  # noqa: F401  (the connector's names)
from dhim_ray.connectors.filters import check_filter, refused_by_milvus
from dhim_ray.connectors.lexical import TextIndex
from dhim_ray.connectors.rows import (
    CODE_FIELD,
    DOC_FIELD,
    IN_DOC,
    KEY_FIELD,
    OUTPUT_FIELDS,
    TEXT_SPARSE_FIELD,
    Columns,
    take,
)
from dhim_ray.connectors.schema import (
    FORMAT,
    FORMAT_VERSION,
    LITE_MIN_FREE_BYTES,
    LOAD_NOTICE_ROWS,
    LOAD_TIMEOUT,
    MAX_SEARCH_K,
    CollectionInfo,
    IndexSpec,
    _ahead,
    _column_problems,
    _failed,
    _fields_are_ours,
    _filter_kinds,
    _filter_refusal,
    _schema,
    check_collection_name,
    check_max_distance,
    check_search_k,
    create_loaded,
    quote,
)
from dhim_ray.connectors.source_rows import SourceRows
from dhim_ray.corpus.columns import string_bound
from dhim_ray.errors import (
    CodeFormatError,
    CollectionMismatchError,
    ConfigError,
    NoSpaceError,
    StoreError,
)

logger = logging.getLogger(__name__)

#: The fields of IN_DOC as a filter names them in DOC_FIELD, with their kinds.
_DOC_PATHS = {name: (f'{DOC_FIELD}["{name}"]', kind) for name, kind in IN_DOC.items()}


@dataclass(frozen=True)
class MilvusTarget:
    """Where codes go. Plain data: it pickles, so Ray workers can open their own client.

    Credentials are never stored here: ``token_env`` names an environment variable
    holding a token (or ``user:password``), read when the client opens.
    """

    uri: str
    collection: str
    timeout: float = DEFAULT_TIMEOUT
    token_env: str = "MILVUS_TOKEN"

    def __post_init__(self) -> None:
        check_collection_name(self.collection)
        if not self.uri:
            raise ConfigError("uri is empty: give a .db file path (milvus-lite) or http://host:19530")
        if not self.lite:
            check_server_uri(self.uri)
        elif looks_like_url(self.uri) or not self.uri.endswith(".db"):
            raise ConfigError(lite_path_error(self.uri), field="uri")

    @property
    def lite(self) -> bool:
        return is_lite(self.uri)

    def connect(self, create: bool = True):
        """Open a MilvusClient; fails within seconds, with the URI, when unreachable.
        ``create=False``: a milvus-lite file must already exist."""
        return connect(self.uri, self.timeout, self.token_env, create)

    def bind(self, client) -> CodeCollection:
        """The target's collection on an open ``client``."""
        return CodeCollection(client, self.collection, self.timeout, self.uri if self.lite else "")

    @contextlib.contextmanager
    def open(self, create: bool = True) -> Iterator[CodeCollection]:
        """The target's collection on a client of its own, closed (and a milvus-lite file
        released for other processes) when the block ends:

            >>> with MilvusTarget("codes.db", "news_64").open() as collection:
            ...     collection.count()
        """
        client = self.connect(create)
        collection = self.bind(client)
        try:
            yield collection
        finally:
            collection.close()
            client.close()
            release(self.uri)


def collections_of_model(client, model: str, n_bits: int, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Names (sorted) of the code collections ingested with ``model`` (the id stamped on
    them); without a model id, those of width ``n_bits``."""
    found = []
    for name in sorted(client.list_collections(timeout=timeout)):
        info = CodeCollection(client, name, timeout).describe()
        if info is not None and info.n_bits and (info.model == model if model else info.n_bits == n_bits):
            found.append(name)
    return found


@dataclass
class CodeCollection(CollectionWords, SourceRows):
    """One code collection bound to a client, its name and a timeout (``target.bind(client)``):
    pymilvus' calls with those filled in, and dhim-ray's checks around them.

        >>> coll = target.bind(client)
        >>> coll.ensure(64, model_id)
        >>> coll.search(codes, 64, k=10)"""

    client: Any
    name: str
    timeout: float = DEFAULT_TIMEOUT
    lite_file: str = ""  # the milvus-lite file, whose disk an upsert checks first
    _schema: dict | None = field(default=None, init=False, repr=False, compare=False)  # see _write
    _text_store: str | None = field(default=None, init=False, repr=False, compare=False)  # set by describe
    _words: TextIndex | None = field(default=None, init=False, repr=False, compare=False)
    _words_checked: bool = field(default=False, init=False, repr=False, compare=False)
    _generation: str = field(default="", init=False, repr=False, compare=False)  # this session's words
    _recorded: bool = field(default=False, init=False, repr=False, compare=False)  # ... recorded beside the file
    _in_doc: bool | None = field(default=None, init=False, repr=False, compare=False)  # set by describe
    _kinds: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)  # set by describe

    def describe(self) -> CollectionInfo | None:
        """What the collection holds, or None if there is none by that name."""
        client, name, timeout = self.client, self.name, self.timeout
        self._text_store, self._in_doc = "", False
        if not client.has_collection(name, timeout=timeout):
            return None
        desc = client.describe_collection(name, timeout=timeout)
        code = next((f for f in desc["fields"] if f["name"] == CODE_FIELD), None)
        try:
            meta = json.loads(desc.get("description") or "{}")
        except json.JSONDecodeError:
            meta = {}
        if not isinstance(meta, dict):  # a foreign description that is JSON but not an object
            meta = {}
        name = desc.get("collection_name") or name  # the collection an alias points at
        if code is None or meta.get("format") != FORMAT or not _fields_are_ours(desc["fields"]):
            return CollectionInfo(name, 0, "", "", "", meta=meta if meta.get("format") != FORMAT else {})
        metric = index_type = ""
        nlist = 0
        index_names = client.list_indexes(name, field_name=CODE_FIELD, timeout=timeout)
        if index_names:  # a collection made by dhim-ray always has one; a foreign one may not
            index = client.describe_index(name, index_names[0], timeout=timeout)
            metric, index_type = index.get("metric_type", ""), index.get("index_type", "")
            nlist = int(index.get("nlist", 0) or 0)
        fields = {f["name"] for f in desc["fields"]}
        self._kinds = _filter_kinds(desc["fields"])
        in_doc = self._in_doc = DOC_FIELD in fields
        kept = meta.get("text_index")
        self._text_store = ("milvus" if kept == "bm25" and TEXT_SPARSE_FIELD in fields else
                            "file" if kept == "tantivy" and self.lite_file else "")
        version = meta.get("version", 1)
        return CollectionInfo(name, int(code["params"].get("dim", 0)), metric, index_type, meta.get("model", ""),
                              nlist=nlist, meta=meta,
                              columns={n: (str(k), int(b)) for n, (k, b) in dict(meta.get("columns") or {}).items()},
                              text_index=bool(self._text_store), text_store=self._text_store, in_doc=in_doc,
                              version=version if isinstance(version, int) else 0)

    def check(self, n_bits: int, model: str, overwrite: bool = False,
              columns: dict[str, tuple[str | None, int]] | None = None,
              text_index: bool | None = None) -> CollectionInfo | None:
        """The existing collection (None if there is none), refused with CollectionMismatchError when
        it cannot take these codes: not made by dhim-ray or by another version's layout, another code
        width, metric or model, (``text_index`` given) a text index kept or not against this ingest's,
        or other columns (unless ``overwrite``). Creates nothing."""
        check_n_bits(n_bits)
        info = self.describe()
        if info is None or overwrite:
            return info
        problems = []
        if not info.n_bits:
            problems.append("it was not made by dhim-ray")
        elif info.version != FORMAT_VERSION:
            raise CollectionMismatchError(
                f"collection {self.name!r}: its rows have layout {info.version} and this dhim-ray reads "
                f"{FORMAT_VERSION}; " + ("ingest it again with overwrite=True (the codes are remade from the corpus)"
                                         if info.version < FORMAT_VERSION else "upgrade dhim-ray"))
        elif self.lite_file and info.meta.get("text_index") == "bm25":
            raise CollectionMismatchError(
                f"collection {self.name!r}: its words are in milvus-lite's own BM25 index, which this dhim-ray does "
                "not search in a file (it keeps them in tantivy beside it); ingest it again with overwrite=True")
        else:
            if info.n_bits != n_bits:
                problems.append(f"its codes have {info.n_bits} bits, these have {n_bits}")
            if info.metric and info.metric != "HAMMING":
                problems.append(f"its metric is {info.metric}, not HAMMING")
            if info.model and model and info.model != model:
                problems.append(f"it holds codes of model {info.model}, not {model}")
            if text_index is not None and info.text_index != text_index:
                problems.append("it keeps a text index (BM25) and this ingest has none (drop text_index=False)"
                                if info.text_index else
                                "it keeps codes only and this ingest adds a text index (add text_index=False)")
            if columns is not None:
                problems += _column_problems(info.columns, columns)
        if problems:
            raise CollectionMismatchError(
                f"collection {self.name!r}: {'; '.join(problems)}; pick another collection=NAME or pass overwrite=True"
            )
        return info

    def ensure(self, n_bits: int, model: str, index: IndexSpec = IndexSpec(), overwrite: bool = False,
               columns: dict[str, tuple[str, int]] | None = None, model_dir: str = "",
               text_index: bool = False) -> CollectionInfo:
        """Create the collection, or check an existing one matches (``check``; ``overwrite``: drop and
        recreate it). ``columns``: name -> (bool, int, float or string; longest string in bytes);
        ``model_dir``: stamped beside the model's id, for a service following an alias; ``text_index``:
        BM25 over the text (tantivy beside a milvus-lite file, Milvus' BM25 function on a server)."""
        client, name, timeout = self.client, self.name, self.timeout
        columns = columns or {}
        self._check_space()
        info = self.check(n_bits, model, overwrite, columns, text_index)
        if info is not None and not overwrite:
            self.load()
            return info
        if info is not None:
            client.drop_collection(name, timeout=timeout)
        self._schema = None  # a new collection: its fields are described again at the next write
        store = ("file" if self.lite_file else "milvus") if text_index else ""
        fields = {n: (kind, string_bound(longest) if kind == "string" else 0) for n, (kind, longest) in columns.items()}
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "n_bits": n_bits, "model": model,
                **({"columns": {n: list(v) for n, v in fields.items()}} if fields else {}),
                **({"model_dir": model_dir} if model_dir else {}), **({"text_index": {"file": "tantivy", "milvus": "bm25"}[store]} if store else {})}
        index_params = client.prepare_index_params()
        index_params.add_index(field_name=CODE_FIELD, index_type=index.index_type, metric_type="HAMMING",
                               params=index.params())
        if store == "milvus":
            index_params.add_index(field_name=TEXT_SPARSE_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        if store == "file":  # first: a collection that says it keeps its words elsewhere finds them there
            self.words.create(name)
        in_doc = bool(self.lite_file)  # a server's BM25 reads a text field of its own
        self._text_store, self._in_doc = store, in_doc
        try:
            create_loaded(client, name, _schema(n_bits, meta, fields, store == "milvus", in_doc), index_params, timeout)
        except Exception as exc:
            raise StoreError(_failed(f"collection {name!r}: Milvus refused to create it", exc)) from exc
        if store == "file":
            self.renew_words()
        return CollectionInfo(name, n_bits, "HAMMING", index.index_type, model, meta=meta, columns=fields,
                              text_index=bool(store), text_store=store, in_doc=in_doc)

    def upsert(self, rows: Columns, new: bool = False, words: Future | None = None) -> int:
        """Upsert validated rows, by column (``code_rows``); returns how many were written.
        ``new``: no row with these ids can be in the collection, so they are inserted
        (milvus-lite's upsert looks each id up, and slows as the collection grows). ``words``:
        their words' write, already under way (``insert_each``)."""
        n = len(rows["id"])
        if not n:
            return 0
        lengths = {len(code) for code in rows[CODE_FIELD]}
        if len(lengths) != 1:
            raise CodeFormatError(f"codes of {sorted(lengths)} bytes in one batch: every code must have the same "
                                  "length")
        self._check_space()  # milvus-lite on a full disk retries each write for its whole timeout, then fails
        if words is not None:  # first: a row Milvus holds always has its words
            words.result()
        elif self._words_kept():
            self.words.write(self.name, rows, new)
        try:
            result = self._write(rows, new)
        except Exception as exc:
            self._check_space()
            raise StoreError(_failed(f"collection {self.name!r}: upsert of {n} rows failed", exc)) from exc
        key = "insert_count" if new else "upsert_count"
        count = result.get(key) if isinstance(result, dict) else getattr(result, key, None)
        return n if count is None else int(count)

    def insert_each(self, batches: Iterable[Columns]) -> Iterator[int]:
        """``upsert(rows, new=True)`` of each of ``batches`` in turn, yielding how many rows each
        wrote. Where the words are kept beside the file, a thread gives each batch's words to the
        engine (which indexes them on a thread of its own) while the batch before goes to Milvus,
        which takes a batch once its words are in: the ingest's writer does the two at once."""
        if not self._words_kept():
            yield from (self.upsert(rows, new=True) for rows in batches)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="dhim-ray-words") as writer:
            ahead: tuple[Columns, Future] | None = None
            for rows in batches:
                words = writer.submit(self.words.write, self.name, rows, True)
                if ahead is not None:
                    yield self.upsert(ahead[0], new=True, words=ahead[1])
                ahead = (rows, words)
            if ahead is not None:
                yield self.upsert(ahead[0], new=True, words=ahead[1])

    def _write(self, rows: Columns, new: bool) -> Any:
        """One insert or upsert of ``rows``, by column through pymilvus' handler where present, else by row."""
        connection = getattr(self.client, "_get_connection", None)
        handler = connection() if callable(connection) else None
        send = getattr(handler, "batch_insert" if new else "upsert", None)
        call_context = getattr(self.client, "_generate_call_context", None)
        if send is None or not callable(call_context):
            return self._write_rows(rows, new)
        context, rows = call_context(), self._stored(rows)
        if self._schema is None:  # the field types, described once per bound collection
            self._schema = handler.describe_collection(self.name, timeout=self.timeout, context=context)
        types = {f["name"]: f["type"] for f in self._schema["fields"]}
        entities = [{"name": name, "type": types[name], "values": values} for name, values in rows.items()]
        return send(self.name, entities, timeout=self.timeout, context=context, schema=self._schema)

    def _stored(self, rows: Columns) -> Columns:
        """``rows`` as the collection stores them: IN_DOC's fields moved into its JSON document."""
        if not self._doc():
            return rows
        moved = [name for name in rows if name in IN_DOC]
        out = {name: values for name, values in rows.items() if name not in IN_DOC}
        out[DOC_FIELD] = [orjson.dumps(dict(zip(moved, values))).decode()  # as text: pymilvus walks a dict in Python
                          for values in zip(*(rows[name] for name in moved))]
        return out

    def _doc(self) -> dict[str, tuple[str, str]]:
        """The fields kept in the JSON document, name -> (its path in a filter, its kind); {}: none."""
        if self._in_doc is None:
            self.describe()
        return _DOC_PATHS if self._in_doc else {}

    def _filter(self, filter: str | None) -> str | None:
        """``filter`` as this collection's fields take it (check_filter with their paths and kinds)."""
        return check_filter(filter, in_doc=self._doc(), kinds=self._kinds)

    def _at(self, name: str) -> str:
        """Field ``name`` as a filter names it in this collection."""
        return self._doc().get(name, (name, ""))[0]

    def _asked(self, fields: Iterable[str]) -> list[str]:
        """The stored fields that hold ``fields``."""
        fields, doc = list(fields), self._doc()
        return [f for f in fields if f not in doc] + ([DOC_FIELD] if any(f in doc for f in fields) else [])

    def _read(self, row: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
        """A row Milvus returned with ``_asked(fields)``, as ``fields``: its document's fields lifted out."""
        doc = row.pop(DOC_FIELD, None)
        if doc is not None:
            row.update((f, doc.get(f)) for f in fields if f in IN_DOC)
        return row

    def _write_rows(self, rows: Columns, new: bool) -> Any:
        """The same write by row, through the client's public insert or upsert."""
        rows = self._stored(rows)
        by_row = [dict(zip(rows, values)) for values in zip(*rows.values())]
        return (self.client.insert if new else self.client.upsert)(self.name, by_row, timeout=self.timeout)

    def upsert_changed(self, rows: Columns) -> tuple[int, int]:
        """Write the validated ``rows`` (by column) the collection does not already hold as they
        are: ids it lacks are inserted, rows that differ are upserted, identical rows are left
        alone. A rerun of an interrupted milvus-lite ingest: reading a row by id stays fast as
        the collection grows where upserting it does not (bench million upsert). Returns
        (written, unchanged)."""
        ids = rows["id"]
        if not ids:
            return 0, 0
        stored = self.get(ids, list(rows))
        new = [i for i, key in enumerate(ids) if key not in stored]
        changed = [i for i, key in enumerate(ids) if key in stored and not _same_row(stored[key], rows, i)]
        written = self.upsert(take(rows, new), new=True) + self.upsert(take(rows, changed))
        return written, len(ids) - len(new) - len(changed)

    def _check_space(self) -> None:
        if not self.lite_file:
            return
        folder = Path(self.lite_file).resolve().parent
        free = shutil.disk_usage(folder).free
        if free < LITE_MIN_FREE_BYTES:
            raise NoSpaceError(f"no space left on the device holding {self.lite_file} ({free // 1024} KiB free, "
                               f"milvus-lite needs {LITE_MIN_FREE_BYTES // 2**20} MiB to write); free some space or "
                               "ingest into a file elsewhere (uri=PATH), then rerun the same ingest (it completes it)")

    def get(self, ids: Sequence[int], fields: Sequence[str], batch_size: int = 4096) -> dict[int, dict[str, Any]]:
        """Rows ``ids`` by primary key (pymilvus ``get``), their ``fields``; absent ids are left out."""
        ids = [int(i) for i in ids]
        found: dict[int, dict[str, Any]] = {}
        for start in range(0, len(ids), batch_size):
            try:
                rows = self.client.get(self.name, ids=ids[start : start + batch_size], output_fields=self._asked(fields),
                                       timeout=self.timeout)
            except Exception as exc:
                raise StoreError(_failed(f"collection {self.name!r}: reading {', '.join(fields)} failed", exc)) from exc
            found.update((int(r["id"]), self._read(r, fields)) for r in rows)
        return found

    def query(self, fields: Sequence[str], filter: str | None = None, limit: int = MAX_SEARCH_K) -> list[dict[str, Any]]:
        """The ``id`` and ``fields`` of the rows ``filter`` holds for (None: any rows), at most ``limit``.

            >>> collection.query(["row", "text"], filter="row < 10")"""
        expr = self._filter(filter) or ""
        return self._query(expr, ["id", *fields], "query", expr or None, limit=int(limit))

    def _query(self, expr: str, fields: Sequence[str], what: str, users: str | None = None,
               **kwargs: Any) -> list[dict[str, Any]]:
        """Rows of ``fields`` where ``expr`` holds; a refused ``users`` filter is a ConfigError, else a StoreError."""
        try:
            rows = self.client.query(self.name, filter=expr, output_fields=self._asked(fields), timeout=self.timeout,
                                     **kwargs)
        except Exception as exc:
            if users and refused_by_milvus(exc):
                raise _filter_refusal(users, exc) from None
            raise StoreError(_failed(f"collection {self.name!r}: {what} failed", exc)) from exc
        return [self._read(r, fields) for r in rows]

    def ids(self) -> np.ndarray:
        """Every row's id, sorted (for one source: in the source's row order), int64."""
        self._flush()
        return np.sort(np.asarray(self._ids_where(""), dtype=np.int64))

    def _ids_where(self, expr: str) -> list[int]:
        return [int(r["id"]) for page in self._pages(expr, ["id"], "listing ids") for r in page]

    def load(self) -> None:
        """Load the collection for searches and queries, waiting up to LOAD_TIMEOUT rather than
        one call's timeout, with a line where it holds many rows: milvus-lite loads a file's
        collection on its first use after every open and rebuilds the text index as it does
        (minutes at a million rows: BENCHMARKS.md, 'Where the embedded default ends')."""
        from pymilvus.client.types import LoadState

        if self.client.get_load_state(self.name, timeout=self.timeout).get("state") == LoadState.Loaded:
            return
        rows = int(self.client.get_collection_stats(self.name, timeout=self.timeout).get("row_count", 0))
        if rows >= LOAD_NOTICE_ROWS:
            fields = {f["name"] for f in self.client.describe_collection(self.name, timeout=self.timeout)["fields"]}
            logger.info("loading collection %s (%s rows)%s", self.name, f"{rows:,}",
                        "; milvus-lite rebuilds its text index on every open: a few minutes a million rows"
                        if self.lite_file and TEXT_SPARSE_FIELD in fields else "")
        try:
            self.client.load_collection(self.name, timeout=LOAD_TIMEOUT)
        except Exception as exc:
            raise StoreError(_failed(f"collection {self.name!r}: loading it failed", exc)) from exc

    def _flush(self) -> None:
        self.load()
        self.client.flush(self.name, timeout=self.timeout)

    def count(self) -> int:
        """Exact row count (strong consistency), after a flush where the server supports it."""
        self._flush()
        res = self.client.query(self.name, filter="", output_fields=["count(*)"], consistency_level="Strong",
                                timeout=self.timeout)
        return int(res[0]["count(*)"])

    def search(self, codes: np.ndarray, n_bits: int, k: int, index: IndexSpec | None = None,
               output_fields: Iterable[str] = OUTPUT_FIELDS, batch_size: int = 1000, filter: str | None = None,
               max_distance: int | None = None) -> list[list[dict[str, Any]]]:
        """Top-k rows by Hamming distance for each packed query code: one list per query of
        {"id", "distance" (int), and the output fields}, nearest first, ties by id (see ``_ahead``).
        ``filter``: a Milvus boolean expression over the stored fields (``label == 3``,
        ``source like "news%"``): only rows it holds for are searched; one Milvus refuses is a
        ConfigError naming it. ``max_distance`` R: only rows within R bits (Milvus' range
        search: radius R + 1, range_filter 0), at most ``k`` of them."""
        codes = check_codes(codes, n_bits)
        check_search_k(k)
        params = (index or IndexSpec()).search_params()
        if max_distance is not None:
            check_max_distance(max_distance, n_bits)
            params = {**params, "params": {**params["params"], "radius": int(max_distance) + 1, "range_filter": 0}}
        expr, output_fields = self._filter(filter), list(output_fields)
        out: list[list[dict[str, Any]]] = []
        for start in range(0, len(codes), batch_size):
            data = [c.tobytes() for c in codes[start : start + batch_size]]
            for hits in self._search(data, CODE_FIELD, params, _ahead(k), self._asked(output_fields), expr):
                rows = [{"id": h["id"], "distance": int(round(h["distance"])),
                         **self._read(h.get("entity", {}), output_fields)} for h in hits]
                rows.sort(key=lambda h: (h["distance"], h["id"]))  # the store's own tie order is unspecified
                out.append(rows[:k])
        return out

    def close(self) -> None:
        if self._words is not None:
            self._commit_words()
            self._words.close()

    def _search(self, data: list, anns_field: str, params: dict[str, Any], k: int, output_fields: Iterable[str],
                expr: str | None) -> list:
        """pymilvus' search on one field; a filter Milvus refuses is the user's ConfigError."""
        try:
            return self.client.search(self.name, data=data, anns_field=anns_field, search_params=params,
                                      limit=int(k), output_fields=list(output_fields), timeout=self.timeout,
                                      **({"filter": expr} if expr else {}))
        except Exception as exc:
            if expr and refused_by_milvus(exc):
                raise _filter_refusal(expr, exc) from None
            raise StoreError(_failed(f"collection {self.name!r}: search failed", exc)) from exc

    def point_alias(self, alias: str) -> str | None:
        """Point ``alias`` at this collection, atomically (Milvus' alter_alias): a search by the
        alias sees the old collection or this one, never neither. Returns the collection it
        pointed at before (None: a new alias). A milvus-lite file has no aliases."""
        check_collection_name(alias, "alias", "news")
        client, timeout = self.client, self.timeout
        try:
            before = client.describe_alias(alias, timeout=timeout).get("collection_name")
        except Exception:  # no such alias
            before = None
        try:
            if before is None:
                if client.has_collection(alias, timeout=timeout):
                    raise ConfigError(f"alias={alias}: a collection has that name; an alias needs a name of its own",
                                      field="alias")
                client.create_alias(self.name, alias, timeout=timeout)
            elif before != self.name:
                client.alter_alias(self.name, alias, timeout=timeout)
        except ConfigError:
            raise
        except Exception as exc:
            raise StoreError(_failed(f"alias {alias!r}: Milvus refused to point it at {self.name!r}", exc)) from exc
        return before

    def ids_of_keys(self, keys: Sequence[str]) -> dict[str, list[int]]:
        """The row ids of each document id (``key``, ingest --id-column) that the collection
        holds: one, unless the source gave two documents the same id."""
        if not keys:
            return {}
        rows = self._query(f"{self._at(KEY_FIELD)} in [{', '.join(quote(k) for k in keys)}]", ["id", KEY_FIELD],
                           "looking up keys")
        found: dict[str, list[int]] = {}
        for r in rows:
            found.setdefault(r[KEY_FIELD], []).append(int(r["id"]))
        return {key: sorted(ids) for key, ids in found.items()}

    def _field_of(self, ids: Sequence[int], field_name: str) -> list[Any]:
        """Field ``field_name`` of rows ``ids``, in order (by id: lite 2.5.1 hangs searching vector fields)."""
        found = self.get(ids, ["id", field_name])
        missing = [int(i) for i in ids if int(i) not in found]
        if missing:
            raise StoreError(f"collection {self.name!r}: rows {missing[:5]} vanished between search and read; "
                             "search again")
        return [_unwrapped(found[int(i)][field_name]) for i in ids]

    def fetch_codes(self, ids: Sequence[int], n_bits: int) -> np.ndarray:
        """The stored packed codes of rows ``ids``, in that order: uint8 (len(ids), n_bits // 8)."""
        return bytes_to_codes([bytes(c) for c in self._field_of(ids, CODE_FIELD)], n_bits)



def _unwrapped(value: Any) -> Any:
    """A vector field as ``get`` returns it: milvus-lite wraps its bytes in a list of one."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _same_row(stored: dict[str, Any], rows: Columns, i: int) -> bool:
    """Whether a stored row holds every field row ``i`` of ``rows`` would write (else it is upserted again)."""
    for name, values in rows.items():
        value, have = values[i], _unwrapped(stored.get(name))
        if have != value:
            return False
    return True

