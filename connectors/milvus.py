"""Milvus connector for packed binary codes (pymilvus + numpy; never torch): one row per document,
its ``code`` a BINARY_VECTOR searched by HAMMING (the fields: docs/ingest-and-search.md); the
collection's description holds its format, width and model, so other codes are refused."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dhim_ray.codes import bytes_to_codes, check_codes, check_n_bits, hamming
from dhim_ray.connectors.connection import (
    DEFAULT_TIMEOUT,
    check_server_uri,
    connect,
    is_lite,
    lite_path_error,
    looks_like_url,
    release,
)
from dhim_ray.connectors.filters import MAX_FILTER_CHARS, check_filter, refused_by_milvus, shown  # noqa: F401
from dhim_ray.connectors.lexical import TextIndex
from dhim_ray.connectors.rows import (
    CODE_FIELD,
    DIGEST_FIELD,
    DOC_FIELD,
    IN_DOC,
    KEY_FIELD,
    KEY_MAX,
    LABEL_NAME_FIELD,
    LABEL_NAME_MAX,
    OUTPUT_FIELDS,
    SOURCE_MAX,
    TEXT_FUNCTION,
    TEXT_PREVIEW,
    TEXT_SPARSE_FIELD,
    Columns,
    id_range,
    take,
)
from dhim_ray.corpus.columns import MILVUS_NAME, string_bound, wider
from dhim_ray.errors import (
    CodeFormatError,
    CollectionMismatchError,
    ConfigError,
    NoSpaceError,
    StoreError,
    check_range,
    first_line,
)

logger = logging.getLogger(__name__)

FORMAT = "dhim-ray/codes"
MAX_SEARCH_K = 16384  # Milvus' limit on top-k
#: How long loading a collection may take (``CodeCollection.load``), and the rows from which it says so.
LOAD_TIMEOUT, LOAD_NOTICE_ROWS = 3 * 3600.0, 200_000
#: Free space below which a write to a milvus-lite file is refused at once (its server retries a
#: write on a full disk until the call's timeout, then fails without saying why).
LITE_MIN_FREE_BYTES = 16 * 2**20
INDEX_TYPES = ("BIN_FLAT", "BIN_IVF_FLAT")
#: The fields of IN_DOC as a filter names them in DOC_FIELD, with their kinds.
_DOC_PATHS = {name: (f'{DOC_FIELD}["{name}"]', kind) for name, kind in IN_DOC.items()}


@dataclass(frozen=True)
class IndexSpec:
    """How the code field is indexed. BIN_FLAT is exact; BIN_IVF_FLAT (server only)
    probes ``nprobe`` of ``nlist`` clusters."""

    index_type: str = "BIN_FLAT"
    nlist: int = 128
    nprobe: int = 16

    def __post_init__(self) -> None:
        if self.index_type not in INDEX_TYPES:
            raise ConfigError(f"index={self.index_type!r}: choose one of {', '.join(INDEX_TYPES)}", field="index")
        check_range("nlist", self.nlist, 1, 65536, example=128)
        if not 1 <= self.nprobe <= self.nlist:
            raise ConfigError(f"nprobe={self.nprobe}: must be between 1 and nlist ({self.nlist})", field="nprobe")

    def params(self) -> dict[str, Any]:
        return {"nlist": self.nlist} if self.index_type == "BIN_IVF_FLAT" else {}

    def search_params(self) -> dict[str, Any]:
        params = {"nprobe": self.nprobe} if self.index_type == "BIN_IVF_FLAT" else {}
        return {"metric_type": "HAMMING", "params": params}


def default_index(uri: str, nlist: int = 128) -> IndexSpec:
    """BIN_FLAT on milvus-lite (the only type it takes); BIN_IVF_FLAT on a server."""
    return IndexSpec("BIN_FLAT") if is_lite(uri) else IndexSpec("BIN_IVF_FLAT", nlist=nlist, nprobe=min(16, nlist))


def check_index_for(uri: str, index: IndexSpec) -> IndexSpec:
    """milvus-lite builds BIN_FLAT only (it would silently turn BIN_IVF_FLAT into it): refuse."""
    if is_lite(uri) and index.index_type != "BIN_FLAT":
        raise ConfigError(
            f"index={index.index_type}: milvus-lite files take BIN_FLAT only; leave index out, "
            "or ingest into a Milvus server (uri=http://host:19530)", field="index"
        )
    return index


def create_loaded(client: Any, name: str, schema: Any, index_params: Any, timeout: float | None) -> None:
    """Create an empty collection with its indexes, then load it. (pymilvus' create_collection
    with index_params polls each index's state after a fixed 0.5 s sleep: 1.5 s of every new
    ingest's start. An empty collection's indexes have nothing to build: created, not waited on.)"""
    client.create_collection(name, schema=schema, timeout=timeout)
    client.create_index(name, index_params, timeout=timeout, sync=False)
    client.load_collection(name, timeout=timeout)


def quote(value: str) -> str:
    """A Milvus filter string literal: ``quote('a"b')`` -> ``"a\\"b"`` (backslash and quote escaped)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


