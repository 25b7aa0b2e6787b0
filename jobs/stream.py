"""Ray Data reads a corpus split itself, shard by shard (see dhim_ray.corpus.sources).

Two passes over the source, both in parallel read tasks, neither through the driver:

1. ``scan``: counts every shard's rows, finds rows whose text is empty after
   cleaning, and collects string label names. The driver gets one small summary per
   block (counts, the first few bad rows, the distinct names), so its memory does not
   grow with the corpus. Bad input is refused here, before anything is written.
2. ``read_documents``: the rows again, now with their split-wide row numbers (from the
   scan's counts), deterministic ids, labels numbered in one vocabulary, and empty
   rows dropped when asked; ready for the encoder actors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from dhim_ray.corpus.sources import SourcePlan, plan_split, read_shard
from dhim_ray.corpus.text import has_text
from dhim_ray.errors import DataError

from .ray_env import task_errors

logger = logging.getLogger(__name__)

SHOWN = 5  # bad rows named in an error
# Read blocks of ~256 KiB of text (several hundred documents): a block is the unit an
# encoder actor takes, so even a few thousand documents from one file keep every actor
# busy (a real encoder needs seconds per block); at 1M documents that is ~1,500 blocks.
BLOCK_BYTES = 256 << 10


@dataclass
class ScanResult:
    """What the counting pass found in a split."""

    shard_rows: list[int]
    blank_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # split-wide, sorted
    label_names: list[str] | None = None  # string labels, sorted; None for integer labels or none
    unlabelled_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unkeyed_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # empty id (--id-column)
    long_key_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # id over KEY_MAX characters

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.concatenate([[0], np.cumsum(self.shard_rows)[:-1]])] if self.shard_rows else []

    @property
    def n_rows(self) -> int:
        return int(sum(self.shard_rows))


class ShardSource:
    """A Ray Data datasource: one read task per shard.

    Without ``prepare`` it yields the scan's per-block summaries; with it, document
    rows (``id``, ``text``, ``label``, ``row``) ready to encode.
    """

    def __init__(self, plan: SourcePlan, cleaning: str, prepare: Prepare | None = None):
        self.plan, self.cleaning, self.prepare = plan, cleaning, prepare

    def datasource(self):
        import ray
        from ray.data import Datasource, ReadTask
        from ray.data.block import BlockMetadata

        # An in-memory table (the packaged corpus) goes to the object store once; the
        # read tasks carry its reference, not the table (Ray warns on large read functions).
        shards = tuple(replace(s, table=ray.put(s.table)) if s.table is not None else s for s in self.plan.shards)
        outer = ShardSource(replace(self.plan, shards=shards), self.cleaning, self.prepare)

        class _Source(Datasource):
            def estimate_inmemory_data_size(self):
                return None

            def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
                tasks = []
                for i, shard in enumerate(outer.plan.shards):
                    if outer.prepare is not None and not outer.prepare.wants(i):
                        continue
                    meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                         input_files=(shard.path,) if shard.path else None)
                    tasks.append(ReadTask(lambda i=i: outer.read(i), meta))
                return tasks

            def get_name(self):
                return "CorpusShards"

        return _Source()

    def read(self, i: int):
        shard = self.plan.shards[i]
        if shard.table is not None:
            import ray

            if isinstance(shard.table, ray.ObjectRef):  # put there by datasource()
                shard = replace(shard, table=ray.get(shard.table))
        for block in read_shard(shard, self.plan.text_column, self.plan.label_column,
                                key_column=self.plan.key_column):
            if self.prepare is None:
                yield summarise(block, i, self.cleaning)
            else:
                out = self.prepare(block, i, self.cleaning)
                if out.num_rows:
                    yield out


def read_documents(plan: SourcePlan, cleaning: str, prepare: Prepare):
    """The split's document rows as a Ray Dataset, read in parallel tasks (one per shard)
    in blocks of about BLOCK_BYTES, so even a single file feeds every encoder actor."""
    import ray

    ctx = ray.data.DataContext.get_current()
    before = ctx.target_max_block_size
    ctx.target_max_block_size = BLOCK_BYTES  # the Dataset keeps a copy of the context
    try:
        return ray.data.read_datasource(ShardSource(plan, cleaning, prepare).datasource(),
                                        override_num_blocks=len(plan.shards))
    finally:
        ctx.target_max_block_size = before


def label_vocabulary(spec, plan: SourcePlan, result: ScanResult) -> list[str] | None:
    """String labels are numbered in one vocabulary over every split of the corpus (as
    the in-memory loader numbers them, so stored labels match eval's queries): the scanned
    split's names plus those of the other splits, read label column only."""
    if result.label_names is None:
        return None
    names = set(result.label_names)
    here = spec.split or "train"
    for other in ("train", "val", "test"):
        if other == here:
            continue
        try:
            other_plan = plan_split(spec.with_split(other))
        except DataError:
            continue  # no such split
        if other_plan.label_column is None:
            continue
        for shard in other_plan.shards:
            for block in read_shard(shard, None, other_plan.label_column):
                names.update(str(v) for v in block.column("label").to_pylist() if v is not None and str(v).strip())
    return sorted(names)


def summarise(block, shard: int, cleaning: str):
    """One row: the block's shard, row count, empty-text rows, label names, and rows whose
    id (``key``, where the plan has an id column) is empty or too long."""
    import pyarrow as pa

    from dhim_ray.connectors.milvus import KEY_MAX

    texts = block.column("text").to_pylist()
    rows = block.column("row").to_numpy()
    blank = [int(rows[j]) for j, t in enumerate(texts) if t is None or not has_text(t, cleaning)]
    names: list[str] = []
    unlabelled: list[int] = []
    if "label" in block.column_names:
        label = block.column("label")
        values = label.to_pylist()
        unlabelled = [int(rows[j]) for j, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())]
        if not pa.types.is_integer(label.type):
            names = sorted({str(v) for v in values if v is not None and str(v).strip()})
    unkeyed: list[int] = []
    long_keys: list[int] = []
    if "key" in block.column_names:
        keys = block.column("key").to_pylist()
        unkeyed = [int(rows[j]) for j, v in enumerate(keys) if v is None or not v.strip()]
        long_keys = [int(rows[j]) for j, v in enumerate(keys) if v is not None and len(v) > KEY_MAX]
    return pa.table({
        "shard": [shard], "first": [int(rows[0]) if len(rows) else 0], "rows": [len(rows)],
        "blank": [blank], "names": [names], "unlabelled": [unlabelled],
        "unkeyed": pa.array([unkeyed], pa.list_(pa.int64())), "long_keys": pa.array([long_keys], pa.list_(pa.int64())),
        "string_labels": ["label" in block.column_names and not pa.types.is_integer(block.column("label").type)],
    })


