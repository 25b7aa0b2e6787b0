"""Where an ingest's rows go, from the first check to the verified count: ``CodeSink``.
``check`` (before the scan: width, model, fields, text index), ``start`` (create or check the
collection, refuse another source's ids, mark the ledger ``writing``), the writes through one
row builder (``write_from`` on the driver for milvus-lite, ``write`` in Ray's write tasks on a
server), ``complete`` (delete stale rows, verify the count, mark ``verified``, point the alias)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray.data import Datasink
from ray.data.block import BlockAccessor

from dhim_ray.connectors import ledger
from dhim_ray.connectors.connection import mask_uri
from dhim_ray.connectors.milvus import CodeCollection, CollectionInfo, IndexSpec, MilvusTarget, text_index_support
from dhim_ray.connectors.rows import Columns, code_rows
from dhim_ray.errors import ConfigError, StoreError

logger = logging.getLogger(__name__)

BATCH_ROWS = 2000
#: Codes past which a milvus-lite collection is better served by a Milvus server (bench/store.py).
LITE_ADVISED_CODES = 10_000_000
#: Documents past which milvus-lite's own BM25 index (a collection made before the words were kept
#: beside the file) writes too slowly (bench million upsert).
LITE_TEXT_ADVISED_DOCS = 1_000_000
#: Documents past which a process opening a milvus-lite file waits over 30 s for it to load the
#: collection, and an FTS5 query over common words takes seconds (BENCHMARKS.md, million-upsert);
#: half as many in a collection made before its document's fields were kept in one JSON field.
LITE_OPEN_ADVISED_DOCS = 5_000_000


@dataclass(frozen=True)
class WriteStats:
    """What one write task did: rows upserted, by which process, and when."""

    rows: int
    writer: str  # host:pid of the writing process
    started: float  # wall clock (time.time), for telling parallel writes apart
    finished: float
    stored: int = 0  # rows passed over: the collection held them as they are


def unstored(batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The rows of an encoded ``batch`` to write, and how many were passed over: rows marked
    ``stored`` (jobs/read_tasks.py: the collection holds them as they are) were not encoded."""
    stored = batch.pop("stored", None)
    if stored is None or not stored.any():
        return batch, 0
    return {name: values[~stored] for name, values in batch.items()}, int(stored.sum())


def max_concurrent(stats: list[WriteStats]) -> int:
    """The largest number of write tasks that were running at the same moment."""
    events = sorted([(s.started, 1) for s in stats] + [(s.finished, -1) for s in stats])  # ends before starts
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@dataclass(frozen=True)
class CollectionSpec:
    """What the ingest's collection keeps (CodeCollection.check / ensure take these)."""

    n_bits: int
    model: str
    model_dir: str = ""
    index: IndexSpec = field(default_factory=IndexSpec)
    overwrite: bool = False
    keys: bool = False  # rows keep their documents' own ids


