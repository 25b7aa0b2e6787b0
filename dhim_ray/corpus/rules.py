"""The input rules every corpus read applies, written once for the in-memory loader and Ray
Data's read tasks: ``findings`` lists what is wrong in one block, ``ScanResult`` adds a split's
blocks up, ``check`` refuses it in one line, ``number_labels`` numbers labels in one vocabulary."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dhim_ray.corpus import columns as kept_columns
from dhim_ray.corpus.text import has_text
from dhim_ray.errors import DataError

logger = logging.getLogger(__name__)

SHOWN = 5  # bad rows named in an error


def shown(rows: Sequence[int] | np.ndarray) -> str:
    """'1, 5, 9, ...': the first SHOWN row numbers of a list."""
    return ", ".join(str(int(r)) for r in rows[:SHOWN]) + (", ..." if len(rows) > SHOWN else "")


def empty_split(where: str) -> DataError:
    return DataError(f"{where} is empty: no documents to work with; check the path or split name")


def _no_label(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or (isinstance(value, str)
                                                                               and not value.strip())


def label_names(values) -> list[str]:
    """The distinct names among a column's label values, sorted; missing ones left out."""
    return sorted({str(v) for v in values if not _no_label(v)})


#: Integer labels beyond this are not class numbers a float or a database keeps exactly.
MAX_LABEL_NUMBER = 2**53


