"""Ray Data reads a corpus split itself, shard by shard, in two passes of parallel read tasks:
``scan`` counts each shard's rows, finds empty texts and collects label names (one small summary
per block reaches the driver; bad input is refused here), and ``read_documents`` yields the rows
with split-wide row numbers, ids, numbered labels and digests, marking those a rerun finds stored."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

import numpy as np
import ray
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from dhim_ray.connectors.rows import DIGEST_FIELD, KEY_MAX, document_ids, row_digests
from dhim_ray.corpus import rules
from dhim_ray.corpus.columns import PREFIX, convert
from dhim_ray.corpus.rules import ScanResult
from dhim_ray.corpus.sources import SourcePlan, read_shard
from dhim_ray.corpus.text import has_text

from .ray_env import task_errors

logger = logging.getLogger(__name__)
# Read blocks of ~256 KiB of text (several hundred documents): a block is the unit an
# encoder actor takes, so even a few thousand documents from one file keep every actor
# busy (a real encoder needs seconds per block); at 1M documents that is ~1,500 blocks.
BLOCK_BYTES = 256 << 10
#: A read task parses and numbers rows, light beside encoding, and asks for no CPU: reads must
#: run whatever the encoding actors hold. After a node dies its actors restart on the nodes left
#: and can fill them; reads that needed a CPU then never ran and the ingest waited forever
#: (found by killing a node of the multi-node test cluster mid-ingest).
READ_TASK = {"num_cpus": 0}
#: ... so Ray would start every shard's read at once, each in a worker process of its own (at
#: 10M documents most of the machine's memory): at most as many run together as the cluster has
#: CPUs, and at least this many. Each is a process that imports Ray Data and the project first:
#: 4 on 2 cores made a 200,000-document ingest 10-25% slower than 2 (bench.million pipeline).
MIN_READ_TASKS = 2


def read_task(shards: int) -> dict:
    """The read tasks' Ray arguments for ``shards`` shards: no CPU, and a bounded number at once
    (never more than there are shards: Ray warns of a limit it cannot reach)."""

    cap = max(MIN_READ_TASKS, int(ray.cluster_resources().get("CPU", 0)))
    return {**READ_TASK, "concurrency": max(1, min(shards, cap))}


def _arrow_types() -> dict:
    import pyarrow as pa

    return {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string()}


class ShardSource(Datasource):
    """A Ray Data datasource, one read task per shard: without ``prepare`` the scan's per-block
    summaries, with it document rows (``id``, ``text``, ``label``, ``row``) ready to encode. An
    in-memory table (the packaged corpus) goes to the object store once, and the read tasks carry
    its reference, not the table (Ray warns on large read functions)."""

    def __init__(self, plan: SourcePlan, cleaning: str, prepare: Prepare | None = None):
        super().__init__()
        shards = tuple(replace(s, table=ray.put(s.table)) if s.table is not None else s for s in plan.shards)
        self.plan, self.cleaning, self.prepare = replace(plan, shards=shards), cleaning, prepare

    def estimate_inmemory_data_size(self):
        return None

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
        tasks = []
        for i, shard in enumerate(self.plan.shards):
            if self.prepare is not None and not self.prepare.wants(i):
                continue
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                 input_files=(shard.path,) if shard.path else None)
            tasks.append(ReadTask(lambda i=i: self.read(i), meta))
        return tasks

    def get_name(self):
        return "CorpusShards"

    def read(self, i: int):
        shard = self.plan.shards[i]
        if isinstance(shard.table, ray.ObjectRef):
            shard = replace(shard, table=ray.get(shard.table))
        for block in read_shard(shard, self.plan.text_column, self.plan.label_column,
                                key_column=self.plan.key_column, kept=self.plan.kept_columns):
            if self.prepare is None:
                yield summarise(block, i, self.cleaning)
            else:
                out = self.prepare(block, i, self.cleaning)
                if out.num_rows:
                    yield out


def read_documents(plan: SourcePlan, cleaning: str, prepare: Prepare):
    """The split's document rows as a Ray Dataset, read in parallel tasks (one per shard)
    in blocks of about BLOCK_BYTES, so even a single file feeds every encoder actor."""

    ctx = ray.data.DataContext.get_current()
    before = ctx.target_max_block_size
    ctx.target_max_block_size = BLOCK_BYTES  # the Dataset keeps a copy of the context
    try:
        return ray.data.read_datasource(ShardSource(plan, cleaning, prepare),
                                        override_num_blocks=len(plan.shards), **read_task(len(plan.shards)))
    finally:
        ctx.target_max_block_size = before


def summarise(block, shard: int, cleaning: str):
    """A block's findings (dhim_ray.corpus.rules.findings) as a one-row table."""
    import pyarrow as pa

    found = rules.findings(block, cleaning, KEY_MAX)
    rows = pa.list_(pa.int64())
    return pa.table({"shard": [shard], **{k: pa.array([found[k]], rows) for k in
                                          ("blank", "unlabelled", "unkeyed", "long_keys")},
                     "rows": [found["rows"]], "names": pa.array([found["names"]], pa.list_(pa.string())),
                     "string_labels": [found["string_labels"]], "columns": [json.dumps(found["columns"])]})