class CodeSink(Datasink[WriteStats]):
    """Upserts an ingest's rows into ``target``'s collection and owns that collection's
    lifecycle (the module's docstring); ``info``: the collection's fields, set by ``start``."""

    def __init__(self, target: MilvusTarget, n_bits: int, source: str):
        self.target, self.n_bits, self.source = target, n_bits, source
        self.rows_written = 0
        self.new_rows = False  # milvus-lite, and the collection held none of this source's rows: insert
        self.held = self.source_held = 0  # milvus-lite: the rows, and this source's, held when the ingest began
        self.rows_unchanged = 0  # rows a rerun found stored as they are (an interrupted run wrote them)
        self.stats: list[WriteStats] = []
        self.info: CollectionInfo | None = None
        #: this source's rows held, as (first id, last id, a Ray reference to their sorted ids and digests)
        self.stored: list[tuple[int, int, Any]] = []
        self._session: MilvusTarget | None = None
        self._collection: CodeCollection | None = None  # milvus-lite: open from check to the last write

    # ---- 1, 2: before any row -------------------------------------------------------------
    def _open(self) -> CodeCollection:
        if self._collection is None:
            self._session = self.target.open()
            self._collection = self._session.__enter__()
        return self._collection

    def close(self) -> None:
        if self._collection is not None:
            session, self._session, self._collection = self._session, None, None
            session.__exit__(None, None, None)

    def check(self, spec: CollectionSpec, columns: Iterable[str], text_index: bool | None, new_file: bool) -> bool:
        """Refuse an existing collection that cannot take these codes; returns whether the
        collection keeps a text index (``text_index``: as asked, None for the default)."""
        if new_file:  # a new milvus-lite file keeps one; it is created by ``start``
            return True if text_index is None else text_index
        collection = self._open()
        existing = collection.check(spec.n_bits, spec.model, spec.overwrite, keys=spec.keys,
                                    columns={name: (None, 0) for name in columns},
                                    text_index=text_index, writing=True)
        if existing is not None and not spec.overwrite:
            return existing.text_index
        why_not = text_index_support(collection.client, self.target.uri, collection.timeout)
        if why_not is None:
            return True if text_index is None else text_index
        if text_index:
            raise ConfigError(f"text_index=True: {mask_uri(self.target.uri)} cannot keep one ({why_not}); drop "
                              "text_index=True to keep codes only, or ingest into Milvus 2.5 or later", field="text_index")
        if text_index is None:
            logger.warning("no text index: %s; %s keeps codes only (search by codes)", why_not, collection.name)
        return False

    def start(self, spec: CollectionSpec, columns: dict[str, tuple[str, int]], text_index: bool,
              first_ids: np.ndarray) -> CollectionInfo:
        """Create the collection (or check the existing one against the scan's ``columns``),
        refuse ``first_ids`` where they hold another source's rows, and mark it ``writing``."""
        collection = self._open()
        info = collection.ensure(spec.n_bits, spec.model, spec.index, spec.overwrite, keys=spec.keys, columns=columns,
                                 model_dir=spec.model_dir, text_index=text_index)
        if info.text_store == "file":  # a new generation of its words, rebuilt where not in step with the rows
            collection.renew_words()
        collection.refuse_foreign_rows(first_ids, self.source)  # ids carry a hash of the source
        if not spec.keys:
            collection.refuse_dropping_keys(info, self.source)
        # milvus-lite's upsert slows as the collection grows and its insert does not (bench million
        # upsert): new rows are inserted, a rerun writes only the rows missing or changed. A server's
        # write tasks may be retried, and a retried insert would write a row twice: they upsert.
        if self.target.lite:  # counted once: the file's writer is this process until ``complete``
            self.held, self.source_held = collection.count(), collection.count_source(self.source)
        self.new_rows = self.target.lite and self.source_held == 0
        if info.digests and (self.source_held or not self.target.lite):  # a rerun encodes only what changed
            import ray

            held = 0  # each part goes to Ray's object store as it is read: the driver's memory stays flat
            for ids, digests in collection.digests(self.source):
                self.stored.append((int(ids[0]), int(ids[-1]), ray.put((ids, digests))))
                held += len(ids)
            if held:
                logger.info("%s holds %s rows of %s: those read as they were stored are not encoded again",
                            info.name, f"{held:,}", self.source)
        ledger.mark(collection.client, info.name, ledger.WRITING, self.source, timeout=collection.timeout)
        self.info = info
        if not self.target.lite:
            self.close()  # a server's rows are written by Ray tasks, each on a client of its own
        return info

    # ---- 3: the rows ------------------------------------------------------------------------
    def write_from(self, ds, total: int, progress: bool, batch_size: int) -> int:
        """milvus-lite takes one process per file: the driver writes what the actors encode
        (inserts where no earlier run wrote this source's rows; else the rows not stored as they are)."""
        from tqdm.auto import tqdm

        collection = self._open()
        after = self.held - self.source_held + total
        if self.info.text_store == "milvus" and after > LITE_TEXT_ADVISED_DOCS:
            logger.warning("%s will hold %s documents in milvus-lite with Milvus' own text index, whose writes slow "
                           "as it grows and which it rebuilds on every open; past %s, re-ingest it into a new "
                           "collection (its words are then kept beside the file) or a Milvus server "
                           "(docs/ingest-and-search.md, 'How big')", collection.name, f"{after:,}",
                           f"{LITE_TEXT_ADVISED_DOCS:,}")
        elif after > (advised := LITE_OPEN_ADVISED_DOCS // (1 if self.info.in_doc else 2)):
            logger.warning("%s will hold %s documents in milvus-lite: past %s, each process that opens the file "
                           "waits over 30 s while it loads the codes, and a text query takes seconds; search it "
                           "through dhim-ray serve (opened once) or a Milvus server (docs/ingest-and-search.md, "
                           "'How big')", collection.name, f"{after:,}", f"{advised:,}")
        batches = ds.iter_batches(batch_size=batch_size, batch_format="numpy")
        with tqdm(total=total, desc=f"ingest {collection.name}", unit="doc", disable=not progress) as bar:
            if self.new_rows:  # every row is new: inserted, the next batch's words written meanwhile
                for written in collection.insert_each(self._rows(batch)[0] for batch in batches):
                    self.rows_written += written
                    bar.update(written)
                return self.rows_written
            for batch in batches:  # a rerun: the rows not stored as they are
                written, passed = self._put(collection, batch)
                self.rows_written += written
                self.rows_unchanged += passed
                bar.update(written + passed)
        return self.rows_written  # the session stays open for ``complete``: reopened, a big file loads again

    def write(self, blocks: Iterable, ctx) -> WriteStats:
        """A Ray write task (a Milvus server): its blocks upserted on a client of its own."""
        if self.target.lite:
            raise ConfigError(f"uri={self.target.uri}: write tasks write from many processes but a milvus-lite file "
                              "takes one; write from the driver (CodeSink.write_from) or use a Milvus server", field="uri")
        started, written, passed = time.time(), 0, 0
        with self.target.open(create=False) as collection:
            for block in blocks:
                batch = BlockAccessor.for_block(block).to_batch_format("numpy")
                for start in range(0, len(batch["id"]), BATCH_ROWS):
                    wrote, stored = self._put(collection, {name: values[start : start + BATCH_ROWS]
                                                           for name, values in batch.items()})
                    written, passed = written + wrote, passed + stored
        return WriteStats(written, f"{socket.gethostname()}:{os.getpid()}", started, time.time(), passed)

    def _rows(self, batch: dict[str, np.ndarray]) -> tuple[Columns, int]:
        """An encoded batch's rows to write, as an upsert takes them, and how many it passed over as stored."""
        batch, stored = unstored(batch)
        return code_rows(batch, self.n_bits, self.source, self.info), stored

    def _put(self, collection: CodeCollection, batch: dict[str, np.ndarray]) -> tuple[int, int]:
        """One encoded batch into ``collection``: (rows written, rows passed over as stored)."""
        rows, stored = self._rows(batch)
        if not self.target.lite:
            return collection.upsert(rows), stored
        written, unchanged = collection.upsert_changed(rows)
        return written, unchanged + stored

    def on_write_complete(self, write_result) -> None:
        self.stats = list(write_result.write_returns)
        self.rows_written = sum(s.rows for s in self.stats)
        self.rows_unchanged = sum(s.stored for s in self.stats)

    @property
    def writers(self) -> int:
        """How many distinct processes wrote (1: the driver, on milvus-lite)."""
        return len({s.writer for s in self.stats}) or 1

    @property
    def max_parallel_writes(self) -> int:
        """The most write tasks that ran at the same moment."""
        return max_concurrent(self.stats) or 1

    def get_name(self) -> str:
        return "Milvus"

    def __getstate__(self) -> dict[str, Any]:  # write tasks get plain config, never an open client
        return {**self.__dict__, "_session": None, "_collection": None, "stored": None}

    # ---- 4: verified ----------------------------------------------------------------------
    def complete(self, n_documents: int, last_row: int, dropped_ids: np.ndarray | None,
                 alias: str | None) -> dict[str, Any]:
        """Verify the ingest: delete this source's rows past ``last_row`` and ``dropped_ids``
        (None: a part of the source was ingested, later rows are kept), count the source's rows
        up to ``last_row``, raise StoreError where they are not ``n_documents``, mark the ledger
        ``verified`` and point ``alias``. Returns the counts for IngestResult."""
        collection = self._open()  # milvus-lite: the session that wrote the rows
        if dropped_ids is not None:  # the whole source: the rows it no longer has go, the rest are rows <= last
            removed, of_source = collection.delete_stale_rows(self.source, last_row, dropped_ids)
            stored = of_source
            if removed:
                logger.info("removed %d rows of %s that an earlier ingest wrote and the source no longer has",
                            removed, self.source)
        else:  # a part: later rows of an earlier, larger ingest stay
            removed, stored = 0, collection.count_source(self.source, last_row)
            of_source = collection.count_source(self.source)
        if stored != n_documents:
            raise StoreError(
                f"collection {self.target.collection!r} holds {stored} rows of {self.source} up to row {last_row} "
                f"but {n_documents} were ingested; rerun the same ingest to repair it")
        out = {"stale_rows_removed": removed, "rows_in_collection": stored, "rows_of_source": of_source}
        # the name the ledger knows it by: the collection itself, where the target names an alias of it
        ledger.mark(collection.client, self.info.name, ledger.VERIFIED, self.source, stored,
                    timeout=collection.timeout)
        if self.target.lite and (total := self.held - self.source_held + of_source) > LITE_ADVISED_CODES:
            logger.warning("%s holds %s codes in milvus-lite, which scans them all for each query, one query at "
                           "a time (about 0.1 s at 10 million on 2 cores); past %s a Milvus server with "
                           "BIN_IVF_FLAT answers in milliseconds (docs/ingest-and-search.md, 'How big')",
                           self.target.collection, f"{total:,}", f"{LITE_ADVISED_CODES:,}")
        if alias is not None:  # verified: now the applications move
            out["alias"], out["alias_was"] = alias, collection.point_alias(alias) or ""
            logger.info("alias %s now points at %s%s", alias, self.target.collection,
                        f" (was {out['alias_was']})" if out["alias_was"] else "")
        return out
