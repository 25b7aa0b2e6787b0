"""What a code row holds: its fields, deterministic document ids, and the validated columns
an upsert takes (``code_rows``, from a columnar batch)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dhim_ray.codes import check_codes
from dhim_ray.corpus.columns import PREFIX
from dhim_ray.errors import CodeFormatError, ConfigError

CODE_FIELD = "code"
TEXT_SPARSE_FIELD = "text_sparse"  # optional (the text index): BM25 terms of ``text``, filled by Milvus
TEXT_FUNCTION = "text_bm25"
LABEL_NAME_FIELD = "label_name"
LABEL_NAME_MAX = 256  # characters kept of a label's name
KEY_FIELD = "key"
KEY_MAX = 256  # characters of a document's own id (longer ones are refused, not cut)
SOURCE_MAX = 256  # characters kept of a row's source label
#: A hash of everything a row is made from (its whole text, label, ids, kept columns): a rerun finds
#: the rows stored as they are and neither encodes nor writes them. 0: not known (rows of old writers).
DIGEST_FIELD = "digest"
TEXT_PREVIEW = 1024
OUTPUT_FIELDS = ["label", "text", "source", "row"]
#: A milvus-lite collection keeps these fields (name: kind) in one JSON field, DOC_FIELD: its open
#: reads every field of every row, and its strings cost most (docs/experiments.md).
DOC_FIELD = "doc"
IN_DOC = {"text": "string", "source": "string", LABEL_NAME_FIELD: "string", KEY_FIELD: "string", DIGEST_FIELD: "int"}
#: Every field name dhim-ray itself writes: a kept metadata column cannot take one.
RESERVED_FIELDS = ("id", CODE_FIELD, "label", LABEL_NAME_FIELD, "text", "source", "row", KEY_FIELD, TEXT_SPARSE_FIELD,
                   DIGEST_FIELD, DOC_FIELD)


def source_label(source_id: str, display: str) -> str:
    """The ``source`` field of a code row: readable (``dbpedia:train``) and unique to the
    source (a hash of its full identity: resolved path or hub id, and split), in
    characters that need no quoting."""
    digest = hashlib.blake2b(source_id.encode(), digest_size=6).hexdigest()
    readable = re.sub(r"[^A-Za-z0-9_.:/-]", "_", display)[-200:]
    return f"{readable}@{digest}"


def document_ids(source: str, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """Deterministic INT64 ids: 23 bits from a hash of ``source`` (see source_label),
    40 bits of row number. The same document always gets the same id, so a rerun
    upserts onto the same rows; another source's ids differ in the top bits, and a
    hash collision is caught by ``refuse_foreign_rows`` before anything is written."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= 1 << 40):
        raise ConfigError("row numbers must be in [0, 2^40) to form document ids")
    return np.int64(id_range(source)[0]) | rows


def id_range(source: str) -> tuple[int, int]:
    """The first and the last ``document_ids`` of ``source`` can take (its hash's 23 bits on top)."""
    prefix = int.from_bytes(hashlib.blake2b(source.encode(), digest_size=8).digest(), "big") & ((1 << 23) - 1)
    return prefix << 40, ((prefix + 1) << 40) - 1  # the last fits INT64 (past it would not, for the top prefix)


def row_digests(columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
    """One nonzero INT64 per row: a hash of its values in ``columns`` (text, label, key, ...), in
    a fixed order of the names, so the same row read again gets the same digest."""
    names = sorted(columns)
    out = np.empty(len(columns[names[0]]) if names else 0, dtype=np.int64)
    for i, values in enumerate(zip(*(columns[name] for name in names))):
        digest = int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=8).digest(), "big", signed=True)
        out[i] = digest or 1
    return out


#: A write's rows by column: field name -> one value per row, as CodeCollection.upsert takes them.
Columns = dict[str, list]


def code_rows(batch: Mapping[str, Any], n_bits: int, source: str) -> Columns:
    """The validated columns an upsert takes, from a columnar batch: ``id``, ``code`` (uint8
    (n, n_bits / 8), checked for dtype and length: Milvus stores a wrong length silently) and, where
    present, ``text``, ``row``, ``label``, ``label_name``, ``key``, ``digest`` and ``col:NAME``."""
    codes = batch.get(CODE_FIELD)
    if codes is None or len(codes) == 0:
        codes = np.zeros((0, n_bits // 8), np.uint8)
    elif isinstance(codes, np.ndarray) and codes.dtype == object:  # a tensor column as Arrow gives it: one array a row
        codes = np.stack(codes).astype(np.uint8)
    codes = check_codes(np.asarray(codes), n_bits)
    n = len(codes)
    kept = {name: [v.item() if hasattr(v, "item") else v for v in values]
            for name, values in kept_columns(batch).items()}
    given = {name: batch.get(name, () if name == "id" else None)  # the others are optional
             for name in ("id", "text", "row", "label", LABEL_NAME_FIELD, KEY_FIELD, DIGEST_FIELD)}
    for name, col in (*given.items(), *kept.items()):
        if col is not None and len(col) != n:
            raise CodeFormatError(f"{name} has {len(col)} entries for {n} codes: expected one per code")
    out: Columns = {"id": [int(i) for i in given["id"]], CODE_FIELD: [c.tobytes() for c in codes],
                    "label": [-1] * n if given["label"] is None else [int(v) for v in given["label"]],
                    "text": [""] * n if given["text"] is None else [_preview(str(t)) for t in given["text"]],
                    "source": [source[:SOURCE_MAX]] * n, "row": [0] * n if given["row"] is None else [int(r) for r in given["row"]]}
    names = given[LABEL_NAME_FIELD]
    out[LABEL_NAME_FIELD] = [""] * n if names is None else [_cut(str(v), LABEL_NAME_MAX) for v in names]
    keys = None if given[KEY_FIELD] is None else [str(k) for k in given[KEY_FIELD]]
    if keys is not None:
        too_long = next((k for k in keys if len(k) > KEY_MAX), None)
        if too_long is not None:
            raise CodeFormatError(f"id {too_long[:40]!r}...: ids are at most {KEY_MAX} characters")
    out[KEY_FIELD] = [""] * n if keys is None else keys
    out[DIGEST_FIELD] = [0] * n if given[DIGEST_FIELD] is None else [int(d) for d in given[DIGEST_FIELD]]
    return {**out, **kept}


def take(columns: Columns, positions: Sequence[int]) -> Columns:
    """The rows at ``positions`` of ``columns``."""
    return {name: [values[i] for i in positions] for name, values in columns.items()}


def kept_columns(batch) -> dict[str, Any]:
    """The kept metadata columns of a block or batch (``col:NAME``), by their field names."""
    return {name[len(PREFIX):]: values for name, values in batch.items() if name.startswith(PREFIX)}


def _preview(text: str) -> str:
    return _cut(text, TEXT_PREVIEW)


def _cut(text: str, chars: int) -> str:
    # VARCHAR max_length counts bytes (it is chars * 4 here); keep a margin for multi-byte characters.
    cut = text[:chars]
    while len(cut.encode("utf-8")) > chars * 4 - 4:
        cut = cut[: len(cut) // 2]
    return cut