def labels_are_numbers(label) -> bool:
    """Whether a label column holds class numbers: integers (or whole floats, as a CSV
    column with a gap reads) of at most MAX_LABEL_NUMBER. Anything else (1.2, True, 2**70,
    text) is kept as label names, never truncated."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = label.type
    if pa.types.is_null(kind):
        return True
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return False
    valid = pc.drop_null(label)
    if pa.types.is_floating(kind):
        valid = pc.filter(valid, pc.invert(pc.is_nan(valid)))
        if len(valid) and not pc.all(pc.equal(pc.floor(valid), valid)).as_py():
            return False
    if not len(valid):
        return True
    bounds = pc.min_max(valid)
    return bounds["min"].as_py() >= -MAX_LABEL_NUMBER and bounds["max"].as_py() <= MAX_LABEL_NUMBER


def findings(block, cleaning: str = "unicode", key_max: int | None = None) -> dict:
    """What one block holds and what is wrong with it, by the block's ``row`` numbers:
    rows whose text is empty after cleaning (or not a string), rows with no label, the
    string label names, rows whose id (``key``) is empty or longer than ``key_max``."""
    import pyarrow as pa

    texts = block.column("text").to_pylist()
    rows = block.column("row").to_numpy()
    out = {"rows": len(rows), "blank": [int(rows[j]) for j, t in enumerate(texts)
                                        if not isinstance(t, str) or not has_text(t, cleaning)],
           "unlabelled": [], "names": [], "string_labels": False, "unkeyed": [], "long_keys": []}
    if "label" in block.column_names:
        label = block.column("label")
        values = label.to_pylist()
        out["unlabelled"] = [int(rows[j]) for j, v in enumerate(values) if _no_label(v)]
        if not labels_are_numbers(label):
            out["string_labels"] = True
            out["names"] = label_names(values)
        elif pa.types.is_floating(label.type):
            # whole floats here, maybe not in the next block: their names too, so a split that
            # turns out to hold 1.5 somewhere numbers every block in one vocabulary
            out["names"] = label_names(values)
    if "key" in block.column_names:
        keys = block.column("key").to_pylist()
        out["unkeyed"] = [int(rows[j]) for j, v in enumerate(keys) if v is None or not v.strip()]
        out["long_keys"] = [int(rows[j]) for j, v in enumerate(keys) if key_max and v is not None and len(v) > key_max]
    out["columns"] = {}
    for name in block.column_names:
        if name.startswith(kept_columns.PREFIX):
            kind, longest, missing = kept_columns.block_findings(block.column(name))
            out["columns"][name[len(kept_columns.PREFIX):]] = [kind, longest, [int(rows[j]) for j in missing]]
    return out


@dataclass
class ScanResult:
    """What the blocks of one split hold, by split-wide row number."""

    shard_rows: list[int]
    blank_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted
    label_names: list[str] | None = None  # string labels, sorted; None for integer labels or none
    unlabelled_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unkeyed_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # empty id (--id-column)
    long_key_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # id too long
    # kept columns (ingest --keep-columns): name -> (kind, longest value in bytes), and rows missing a value
    columns: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    missing_values: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.concatenate([[0], np.cumsum(self.shard_rows)[:-1]])] if self.shard_rows else []

    @property
    def n_rows(self) -> int:
        return int(sum(self.shard_rows))

    @classmethod
    def collect(cls, n_shards: int, found: Iterable[tuple[int, dict]]) -> ScanResult:
        """Add up ``(shard, findings)`` pairs, in any order; a block's rows are numbered
        inside its shard."""
        result = cls([0] * n_shards)
        lists: dict[str, list[tuple[int, int]]] = {k: [] for k in ("blank", "unlabelled", "unkeyed", "long_keys")}
        names: set[str] = set()
        string_labels = False
        missing: dict[str, list[tuple[int, int]]] = {}
        for shard, f in found:
            for name, (kind, longest, absent) in f.get("columns", {}).items():
                was, was_longest = result.columns.get(name, (None, 0))
                result.columns[name] = (kept_columns.wider(was, kind), max(was_longest, longest))
                missing.setdefault(name, []).extend((shard, int(r)) for r in absent)
            result.shard_rows[shard] += int(f["rows"])
            for key, rows in lists.items():
                rows += [(shard, int(r)) for r in f[key]]
            names.update(f["names"])
            string_labels |= bool(f["string_labels"])
        offsets = result.offsets

        def split_wide(pairs: list[tuple[int, int]]) -> np.ndarray:
            return np.sort(np.asarray([offsets[s] + r for s, r in pairs], dtype=np.int64))

        result.blank_rows, result.unlabelled_rows = split_wide(lists["blank"]), split_wide(lists["unlabelled"])
        result.unkeyed_rows, result.long_key_rows = split_wide(lists["unkeyed"]), split_wide(lists["long_keys"])
        result.label_names = sorted(names) if string_labels else None
        result.missing_values = {name: split_wide(pairs) for name, pairs in missing.items()}
        return result


def check(where: str, result: ScanResult, drop_empty: bool, limit: int | None, key_column: str | None = None,
          key_max: int | None = None) -> tuple[int, int]:
    """Refuse what cannot be used, in one line. Returns (rows to read with ``limit``
    applied, of which empty and dropped)."""
    n = result.n_rows if limit is None else min(limit, result.n_rows)
    if n == 0:
        raise empty_split(where)
    blank = result.blank_rows[result.blank_rows < n]
    unlabelled = result.unlabelled_rows[result.unlabelled_rows < n]
    if len(unlabelled):
        raise DataError(f"{where}: {len(unlabelled)} rows have no label (rows {shown(unlabelled)}); "
                        "fill them in, or name no label column")
    unkeyed = result.unkeyed_rows[result.unkeyed_rows < n]
    if len(unkeyed):
        raise DataError(f"{where}: {len(unkeyed)} rows have no id in column {key_column!r} "
                        f"(rows {shown(unkeyed)}); fill them in, or drop id_column", field="id_column")
    long_keys = result.long_key_rows[result.long_key_rows < n]
    if len(long_keys):
        raise DataError(f"{where}: {len(long_keys)} ids in column {key_column!r} are longer than "
                        f"{key_max} characters (rows {shown(long_keys)}); shorten them, or drop id_column", field="id_column")
    for name, rows in result.missing_values.items():
        rows = rows[rows < n]
        if len(rows):
            raise DataError(f"{where}: column {name!r} has no value in {len(rows)} rows (rows {shown(rows)}); fill "
                            "them in, or leave it out of keep_columns", field="keep_columns")
    for name, (_, longest) in result.columns.items():
        if longest > kept_columns.STRING_MAX_BYTES:
            raise DataError(f"{where}: column {name!r} has a value of {longest:,} bytes; Milvus keeps at most "
                            f"{kept_columns.STRING_MAX_BYTES:,} in a field; shorten it, or leave it out of keep_columns",
                            field="keep_columns")
    if len(blank) and not drop_empty:
        raise DataError(f"{where}: {len(blank)} of {n} rows have empty or non-string text "
                        f"(rows {shown(blank)}); fix the data or pass drop_empty=True to skip them")
    if len(blank) == n:
        raise DataError(f"{where}: every row has empty text; nothing left to use")
    if len(blank):
        logger.warning("%s: dropped %d of %d rows with empty text (rows %s)", where, len(blank), n, shown(blank))
    return n, len(blank)


def number_labels(values: list, vocabulary: Sequence[str] | None,
                  names_of_numbers: Sequence[str] | None = None) -> tuple[np.ndarray, list[str] | None]:
    """(int64 class numbers, each row's label name or None): string labels are numbered in
    the corpus' one ``vocabulary`` (so a class missing from one split does not shift the
    others'); integer labels stay as they are, named by ``names_of_numbers`` where given."""
    if vocabulary is not None:
        index = {n: i for i, n in enumerate(vocabulary)}
        names = [str(v) for v in values]
        return np.asarray([index[n] for n in names], dtype=np.int64), names
    labels = np.asarray(values, dtype=np.int64)
    if names_of_numbers is None:
        return labels, None
    known = len(names_of_numbers)
    return labels, [names_of_numbers[v] if 0 <= v < known else "" for v in labels.tolist()]


def warn_few_labels(where: str, limit: int, kept: np.ndarray, labels: np.ndarray) -> None:
    """Warn when the first ``limit`` rows hold at most half of the split's labels though
    they are many enough (10 per label) to hold them all: a split ordered by label."""
    if len(kept) >= len(labels):
        return
    have, of = len(np.unique(kept)), len(np.unique(labels))
    if have <= max(1, of // 2) < of and len(kept) >= 10 * of:
        logger.warning("%s: --limit %d keeps its first %d of %d rows, which hold %d of its %d labels (the split "
                       "is ordered by label?): precision@k on them means little", where, limit, len(kept),
                       len(labels), have, of)
