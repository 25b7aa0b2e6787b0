"""A Ray Data datasink writing code rows into a Milvus server collection.

The sink holds plain config only and opens its client inside each write task (it
must pickle); the collection exists and was checked before (jobs/ingest.py does it).
``write`` upserts its blocks and returns the row count; ``on_write_complete`` totals
them. For milvus-lite (one process per file) the ingest job writes from the driver
instead.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.data import Datasink
from ray.data.block import BlockAccessor

from dhim_ray.connectors.milvus import (
    KEY_FIELD,
    LABEL_NAME_FIELD,
    MilvusTarget,
    kept_columns,
    make_rows,
)
from dhim_ray.errors import ConfigError

BATCH_ROWS = 2000


@dataclass(frozen=True)
class WriteStats:
    """What one write task did: rows upserted, by which process, and when."""

    rows: int
    writer: str  # host:pid of the writing process
    started: float  # wall clock (time.time), for telling parallel writes apart
    finished: float


def max_concurrent(stats: list[WriteStats]) -> int:
    """The largest number of write tasks that were running at the same moment."""
    events = sorted([(s.started, 1) for s in stats] + [(s.finished, -1) for s in stats])  # ends before starts
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def block_to_rows(table, n_bits: int, source: str, name_field: bool = True,
                  key_field: bool = True) -> list[dict[str, Any]]:
    """A pyarrow block with id, code (uint8 tensor), label, text, row (and label_name,
    key, vector where present) -> validated rows; ``name_field`` / ``key_field``: the
    collection has the label_name / key field (CollectionInfo.label_names / keys)."""
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    codes = np.stack(cols["code"]).astype(np.uint8) if len(cols["code"]) else np.zeros((0, n_bits // 8), np.uint8)
    labels = cols.get("label")
    vectors = np.stack(cols["vector"]) if "vector" in cols and len(cols["vector"]) else None
    signs = np.stack(cols["sign"]).astype(np.uint8) if "sign" in cols and len(cols["sign"]) else None
    return make_rows(cols["id"], codes, n_bits, labels, [str(t) for t in cols["text"]], source, cols["row"], vectors,
                     cols.get(LABEL_NAME_FIELD), name_field=name_field, keys=cols.get(KEY_FIELD),
                     key_field=key_field, signs=signs, columns=kept_columns(cols))


class MilvusDatasink(Datasink[WriteStats]):
    """Upserts rows into ``target``'s existing collection; ``name_field`` / ``key_field``: it
    has the label_name / key field (CollectionInfo.label_names / keys)."""

    def __init__(self, target: MilvusTarget, n_bits: int, source: str, name_field: bool = True,
                 key_field: bool = True):
        if target.lite:
            raise ConfigError(
                f"uri={target.uri}: MilvusDatasink writes from many processes but a milvus-lite file takes one; "
                "write from the driver (dhim-ray ingest does) or use a Milvus server"
            )
        self.target, self.n_bits, self.source = target, n_bits, source
        self.name_field, self.key_field = name_field, key_field
        self.rows_written = 0
        self.stats: list[WriteStats] = []

    def write(self, blocks: Iterable, ctx) -> WriteStats:
        started = time.time()
        written = 0
        with self.target.open(create=False) as collection:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                for start in range(0, table.num_rows, BATCH_ROWS):
                    written += collection.upsert(block_to_rows(table.slice(start, BATCH_ROWS), self.n_bits,
                                                               self.source, self.name_field, self.key_field))
        return WriteStats(written, f"{socket.gethostname()}:{os.getpid()}", started, time.time())

    def on_write_complete(self, write_result) -> None:
        self.stats = list(write_result.write_returns)
        self.rows_written = sum(s.rows for s in self.stats)

    @property
    def writers(self) -> int:
        """How many distinct processes wrote."""
        return len({s.writer for s in self.stats})

    @property
    def max_parallel_writes(self) -> int:
        """The most write tasks that ran at the same moment."""
        return max_concurrent(self.stats)

    def get_name(self) -> str:
        return "Milvus"