def scan(plan: SourcePlan, cleaning: str) -> ScanResult:
    """Count rows per shard, find empty texts and label names, in parallel read tasks."""
    import ray

    # One block stream per shard: left to itself Ray Data cuts a lone shard's output into
    # ~200 tiny blocks, and the scheduling overhead then outweighs the work.
    ds = ray.data.read_datasource(ShardSource(plan, cleaning).datasource(), override_num_blocks=len(plan.shards))
    with task_errors():
        summaries = ds.take_all()
    shard_rows = [0] * len(plan.shards)
    result = ScanResult(shard_rows)
    blank: list[tuple[int, int]] = []
    unlabelled: list[tuple[int, int]] = []
    unkeyed: list[tuple[int, int]] = []
    long_keys: list[tuple[int, int]] = []
    names: set[str] = set()
    string_labels = False
    for s in summaries:
        shard_rows[s["shard"]] += int(s["rows"])
        blank += [(s["shard"], int(r)) for r in s["blank"]]
        unlabelled += [(s["shard"], int(r)) for r in s["unlabelled"]]
        unkeyed += [(s["shard"], int(r)) for r in s["unkeyed"]]
        long_keys += [(s["shard"], int(r)) for r in s["long_keys"]]
        names.update(s["names"])
        string_labels |= bool(s["string_labels"])
    offsets = result.offsets
    result.blank_rows = np.sort(np.asarray([offsets[i] + r for i, r in blank], dtype=np.int64))
    result.unlabelled_rows = np.sort(np.asarray([offsets[i] + r for i, r in unlabelled], dtype=np.int64))
    result.unkeyed_rows = np.sort(np.asarray([offsets[i] + r for i, r in unkeyed], dtype=np.int64))
    result.long_key_rows = np.sort(np.asarray([offsets[i] + r for i, r in long_keys], dtype=np.int64))
    result.label_names = sorted(names) if string_labels else None
    return result