#: The ledger's collections (connectors/ledger.py): no user collection or alias may take their names.
RESERVED_NAME, WORDS_LEDGER = "dhim_ray_ingests", "dhim_ray_words"


def check_collection_name(name: str, what: str = "collection", example: str = "dbpedia_64") -> str:
    """A name Milvus takes (for a collection or an alias: ``what``), checked before any
    connection (Milvus' own refusal is a traceback)."""
    if not isinstance(name, str) or not MILVUS_NAME.fullmatch(name):
        shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + f"... ({len(name)} characters)"
        raise ConfigError(f"{what}={shown!r}: use ASCII letters, digits and underscores, starting with a letter "
                          f"or underscore, at most 255 characters, e.g. {example}")
    if name in (RESERVED_NAME, WORDS_LEDGER):
        raise ConfigError(f"{what}={name!r}: the name is reserved for dhim-ray's record of its ingests; pick "
                          f"another, e.g. {example}")
    return name


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


# ---- collections ----------------------------------------------------------------------
@dataclass
class CollectionInfo:
    name: str
    n_bits: int
    metric: str
    index_type: str
    model: str
    count: int = 0
    nlist: int = 0  # BIN_IVF_FLAT clusters, 0 for other index types
    meta: dict[str, Any] = field(default_factory=dict)
    label_names: bool = False  # rows carry their label's name (the label_name field)
    keys: bool = False  # rows carry their document's own id (the key field)
    columns: dict[str, tuple[str, int]] = field(default_factory=dict)  # kept metadata: name -> (kind, string bound)
    text_index: bool = False  # BM25 over the stored text: text and hybrid search
    text_store: str = ""  # where that index is: "milvus" (its text_sparse field) or "file" (lexical.TextIndex)
    digests: bool = False  # rows carry a digest of what they were made from (the digest field)
    in_doc: bool = False  # text, source, label_name, key and digest are kept in one JSON field (DOC_FIELD)

    @property
    def output_fields(self) -> list[str]:
        """The fields a search returns beside id and distance."""
        return (OUTPUT_FIELDS + ([LABEL_NAME_FIELD] if self.label_names else []) + ([KEY_FIELD] if self.keys else [])
                + list(self.columns))

    def search_index(self, nprobe: int | None = None) -> IndexSpec:
        """How to search this collection: exact BIN_FLAT, or IVF probing ``nprobe`` clusters."""
        if self.index_type != "BIN_IVF_FLAT":
            return IndexSpec("BIN_FLAT")
        nlist = self.nlist or IndexSpec().nlist
        return IndexSpec("BIN_IVF_FLAT", nlist=nlist, nprobe=min(nprobe or IndexSpec().nprobe, nlist))