def check_first_block(plan: SourcePlan) -> None:
    """The first block of the first shard read here, before Ray starts: a source that cannot be
    parsed there is refused without waiting for Ray, as training refuses it (the scan reads the rest)."""
    next(read_shard(plan.shards[0], plan.text_column, plan.label_column, key_column=plan.key_column,
                    kept=plan.kept_columns), None)


def scan(plan: SourcePlan, cleaning: str) -> ScanResult:
    """Count rows per shard, find empty texts and label names, in parallel read tasks."""

    # One block stream per shard: left to itself Ray Data cuts a lone shard's output into
    # ~200 tiny blocks, and the scheduling overhead then outweighs the work.
    ds = ray.data.read_datasource(ShardSource(plan, cleaning), override_num_blocks=len(plan.shards),
                                  **read_task(len(plan.shards)))
    with task_errors():
        summaries = ds.take_all()
    return ScanResult.collect(len(plan.shards), ((int(s["shard"]), {**s, "columns": json.loads(s["columns"])})
                                                 for s in summaries))


def check_scan(plan: SourcePlan, result: ScanResult, drop_empty: bool, limit: int | None) -> tuple[int, int]:
    """The input rules (dhim_ray.corpus.rules.check) on a scanned split: refuse it in one
    line, or return (rows to read with the limit applied, of which empty and dropped)."""
    return rules.check(plan.where, result, drop_empty, limit, plan.key_column, KEY_MAX)


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
    kept: tuple[tuple[str, str], ...] = ()  # (name, kind) of each kept column (the scan's kinds)
    stored: tuple | None = None  # the rows already stored: (first id, last id, Ray reference to (ids, digests)) parts

    def wants(self, shard: int) -> bool:
        return self.offsets[shard] < self.limit

    def __call__(self, block, shard: int, cleaning: str):
        import pyarrow as pa

        rows = block.column("row").to_numpy() + self.offsets[shard]
        texts = block.column("text").to_pylist()
        keep = rows < self.limit
        if self.drop_empty:
            keep &= np.fromiter((isinstance(t, str) and has_text(t, cleaning) for t in texts), bool, len(texts))
        idx = np.flatnonzero(keep)
        rows = rows[idx]
        if "source_row" in block.column_names:
            rows = block.column("source_row").to_numpy()[idx].astype(np.int64)
        names = None
        if "label" in block.column_names:
            labels, names = rules.number_labels(block.column("label").take(pa.array(idx)).to_pylist(),
                                                self.label_names, self.names_of_numbers)
        else:
            labels = np.full(len(idx), -1, dtype=np.int64)
        table = pa.table({
            "id": document_ids(self.source, rows),
            "text": pa.array([texts[i] for i in idx], pa.string()),
            "label": labels,
            "row": rows,
            **({"label_name": pa.array(names, pa.string())} if names is not None else {}),
            **({"key": block.column("key").take(pa.array(idx))} if "key" in block.column_names else {}),
            **{PREFIX + name: pa.array(convert(block.column(PREFIX + name).take(pa.array(idx)).to_pylist(), kind),
                                       _arrow_types()[kind]) for name, kind in self.kept},
        })
        digests = row_digests(table.drop_columns(["id", "row"]).to_pydict())
        return table.append_column(DIGEST_FIELD, pa.array(digests)).append_column(
            "stored", pa.array(self._stored(table.column("id").to_numpy(), digests)))

    def _stored(self, ids: np.ndarray, digests: np.ndarray) -> np.ndarray:
        """Which rows the collection holds with these digests."""
        found = np.zeros(len(ids), dtype=bool)
        if self.stored is None or not len(ids):
            return found

        low, high = int(ids.min()), int(ids.max())
        for have_ids, have in ray.get([ref for first, last, ref in self.stored if first <= high and last >= low]):
            at = np.minimum(np.searchsorted(have_ids, ids), len(have_ids) - 1)  # each part sorted by id, never empty
            found |= (have_ids[at] == ids) & (have[at] == digests)
        return found