def _rows(rows: np.ndarray) -> str:
    return ", ".join(str(int(r)) for r in rows[:SHOWN]) + (", ..." if len(rows) > SHOWN else "")


def check_scan(plan: SourcePlan, result: ScanResult, drop_empty: bool, limit: int | None) -> tuple[int, int]:
    """Refuse what cannot be ingested, in one line. Returns (rows to read with the limit
    applied, of which empty and dropped)."""
    n = result.n_rows if limit is None else min(limit, result.n_rows)
    blank = result.blank_rows[result.blank_rows < n]
    unlabelled = result.unlabelled_rows[result.unlabelled_rows < n]
    if n == 0:
        raise DataError(f"{plan.where} is empty: no documents to work with; check the path or split name")
    if len(unlabelled):
        raise DataError(f"{plan.where}: {len(unlabelled)} rows have no label (rows {_rows(unlabelled)}); "
                        "fill them in, or name no label column")
    unkeyed = result.unkeyed_rows[result.unkeyed_rows < n]
    if len(unkeyed):
        raise DataError(f"{plan.where}: {len(unkeyed)} rows have no id in column {plan.key_column!r} "
                        f"(rows {_rows(unkeyed)}); fill them in, or drop --id-column")
    long_keys = result.long_key_rows[result.long_key_rows < n]
    if len(long_keys):
        from dhim_ray.connectors.milvus import KEY_MAX

        raise DataError(f"{plan.where}: {len(long_keys)} ids in column {plan.key_column!r} are longer than "
                        f"{KEY_MAX} characters (rows {_rows(long_keys)}); shorten them, or drop --id-column")
    if len(blank) and not drop_empty:
        raise DataError(f"{plan.where}: {len(blank)} of {n} rows have empty or non-string text "
                        f"(rows {_rows(blank)}); fix the data or pass --drop-empty to skip them")
    if len(blank) == n:
        raise DataError(f"{plan.where}: every row has empty text; nothing left to use")
    if len(blank):
        logger.warning("%s: dropping %d of %d rows with empty text (rows %s)", plan.where, len(blank), n,
                       _rows(blank))
    return n, len(blank)


@dataclass(frozen=True)
class Prepare:
    """Turns a shard's block into document rows: split-wide row numbers, ids, numbered
    labels (and their names, as label_name, where the source names them: string labels,
    or ``names_of_numbers``), the documents' own ids (key) where the plan has them; rows past ``limit`` and (with drop_empty) empty texts left out."""

    source: str
    offsets: tuple[int, ...]
    limit: int  # rows 0..limit-1 of the split
    label_names: tuple[str, ...] | None  # the vocabulary of string labels
    drop_empty: bool
    names_of_numbers: tuple[str, ...] | None = None  # names of integer labels (SourcePlan.label_names)

    def wants(self, shard: int) -> bool:
        return self.offsets[shard] < self.limit

    def __call__(self, block, shard: int, cleaning: str):
        import pyarrow as pa

        from dhim_ray.connectors.milvus import document_ids

        rows = block.column("row").to_numpy() + self.offsets[shard]
        keep = rows < self.limit
        texts = block.column("text").to_pylist()
        if self.drop_empty:
            keep &= np.fromiter((t is not None and has_text(t, cleaning) for t in texts), bool, len(texts))
        idx = np.flatnonzero(keep)
        rows = rows[idx]
        if "source_row" in block.column_names:
            rows = block.column("source_row").to_numpy()[idx].astype(np.int64)
        names = None
        if "label" in block.column_names:
            values = block.column("label").take(pa.array(idx)).to_pylist()
            if self.label_names is not None:
                index = {n: i for i, n in enumerate(self.label_names)}
                names = [str(v) for v in values]
                labels = np.asarray([index[n] for n in names], dtype=np.int64)
            else:
                labels = np.asarray(values, dtype=np.int64)
                if self.names_of_numbers is not None:
                    known = len(self.names_of_numbers)
                    names = [self.names_of_numbers[v] if 0 <= v < known else "" for v in labels.tolist()]
        else:
            labels = np.full(len(idx), -1, dtype=np.int64)
        return pa.table({
            "id": document_ids(self.source, rows),
            "text": pa.array([texts[i] for i in idx], pa.string()),
            "label": labels,
            "row": rows,
            **({"label_name": pa.array(names, pa.string())} if names is not None else {}),
            **({"key": block.column("key").take(pa.array(idx))} if "key" in block.column_names else {}),
        })
