"""What a code row holds: its fields, deterministic document ids, and the validated rows an
upsert takes (from arrays, or from a columnar batch of the ingest)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from dhim_ray.codes import check_codes
from dhim_ray.corpus.columns import PREFIX
from dhim_ray.errors import CodeFormatError, CollectionMismatchError, ConfigError

CODE_FIELD = "code"
VECTOR_FIELD = "vector"  # optional (ingest --store-vectors): the unit-norm sentence vector, float16
SIGN_FIELD = "sign"  # optional (ingest --store-signs): the sign bits of the sentence vector, packed
TEXT_SPARSE_FIELD = "text_sparse"  # optional (the text index): BM25 terms of ``text``, filled by Milvus
TEXT_FUNCTION = "text_bm25"
LABEL_NAME_FIELD = "label_name"
LABEL_NAME_MAX = 256  # characters kept of a label's name
KEY_FIELD = "key"
KEY_MAX = 256  # characters of a document's own id (longer ones are refused, not cut)
TEXT_PREVIEW = 1024
OUTPUT_FIELDS = ["label", "text", "source", "row"]
#: Every field name dhim-ray itself writes: a kept metadata column cannot take one.
RESERVED_FIELDS = ("id", CODE_FIELD, "label", LABEL_NAME_FIELD, "text", "source", "row", KEY_FIELD, VECTOR_FIELD,
                   SIGN_FIELD, TEXT_SPARSE_FIELD)


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
    prefix = int.from_bytes(hashlib.blake2b(source.encode(), digest_size=8).digest(), "big") & ((1 << 23) - 1)
    return (np.int64(prefix) << np.int64(40)) | rows


def make_rows(
    ids: np.ndarray,
    codes: np.ndarray,
    n_bits: int,
    labels: np.ndarray | None,
    texts: Sequence[str],
    source: str,
    rows: np.ndarray,
    vectors: np.ndarray | None = None,
    label_names: Sequence[str] | None = None,
    name_field: bool = True,
    keys: Sequence[str] | None = None,
    key_field: bool = True,
    signs: np.ndarray | None = None,
    columns: dict[str, Sequence] | None = None,
) -> list[dict[str, Any]]:
    """Validated insert rows. Every code is checked for dtype and length first:
    Milvus stores wrong-length codes silently and shifts the rest of the batch.
    ``vectors`` (n, d): sentence vectors, stored unit-norm as float16. ``label_names``:
    each row's label name (None: "" for every row). ``name_field``: the collection has the
    label_name field (CollectionInfo.label_names; False for one made before it existed).
    ``keys``: each document's own id (None: "" for every row), at most KEY_MAX characters;
    ``key_field``: the collection has the key field (CollectionInfo.keys). ``signs``: packed
    sign bits of each document's sentence vector (uint8 (n, width // 8)). ``columns``: kept
    metadata, name -> one value per row (of the kind its field has)."""
    codes = check_codes(codes, n_bits)
    n = len(codes)
    if signs is not None:
        signs = check_codes(np.asarray(signs, dtype=np.uint8))
        if len(signs) != n:
            raise CodeFormatError(f"signs has {len(signs)} rows for {n} codes: expected one per code")
    if vectors is not None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != n or not np.isfinite(vectors).all():
            raise CodeFormatError(f"vectors of shape {vectors.shape}: expected ({n}, width), finite, one per code")
        vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)).astype(np.float16)
    for name, col in (("ids", ids), ("texts", texts), ("rows", rows)):
        if len(col) != n:
            raise CodeFormatError(f"{name} has {len(col)} entries for {n} codes: expected one per code")
    columns = {name: [v.item() if hasattr(v, "item") else v for v in values] for name, values in (columns or {}).items()}
    for name, col in (("labels", labels), ("label_names", label_names), ("keys", keys), *columns.items()):
        if col is not None and len(col) != n:
            raise CodeFormatError(f"{name} has {len(col)} entries for {n} codes: expected one per code")
    if keys is not None:
        keys = [str(k) for k in keys]
        too_long = next((k for k in keys if len(k) > KEY_MAX), None)
        if too_long is not None:
            raise CodeFormatError(f"id {too_long[:40]!r}...: ids are at most {KEY_MAX} characters")
        if not key_field:
            raise CollectionMismatchError("the collection was made before rows kept their own ids; ingest into a new "
                                          "collection, or drop the ids")
    out = []
    for i in range(n):
        out.append({
            "id": int(ids[i]),
            CODE_FIELD: codes[i].tobytes(),
            "label": int(labels[i]) if labels is not None else -1,
            "text": _preview(texts[i]),
            "source": source[:256],
            "row": int(rows[i]),
            **({VECTOR_FIELD: vectors[i]} if vectors is not None else {}),
            **({SIGN_FIELD: signs[i].tobytes()} if signs is not None else {}),
            **({LABEL_NAME_FIELD: _cut(str(label_names[i]), LABEL_NAME_MAX) if label_names is not None else ""}
               if name_field else {}),
            **({KEY_FIELD: keys[i] if keys is not None else ""} if key_field else {}),
            **{name: values[i] for name, values in columns.items()},
        })
    return out


def batch_rows(batch: dict[str, Any], n_bits: int, source: str, name_field: bool = True,
               key_field: bool = True) -> list[dict[str, Any]]:
    """Validated rows from a columnar batch of the ingest (numpy columns id, code, label, text,
    row, and label_name, key, vector, sign and ``col:NAME`` where present): the one row builder
    of the driver's writes and the write tasks'. ``name_field`` / ``key_field``: the collection
    has the label_name / key field (CollectionInfo.label_names / keys)."""

    def matrix(name: str, dtype=None) -> np.ndarray | None:  # a tensor column, stacked where Arrow gave rows
        col = batch.get(name)
        if col is None or len(col) == 0:
            return None
        out = np.stack(col) if col.dtype == object else np.asarray(col)
        return out.astype(dtype) if dtype else out

    codes = matrix("code", np.uint8)
    return make_rows(batch["id"], np.zeros((0, n_bits // 8), np.uint8) if codes is None else codes, n_bits,
                     batch.get("label"), [str(t) for t in batch["text"]], source, batch["row"], matrix("vector"),
                     batch.get(LABEL_NAME_FIELD), name_field=name_field, keys=batch.get(KEY_FIELD),
                     key_field=key_field, signs=matrix("sign", np.uint8), columns=kept_columns(batch))


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