def _schema(n_bits: int, meta: dict[str, Any], columns: dict[str, tuple[str, int]] | None = None,
            text_index: bool = False, in_doc: bool = False):
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False, description=json.dumps(meta))
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field(CODE_FIELD, DataType.BINARY_VECTOR, dim=n_bits)
    schema.add_field("label", DataType.INT64)
    if in_doc:
        schema.add_field("row", DataType.INT64)
        schema.add_field(DOC_FIELD, DataType.JSON)
    else:
        _document_fields(schema, text_index)
    kinds = {"bool": DataType.BOOL, "int": DataType.INT64, "float": DataType.DOUBLE, "string": DataType.VARCHAR}
    for name, (kind, bound) in (columns or {}).items():
        schema.add_field(name, kinds[kind], **({"max_length": bound} if kind == "string" else {}))
    if text_index:
        from pymilvus import Function, FunctionType

        schema.add_field(TEXT_SPARSE_FIELD, DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(Function(name=TEXT_FUNCTION, function_type=FunctionType.BM25, input_field_names=["text"],
                                     output_field_names=[TEXT_SPARSE_FIELD]))
    return schema


def _document_fields(schema, text_index: bool) -> None:
    """The fields a server's collection keeps each on its own (a milvus-lite one, in DOC_FIELD)."""
    from pymilvus import DataType

    schema.add_field(LABEL_NAME_FIELD, DataType.VARCHAR, max_length=LABEL_NAME_MAX * 4)
    schema.add_field("text", DataType.VARCHAR, max_length=TEXT_PREVIEW * 4, **({"enable_analyzer": True}
                                                                                if text_index else {}))
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX)
    schema.add_field("row", DataType.INT64)
    schema.add_field(KEY_FIELD, DataType.VARCHAR, max_length=KEY_MAX * 4)
    schema.add_field(DIGEST_FIELD, DataType.INT64)


def _filter_kinds(fields: list[dict]) -> dict[str, str]:
    """Field name -> the kind a filter compares it as (int, float, string, bool), from a collection's description."""
    from pymilvus import DataType

    kinds = {**{t: "int" for t in (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64)},
             DataType.FLOAT: "float", DataType.DOUBLE: "float", DataType.VARCHAR: "string", DataType.BOOL: "bool"}
    return {f["name"]: kinds[f["type"]] for f in fields if f.get("type") in kinds}


def describe_columns(columns: dict[str, tuple[str, int]]) -> str:
    return ", ".join(f"{name} ({kind})" for name, (kind, _) in columns.items()) or "none"


