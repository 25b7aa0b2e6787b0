"""Metadata columns kept beside the codes (``ingest --keep-columns``): each column's kind
(``bool``, ``int``, ``float``, ``string``, narrowest first), found block by block while the source
is scanned, and the values converted to it. Typed sources give the kind by type; text formats
take the narrowest kind every value parses as, and stay strings wherever a number would change
a value ("007", past 64 bits). Blocks that disagree settle on the wider kind; a null is refused."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

#: The longest string value a column may hold, in UTF-8 bytes (Milvus' VARCHAR limit).
STRING_MAX_BYTES = 65_535
#: Where a kept column travels in a block of rows (beside text, label, key, ...).
PREFIX = "col:"

_INT = re.compile(r"[+-]?\d{1,19}")
_FLOAT = re.compile(r"[+-]?(\d*)\.?(\d+)?(?:[eE][+-]?\d+)?")
_LEADING_ZERO = re.compile(r"[+-]?0\d")
_BOOLS = {"true": True, "false": False}
#: Milvus' rule for the name of a field, a collection or an alias: an ASCII letter or
#: underscore, then ASCII letters, digits and underscores, 255 characters at most.
MILVUS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
#: Words Milvus' filter parser reads as a function or keyword in any case: a field so named
#: cannot be filtered on (milvus-lite stops on ``array_contains == 1``).
FILTER_WORDS = frozenset({
    "and", "or", "not", "in", "like", "true", "false", "is", "null", "exists", "array_contains",
    "array_contains_all", "array_contains_any", "array_length", "json_contains", "json_contains_all",
    "json_contains_any", "text_match", "phrase_match", "random_sample", "json_contains_path", "count"})


def check_name(name: str) -> str:
    """A column name a Milvus field can have (letters, digits, underscores; not starting with a digit)."""
    if len(name) > 255:
        raise ValueError(f"{name[:40]!r}... ({len(name)} characters) is longer than the 255 a Milvus field name "
                         "takes (rename the column)")
    if not MILVUS_NAME.fullmatch(name):
        raise ValueError(f"{name!r} cannot name a Milvus field: use letters, digits and underscores, not starting "
                         "with a digit (rename the column)")
    if name.lower() in FILTER_WORDS:
        raise ValueError(f"{name!r} is a word Milvus' filters read as a function or keyword, so no filter could "
                         "name it (rename the column)")
    return name


def _parses_int(text: str) -> bool:
    """A whole number that is one: 64-bit, and without leading zeros ("007" is a code, kept as text)."""
    return bool(_INT.fullmatch(text)) and -(2**63) <= int(text) < 2**63 and not _LEADING_ZERO.match(text)


def _parses_float(text: str) -> bool:
    """A number a 64-bit float holds as written: finite, at most 15 significant digits, no leading zeros."""
    found = _FLOAT.fullmatch(text)
    if found is None or _LEADING_ZERO.match(text):
        return False
    digits = (found.group(1) + (found.group(2) or "")).lstrip("0")
    try:
        value = float(text)
    except ValueError:  # ".", "e5": the pattern's empty corners
        return False
    return len(digits.rstrip("0") if found.group(2) is None else digits) <= 15 and math.isfinite(value)


def kind_of_strings(values: Sequence[str]) -> str:
    """The narrowest kind every string parses as."""
    stripped = [v.strip() for v in values]
    if stripped and all(v.lower() in _BOOLS for v in stripped):
        return "bool"
    if stripped and all(_parses_int(v) for v in stripped):
        return "int"
    if stripped and all(_parses_float(v) for v in stripped):
        return "float"
    return "string"


def kind_of_type(arrow_type) -> str | None:
    """A typed column's kind; None for strings (their values decide)."""
    import pyarrow as pa

    if pa.types.is_boolean(arrow_type):
        return "bool"
    if pa.types.is_integer(arrow_type):
        return "int" if not pa.types.is_uint64(arrow_type) else "string"
    if pa.types.is_floating(arrow_type):
        return "float"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type):
        return None
    return "string"  # dates, timestamps, decimals, ...: kept as their text


def wider(a: str | None, b: str | None) -> str | None:
    """The kind both blocks' values fit (None: a block with no values yet)."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    return "float" if {a, b} == {"int", "float"} else "string"


def block_findings(column) -> tuple[str | None, int, list[int]]:
    """(kind, longest value in UTF-8 bytes as text, positions of missing values) of one block's column."""
    values = column.to_pylist()
    present = [v for v in values if v is not None]
    missing = [i for i, v in enumerate(values) if v is None]
    kind = kind_of_type(column.type)
    if kind is None and present:
        kind = kind_of_strings([str(v) for v in present])
    longest = max((len(_text(v).encode("utf-8")) for v in present), default=0)
    return kind, longest, missing


def _text(value) -> str:
    """A value as a string field keeps it: JSON for records and lists, hex for bytes, else its text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


def convert(values: Sequence, kind: str) -> list:
    """A column's values as its kind (the scan found each one fits)."""
    if kind == "string":
        return [_text(v) for v in values]
    if kind == "bool":
        return [v if isinstance(v, bool) else _BOOLS[str(v).strip().lower()] for v in values]
    if kind == "int":
        return [int(v) for v in values]  # int() and float() take the text's surrounding spaces
    return [float(v) for v in values]


def string_bound(longest: int) -> int:
    """The VARCHAR length a string column gets: room to grow, in powers of two from 256 bytes."""
    bound = 256
    while bound < longest:
        bound *= 2
    return min(bound, STRING_MAX_BYTES)
