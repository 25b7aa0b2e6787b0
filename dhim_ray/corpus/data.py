"""A corpus in memory: plan each split, read every shard, apply the input rules (no Ray,
no Milvus). The same reader and rules serve Ray Data's streaming reads (jobs/read_tasks.py);
corpora are named as in dhim_ray.corpus.spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dhim_ray.corpus import rules
from dhim_ray.corpus.sources import label_vocabulary, plan_split, read_shard, split_names
from dhim_ray.corpus.spec import CorpusSpec, canonical_split
from dhim_ray.errors import DataError


@dataclass
class Split:
    """One split: texts, optional integer labels, and each row's index in the source."""

    texts: list[str]
    labels: np.ndarray | None
    rows: np.ndarray  # source row numbers (stable ids for ingest)
    label_names: list[str] | None = None

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


def load_corpus(spec: str | CorpusSpec, **options) -> Corpus:
    """A corpus loaded into memory by name, path or hub id: the spec's one split, else every split.

    ``spec``: a CorpusSpec or its string (``bbc:train``). Returns the Corpus, string labels numbered
    with one vocabulary over its splits. Raises UnknownDatasetError, HubUnreachableError, DataError."""
    if not isinstance(spec, CorpusSpec):
        spec = CorpusSpec.parse(spec, **options)
    names = [spec.split] if spec.split else split_names(spec)
    tables, plans, scans = {}, {}, {}
    for name in names:
        plan = plan_split(spec.with_split(name))
        table = _read_all(plan)
        scanned = rules.ScanResult.collect(1, [(0, rules.findings(table))])
        rules.check(plan.where, scanned, spec.drop_empty, spec.limit)
        tables[name], plans[name], scans[name] = table, plan, scanned
    vocabulary = label_vocabulary(spec, {canonical_split(n): s.label_names for n, s in scans.items()})
    corpus = Corpus(_display_name(spec))
    for name in names:
        corpus.splits[name] = _to_split(tables[name], plans[name], scans[name], spec, vocabulary)
    return corpus


def load_split(spec: str | CorpusSpec, default_split: str = "train", **options) -> Split:
    """One split of a corpus: ``load_split('dbpedia:val')``; ``default_split`` where the spec
    names none (a single file has one split, its ``train``: a user who names a file means all of it)."""
    if not isinstance(spec, CorpusSpec):
        spec = CorpusSpec.parse(spec, **options)
    split = spec.split or spec.default_split(default_split)
    return load_corpus(spec.with_split(split)).split(split)


def _display_name(spec: CorpusSpec) -> str:
    from pathlib import Path

    path = Path(spec.name)
    return spec.name if not path.exists() else path.name if path.is_dir() else path.stem


def _read_all(plan):
    """Every shard of a planned split, in order, as one table numbered ``row`` 0..n-1."""
    import pyarrow as pa

    blocks = [block for shard in plan.shards for block in read_shard(shard, plan.text_column, plan.label_column)]
    if not blocks:
        return pa.table({"text": pa.array([], pa.string()), "row": pa.array([], pa.int64())})
    table = pa.concat_tables(blocks, promote_options="permissive")
    return table.set_column(table.schema.get_field_index("row"), "row",
                            pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _to_split(table, plan, scanned: rules.ScanResult, spec: CorpusSpec, vocabulary: list[str] | None) -> Split:
    n = scanned.n_rows if spec.limit is None else min(spec.limit, scanned.n_rows)
    keep = np.setdiff1d(np.arange(n), scanned.blank_rows) if spec.drop_empty else np.arange(n)  # rules.check passed
    labels = names = None
    if plan.label_column is not None:
        values = table.column("label").to_pylist()
        string = scanned.label_names is not None
        all_labels, _ = rules.number_labels(values, vocabulary if string else None)
        if spec.limit is not None:
            rules.warn_few_labels(plan.where, spec.limit, all_labels[:n], all_labels)
        labels = all_labels[keep]
        names = list(vocabulary) if string else list(plan.label_names) if plan.label_names else None
    texts = table.column("text").to_pylist()
    return Split([texts[i] for i in keep], labels, plan.id_rows(keep), names)


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

