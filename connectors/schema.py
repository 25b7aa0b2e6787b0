"""What a code collection is in Milvus: its format and version, its fields (``_schema``), what
``describe`` reads back (``CollectionInfo``), its index (``IndexSpec``), and the checks on names,
widths and settings made before Milvus is asked (pymilvus + numpy; never torch)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dhim_ray.connectors.connection import DEFAULT_TIMEOUT, is_lite
from dhim_ray.connectors.filter_words import shown
from dhim_ray.connectors.rows import (
    CODE_FIELD,
    DIGEST_FIELD,
    DOC_FIELD,
    KEY_FIELD,
    KEY_MAX,
    LABEL_NAME_FIELD,
    LABEL_NAME_MAX,
    OUTPUT_FIELDS,
    SOURCE_MAX,
    TEXT_FUNCTION,
    TEXT_PREVIEW,
    TEXT_SPARSE_FIELD,
)
from dhim_ray.corpus.columns import MILVUS_NAME, wider
from dhim_ray.errors import ConfigError, check_range, first_line

FORMAT = "dhim-ray/codes"
#: The layout a collection's rows have, stamped in its description; another is refused in one line.
FORMAT_VERSION = 2
MAX_SEARCH_K = 16384  # Milvus' limit on top-k
#: How long loading a collection may take (``CodeCollection.load``), and the rows from which it says so.
LOAD_TIMEOUT, LOAD_NOTICE_ROWS = 3 * 3600.0, 200_000
#: Free space below which a write to a milvus-lite file is refused at once (its server retries a
#: write on a full disk until the call's timeout, then fails without saying why).
LITE_MIN_FREE_BYTES = 16 * 2**20
INDEX_TYPES = ("BIN_FLAT", "BIN_IVF_FLAT")

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
    columns: dict[str, tuple[str, int]] = field(default_factory=dict)  # kept metadata: name -> (kind, string bound)
    text_index: bool = False  # BM25 over the stored text: text and hybrid search
    text_store: str = ""  # where that index is: "milvus" (its text_sparse field) or "file" (lexical.TextIndex)
    in_doc: bool = False  # text, source, label_name, key and digest are kept in one JSON field (DOC_FIELD)
    version: int = FORMAT_VERSION  # the layout of its rows (FORMAT_VERSION)

    @property
    def output_fields(self) -> list[str]:
        """The fields a search returns beside id and distance."""
        return [*OUTPUT_FIELDS, LABEL_NAME_FIELD, KEY_FIELD, *self.columns]

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



def check_search_k(k: int) -> int:
    """Hits per query must be in 1..16384 (Milvus' top-k limit); raise ConfigError otherwise."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_SEARCH_K:
        raise ConfigError(f"k={k}: must be between 1 and {MAX_SEARCH_K} (Milvus' top-k limit)", field="k")
    return int(k)


def _ahead(k: int) -> int:
    """Hits to fetch so the k kept are the same ties-by-id whatever the write order: k more."""
    return min(2 * int(k), MAX_SEARCH_K)