def collections_of_model(client, model: str, n_bits: int, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Names (sorted) of the code collections ingested with ``model`` (the id stamped on
    them); without a model id, those of width ``n_bits``."""
    found = []
    for name in sorted(client.list_collections(timeout=timeout)):
        info = CodeCollection(client, name, timeout).describe()
        if info is not None and info.n_bits and (info.model == model if model else info.n_bits == n_bits):
            found.append(name)
    return found


def check_alias_support(uri: str, alias: str | None) -> None:
    """Aliases need a Milvus server: milvus-lite 2.5.1 answers their calls UNIMPLEMENTED."""
    if alias is None:
        return
    check_collection_name(alias, "alias", "news")
    if is_lite(uri):
        raise ConfigError(f"alias={alias}: a milvus-lite file has no aliases; ingest into a Milvus server "
                          "(uri=http://host:19530), or search the new collection by its name", field="alias")


#: The first Milvus server release with the BM25 function and sparse vectors.
TEXT_INDEX_SINCE = (2, 5)


def text_index_support(client, uri: str, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """None where the Milvus at ``uri`` can keep a text index (milvus-lite 2.5 does; a server from
    2.5 on), else why not, in words for a one-line message."""
    if is_lite(uri):
        return None
    try:
        version = str(client.get_server_version(timeout=timeout))
    except Exception as exc:
        return f"its version could not be read ({first_line(exc)})"
    found = re.match(r"v?(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) < TEXT_INDEX_SINCE:
        return f"Milvus {version} has no BM25 function (it came in 2.5)"
    return None


def check_max_distance(max_distance: int, n_bits: int) -> int:
    if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)) \
            or not 0 <= max_distance <= n_bits:
        raise ConfigError(f"max_distance={max_distance!r}: must be a whole number of bits between 0 and {n_bits}", field="max_distance")
    return int(max_distance)


def _filter_refusal(expr: str, exc: Exception) -> ConfigError:
    """Milvus' refusal of a filter, in one line without its internals (operator names, source paths)."""
    message = first_line(exc)
    missing = re.search(r"field (\S+) not exist", message)
    why = (f"the collection has no field {missing.group(1)}" if missing else
           "Milvus cannot parse it" if getattr(exc, "code", None) == 1100 or "invalid expr" in message.lower() else
           "Milvus cannot evaluate it (every comparison needs a field, of the value's type)")
    return ConfigError(f"filter={shown(expr)}: {why}; write a boolean expression over the collection's fields, "
                       "e.g. 'label == 3'", field="filter")


def _failed(what: str, exc: Exception) -> str:
    return f"{what} ({first_line(exc)})"


def _column_problems(have: dict[str, tuple[str, int]], want: dict[str, tuple[str | None, int]]) -> list[str]:
    """Why columns ``have`` cannot take ``want``: other names, kinds or longer strings."""
    known = all(k is not None for k, _ in want.values())
    if set(have) != set(want) or (known and any(wider(k, have[n][0]) != have[n][0] for n, (k, _) in want.items())):
        shown = (describe_columns(have), describe_columns(want)) if known else (
            ", ".join(have) or "none", ", ".join(want) or "none")
        return [f"it keeps columns {shown[0]}, this ingest {shown[1]} (keep_columns=NAMES)"]
    return [f"column {n!r} has values of {longest:,} bytes and its field takes {have[n][1]:,}"
            for n, (_, longest) in want.items() if have[n][0] == "string" and longest > have[n][1]]


def _fields_are_ours(fields: list[dict]) -> bool:
    """Whether the fields dhim-ray reads have the types it writes (not a foreign lookalike)."""
    from pymilvus import DataType

    expected = {"id": DataType.INT64, CODE_FIELD: DataType.BINARY_VECTOR, "label": DataType.INT64,
                "text": DataType.VARCHAR, "source": DataType.VARCHAR, "row": DataType.INT64,
                LABEL_NAME_FIELD: DataType.VARCHAR, KEY_FIELD: DataType.VARCHAR, DIGEST_FIELD: DataType.INT64,
                TEXT_SPARSE_FIELD: DataType.SPARSE_FLOAT_VECTOR, DOC_FIELD: DataType.JSON}
    types = {f["name"]: f.get("type") for f in fields}
    held = (DOC_FIELD,) if DOC_FIELD in types else ("text", "source")
    return all(types.get(name, kind) == kind for name, kind in expected.items()) and all(
        name in types for name in ("id", CODE_FIELD, "label", "row", *held))


@dataclass
class CodeCollection:
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
                            "file" if kept in ("tantivy", "fts5") and self.lite_file else "")  # fts5: rebuilt
        return CollectionInfo(name, int(code["params"].get("dim", 0)), metric, index_type, meta.get("model", ""),
                              nlist=nlist, meta=meta, label_names=in_doc or LABEL_NAME_FIELD in fields,
                              keys=in_doc or KEY_FIELD in fields,
                              columns={n: (str(k), int(b)) for n, (k, b) in dict(meta.get("columns") or {}).items()},
                              text_index=bool(self._text_store), text_store=self._text_store,
                              digests=in_doc or DIGEST_FIELD in fields, in_doc=in_doc)

    def check(self, n_bits: int, model: str, overwrite: bool = False, keys: bool = False,
              columns: dict[str, tuple[str | None, int]] | None = None,
              text_index: bool | None = None, writing: bool = False) -> CollectionInfo | None:
        """The existing collection (None if there is none), refused with
        CollectionMismatchError when it cannot take these codes: another code width,
        metric or model, not made by dhim-ray, (``writing``) float vectors or sign codes kept
        beside the codes (an earlier version's --store-vectors / --store-signs), (``text_index``
        given) a text index kept or not against this ingest's, or (``keys``) made before rows
        kept their own ids (unless ``overwrite``). Creates nothing."""
        check_n_bits(n_bits)
        info = self.describe()
        if info is None or overwrite:
            return info
        problems = []
        if not info.n_bits:
            problems.append("it was not made by dhim-ray")
        else:
            if info.n_bits != n_bits:
                problems.append(f"its codes have {info.n_bits} bits, these have {n_bits}")
            if info.metric and info.metric != "HAMMING":
                problems.append(f"its metric is {info.metric}, not HAMMING")
            if info.model and model and info.model != model:
                problems.append(f"it holds codes of model {info.model}, not {model}")
            if writing and (info.meta.get("vector_dim") or info.meta.get("sign_bits")):
                problems.append("it keeps float vectors or sign codes beside its codes, which this version no longer "
                                "writes (searching it still works)")
            if text_index is not None and info.text_index != text_index:
                problems.append("it keeps a text index (BM25) and this ingest has none (drop text_index=False)"
                                if info.text_index else
                                "it keeps codes only and this ingest adds a text index (add text_index=False)")
            if keys and not info.keys:
                problems.append("it was made before rows kept their own ids (drop id_column=NAME)")
            if columns is not None:
                problems += _column_problems(info.columns, columns)
        if problems:
            raise CollectionMismatchError(
                f"collection {self.name!r}: {'; '.join(problems)}; pick another collection=NAME or pass overwrite=True"
            )
        return info

    def ensure(self, n_bits: int, model: str, index: IndexSpec = IndexSpec(), overwrite: bool = False,
               keys: bool = False, columns: dict[str, tuple[str, int]] | None = None, model_dir: str = "",
               text_index: bool = False, text_store: str | None = None) -> CollectionInfo:
        """Create the collection, or check an existing one matches (``check``; ``overwrite``: drop and
        recreate it). ``columns``: name -> (bool, int, float or string; longest string in bytes);
        ``model_dir``: stamped beside the model's id, for a service following an alias; ``text_index``:
        BM25 over the text, kept by ``text_store``: "file" (tantivy beside a milvus-lite file) or "milvus"."""
        client, name, timeout = self.client, self.name, self.timeout
        columns = columns or {}
        self._check_space()
        info = self.check(n_bits, model, overwrite, keys, columns, text_index, writing=True)
        if info is not None and not overwrite:
            self.load()
            return info
        if info is not None:
            client.drop_collection(name, timeout=timeout)
        self._schema = None  # a new collection: its fields are described again at the next write
        store = (text_store or ("file" if self.lite_file else "milvus")) if text_index else ""
        if store not in ("", "file", "milvus") or (store == "file" and not self.lite_file):
            raise ConfigError(f"text_store={store!r}: write file (beside a milvus-lite file) or milvus", field="text_store")
        fields = {n: (kind, string_bound(longest) if kind == "string" else 0) for n, (kind, longest) in columns.items()}
        meta = {"format": FORMAT, "n_bits": n_bits, "model": model,
                **({"columns": {n: list(v) for n, v in fields.items()}} if fields else {}),
                **({"model_dir": model_dir} if model_dir else {}), **({"text_index": {"file": "tantivy", "milvus": "bm25"}[store]} if store else {})}
        index_params = client.prepare_index_params()
        index_params.add_index(field_name=CODE_FIELD, index_type=index.index_type, metric_type="HAMMING",
                               params=index.params())
        if store == "milvus":
            index_params.add_index(field_name=TEXT_SPARSE_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        if store == "file":  # first: a collection that says it keeps its words elsewhere finds them there
            self.words.create(name)
        in_doc = bool(self.lite_file) and store != "milvus"  # Milvus' BM25 reads a text field of its own
        self._text_store, self._in_doc = store, in_doc
        try:
            create_loaded(client, name, _schema(n_bits, meta, fields, store == "milvus", in_doc), index_params, timeout)
        except Exception as exc:
            raise StoreError(_failed(f"collection {name!r}: Milvus refused to create it", exc)) from exc
        if store == "file":
            self.renew_words()
        return CollectionInfo(name, n_bits, "HAMMING", index.index_type, model, meta=meta, label_names=True,
                              keys=True, columns=fields, text_index=bool(store), text_store=store, digests=True,
                              in_doc=in_doc)

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

    def refuse_foreign_rows(self, ids: Sequence[int], source: str) -> None:
        """Raise CollectionMismatchError if any of ``ids`` already holds a row of another
        source: an upsert would overwrite it."""
        if len(ids) == 0:
            return
        foreign = sorted({r["source"] for r in self.get(ids, ["source"]).values() if r["source"] != source})
        if foreign:
            raise CollectionMismatchError(
                f"collection {self.name!r}: the ids of {source} already hold rows of {foreign[0]}; refusing to "
                "overwrite them: ingest into another collection"
            )

    def refuse_dropping_keys(self, info: CollectionInfo, source: str) -> None:
        """An ingest without an id column upserts every row with an empty key: where this
        source's rows already hold their documents' own ids (an earlier ingest with one),
        that would erase them, so it is refused, naming the way to keep them."""
        if not info.keys:
            return
        rows = self.client.query(self.name, filter=f"{self._at('source')} == {quote(source)} and {self._at(KEY_FIELD)} "
                                 '!= ""', output_fields=["id"], limit=1, timeout=self.timeout)
        if rows:
            raise CollectionMismatchError(
                f"collection {self.name!r}: the rows of {source} hold their documents' own ids (an ingest with an "
                "id column); ingesting without one would erase them: pass the same id column again"
            )

    def delete_stale_rows(self, source: str, last_row: int, dropped_ids: Sequence[int] = ()) -> tuple[int, int]:
        """After a whole source was ingested: delete its rows that the source no longer has
        (row numbers past ``last_row``, left by an earlier ingest of a longer version) and
        the rows this ingest left out (``dropped_ids``: empty texts skipped, which an
        earlier version may have filled). Returns how many rows went and how many of the
        source's are left; other sources' rows are never touched."""
        before = self.count_source(source)
        stale = f"{self._at('source')} == {quote(source)} and row > {int(last_row)}"
        try:
            ours = [i for i, r in self.get(dropped_ids, ["source"]).items() if r["source"] == source]
            if self._words_kept():
                self.words.delete(self.name, [*self._ids_where(stale), *ours])
            self.client.delete(self.name, filter=stale, timeout=self.timeout)
            for start in range(0, len(ours), 1000):
                self.client.delete(self.name, ids=ours[start : start + 1000], timeout=self.timeout)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(_failed(f"collection {self.name!r}: deleting rows the source no longer has failed",
                                     exc)) from exc
        left = self.count_source(source)
        return before - left, left

    def count_source(self, source: str, max_row: int | None = None) -> int:
        """Rows of one source (``row <= max_row`` only, when given), exact (strong consistency)."""
        self._flush()
        expr = f"{self._at('source')} == {quote(source)}" + (
            f" and row <= {int(max_row)}" if max_row is not None else "")
        res = self.client.query(self.name, filter=expr, output_fields=["count(*)"], consistency_level="Strong",
                                timeout=self.timeout)
        return int(res[0]["count(*)"])

    def digests(self, source: str, batch_size: int = 16384) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The ids and digests of ``source``'s rows that carry one (a collection with the digest
        field), ``batch_size`` rows at a time, each part sorted by id: what a rerun of its ingest
        need not encode again, read without holding the whole collection's (16 bytes a row). The
        rows are paged through by their ids' range (``document_ids``), the source checked here: a
        filter on the source would have milvus-lite read every row's document again for each page."""
        self._flush()
        first, last = id_range(source)
        for page in self._pages(f"id >= {first} and id <= {last}", self._asked(["id", "source", DIGEST_FIELD]),
                                "reading the rows' digests", batch_size):
            rows = [r for r in (self._read(r, ["source", DIGEST_FIELD]) for r in page)
                    if r[DIGEST_FIELD] and r["source"] == source[:SOURCE_MAX]]
            if rows:
                ids = np.fromiter((r["id"] for r in rows), np.int64, len(rows))
                digests = np.fromiter((r[DIGEST_FIELD] for r in rows), np.int64, len(rows))
                order = np.argsort(ids, kind="stable")
                yield ids[order], digests[order]

    def _pages(self, expr: str, fields: list[str], what: str, batch_size: int = 16384) -> Iterator[list[dict]]:
        """The rows where ``expr`` holds, a page of ``batch_size`` at a time; a failure is a StoreError."""
        try:
            it = self.client.query_iterator(self.name, batch_size=batch_size, filter=expr, output_fields=fields,
                                            timeout=self.timeout)
            while page := it.next():
                yield page
            it.close()
        except Exception as exc:
            raise StoreError(_failed(f"collection {self.name!r}: {what} failed", exc)) from exc

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

    def search_text(self, texts: Sequence[str], k: int, output_fields: Iterable[str] = OUTPUT_FIELDS,
                    filter: str | None = None, batch_size: int = 100,
                    codes: np.ndarray | None = None) -> list[list[dict[str, Any]]]:
        """Top-k rows by BM25 over the stored text (a collection with a text index) for each
        query text: one list per query of {"id", "bm25" (float, higher is better), and the
        output fields}, best first (ties by id). A query that shares no term with any row finds
        nothing. ``filter`` as in ``search``. ``codes``: the queries' codes, for each hit's
        ``distance`` where the engine beside the file stores the rows' codes."""
        check_search_k(k)
        expr = self._filter(filter)
        if self._words_kept():
            self._commit_words()
            self.check_words()
            found = [self._search_words(str(t), k, list(output_fields), expr) for t in texts]
            for i, row in enumerate(found):
                for h in row:
                    code = h.pop("_code", None)
                    if codes is not None and code is not None:
                        h["distance"] = hamming(code, codes[i])
            return found
        out: list[list[dict[str, Any]]] = []
        for start in range(0, len(texts), batch_size):
            data = [str(t) for t in texts[start : start + batch_size]]
            for hits in self._search(data, TEXT_SPARSE_FIELD, {"metric_type": "BM25", "params": {}}, _ahead(k),
                                     output_fields, expr):
                rows = [{"id": h["id"], "bm25": round(float(h["distance"]), 4), **h.get("entity", {})} for h in hits]
                rows.sort(key=lambda h: (-h["bm25"], h["id"]))
                out.append(rows[:k])
        return out

    def _search_words(self, text: str, k: int, fields: list[str], expr: str | None) -> list[dict[str, Any]]:
        """``search_text`` beside the file: the engine's stored rows, or (a filter) its pages through Milvus'."""
        hits, offset, page = [], 0, k if expr is None else max(2 * k, 64)  # ties by id: lexical.top
        while len(hits) < k:
            part = self.words.top(self.name, text, page, offset)
            if not part:
                break
            stored = expr is None and all(f in h.fields for h in part for f in fields)
            found = {h.id: h.fields for h in part} if stored else self._rows_where([h.id for h in part], fields, expr)
            hits += [{"id": h.id, "bm25": round(h.score, 4), **{f: found[h.id].get(f) for f in fields}, "_code": h.code}
                     for h in part if h.id in found]
            if len(part) < page or expr is None:
                break
            offset, page = offset + page, min(4 * page, 8192)  # a filter most rows fail: larger pages, fewer calls
        return hits[:k]  # the engine's order: BM25, then equal scores by id

    def _rows_where(self, ids: list[int], fields: list[str], expr: str | None) -> dict[int, dict[str, Any]]:
        """Rows ``ids``' ``fields`` (without id), only those the filter ``expr`` holds for."""
        if expr is None:
            rows = self.get(ids, fields).values()  # a stored row without the fields asked
        else:
            rows = self._query(f"id in {ids} and ({expr})", fields, "search", expr)
        return {int(r["id"]): {f: r[f] for f in fields if f != "id"} for r in rows}

    @property
    def words(self) -> TextIndex:
        """The words' indexes beside the milvus-lite file (tantivy, one per collection)."""
        if self._words is None:
            self._words = TextIndex(self.lite_file)
        return self._words

    def words_state(self) -> str | None:
        """Why the words kept beside the file cannot answer for this collection (missing, damaged,
        or stale: of another generation than the collection's); None where they are in step."""
        from dhim_ray.connectors import ledger

        try:
            side = self.words.generation(self.name)
        except StoreError as exc:
            logger.debug("the words of %s: %s", self.name, exc)
            return "damaged (the engine cannot read it)"
        if side is None:
            return "missing" if not self.words.path.exists() else "missing for this collection"
        if side != ledger.words_generation(self.client, self.name, self.timeout):
            return "stale (written before the collection last changed)"
        return None

    def check_words(self) -> None:
        """A StoreError saying how to mend it where this collection's words are not in step with it."""
        if self._words_checked:
            return
        why = self.words_state()
        if why is not None:
            raise StoreError(f"collection {self.name!r}: its words' index ({self.words.path}) is {why}; rerun the "
                             "same ingest (it rebuilds them from the stored text), or search with mode codes")
        self._words_checked = True

    def renew_words(self) -> None:
        """Start a write session of this collection's words: a new generation, recorded in the file
        now and beside it once the session's words are committed (``close``); words not in step
        are rebuilt from the stored rows first (said in one line)."""
        from dhim_ray.connectors import ledger

        why, self._generation, self._recorded = self.words_state(), uuid.uuid4().hex, False
        ledger.set_words_generation(self.client, self.name, self._generation, self.timeout)  # the old words: stale
        if why is not None and why.startswith("damaged"):
            self.words.close()
            aside = self.words.path.with_name(f"{self.words.path.name}.damaged-{int(time.time())}")
            self.words.path.rename(aside)
            logger.warning("%s was damaged: moved to %s; each collection's words are rebuilt at its next ingest",
                           self.words.path, aside)
        if why is not None:
            self.words.create(self.name)
            fields, rows = ["id", CODE_FIELD, *self.describe().output_fields], 0
            for page in self._pages("", self._asked(fields), "reading the stored rows"):
                page = [self._read(r, fields) for r in page]
                self.words.write(self.name, {f: [r.get(f) for r in page] for f in fields}, new=True)
                rows += len(page)
            if rows:
                logger.info("%s: its words' index was %s; rebuilt from the stored text of %s rows", self.name, why,
                            f"{rows:,}")
            self.words.set_generation(self.name, self._generation)
            self._recorded = True
        self._words_checked = True

    def _commit_words(self) -> None:
        """This session's words published, and their generation recorded beside the file."""
        if self._words is None:
            return
        committed = self.words.commit(self.name)
        if self._generation and (committed or not self._recorded):
            self.words.set_generation(self.name, self._generation)
            self._recorded = True

    def _words_kept(self) -> bool:
        """Whether this collection's words are kept beside its milvus-lite file (lexical.TextIndex)."""
        if not self.lite_file:
            return False
        if self._text_store is None:
            self.describe()
        return self._text_store == "file"

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



def _ahead(k: int) -> int:
    """Hits to fetch so the k kept are the same ties-by-id whatever the write order: k more."""
    return min(2 * int(k), MAX_SEARCH_K)


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


def check_search_k(k: int) -> int:
    """Hits per query must be in 1..16384 (Milvus' top-k limit); raise ConfigError otherwise."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_SEARCH_K:
        raise ConfigError(f"k={k}: must be between 1 and {MAX_SEARCH_K} (Milvus' top-k limit)", field="k")
    return int(k)

