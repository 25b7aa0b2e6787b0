"""``MilvusDatasink``: a Ray Datasink writing any dataset with ``id`` and ``code`` columns into a Milvus
code collection. Ray calls its hooks on a server (``on_write_start``: make or check the collection;
``write``: an upsert per task, so a retry writes nothing twice; ``on_write_complete``: verify, point
the alias, return the figures); on a milvus-lite file (one process) ``write_dataset`` calls them:

    >>> write_dataset(ray.data.from_items(rows), MilvusDatasink(MilvusTarget("codes.db", "docs_64"), 64))"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.data import Datasink
from ray.data.block import BlockAccessor
from ray.data.datasource.datasink import WriteResult

from dhim_ray.connectors import ledger
from dhim_ray.connectors.connection import mask_uri
from dhim_ray.connectors.milvus import CodeCollection, CollectionInfo, IndexSpec, MilvusTarget
from dhim_ray.connectors.rows import Columns, code_rows
from dhim_ray.connectors.schema import text_index_support
from dhim_ray.errors import ConfigError, StoreError

logger = logging.getLogger(__name__)

BATCH_ROWS = 2000
#: Codes past which a milvus-lite collection is better served by a Milvus server (bench/store.py).
LITE_ADVISED_CODES = 10_000_000
#: Documents past which a process opening a milvus-lite file waits over 30 s for it to load the
#: collection (BENCHMARKS.md, million-upsert).
LITE_OPEN_ADVISED_DOCS = 5_000_000


@dataclass(frozen=True)
class Expected:
    """What a verified write leaves: ``n_documents`` rows of the source up to row id ``last_row``;
    ``dropped_ids`` (None: a part of the source was written, later rows stay) the ids that go."""

    n_documents: int
    last_row: int
    dropped_ids: np.ndarray | None = None


def unstored(batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The rows of an encoded ``batch`` to write, and how many were passed over: rows marked
    ``stored`` (jobs/read_tasks.py: the collection holds them as they are) were not encoded."""
    stored = batch.pop("stored", None)
    if stored is None or not stored.any():
        return batch, 0
    return {name: values[~stored] for name, values in batch.items()}, int(stored.sum())


class MilvusDatasink(Datasink[dict]):
    """Writes codes of ``n_bits`` (and ``model``, stamped on the collection) into ``target``, as rows
    of ``source``; the keywords say what the collection keeps (``columns``: name -> (kind, longest
    string); ``text_index``; ``keys``: the rows carry their documents' own ids), how to index it,
    ``overwrite``, the ids whose rows must be ``source``'s (``first_ids``), what the written
    collection must hold (``expected``: else the rows of ``source`` are counted) and an ``alias``."""

    def __init__(self, target: MilvusTarget, n_bits: int, model: str = "", source: str = "rows", *,
                 model_dir: str = "", index: IndexSpec | None = None, overwrite: bool = False,
                 columns: dict[str, tuple[str, int]] | None = None, text_index: bool = False, keys: bool = False,
                 first_ids: Sequence[int] = (), expected: Expected | None = None, alias: str | None = None):
        self.target, self.n_bits, self.model, self.source = target, n_bits, model, source
        self.model_dir, self.index, self.overwrite, self.alias = model_dir, index or IndexSpec(), overwrite, alias
        self.columns, self.text_index, self.keys = columns or {}, text_index, keys
        self.first_ids, self.expected = np.asarray(first_ids, np.int64), expected
        self.info: CollectionInfo | None = None
        self.held = self.source_held = 0  # milvus-lite: the rows, and this source's, held when the write began
        self.figures: dict[str, Any] = {}  # what on_write_complete found
        self._session: Any = None
        self._collection: CodeCollection | None = None  # milvus-lite: open from the first check to the last write

    # ---- the driver's checks before a row is read --------------------------------------------
    def collection(self) -> CodeCollection:
        """The target's collection on the driver's client (one session per milvus-lite file)."""
        if self._collection is None:
            self._session = self.target.open()
            self._collection = self._session.__enter__()
        return self._collection

    def close(self) -> None:
        if self._collection is not None:
            session, self._session, self._collection = self._session, None, None
            session.__exit__(None, None, None)

    def check(self, columns: Iterable[str], text_index: bool | None, new_file: bool) -> CollectionInfo | None:
        """Refuse an existing collection that cannot take these codes, ``columns`` or ``text_index``
        (None: kept where the Milvus can); sets ``text_index``, returns the collection's info."""
        if new_file:  # a new milvus-lite file keeps one; it is created by ``on_write_start``
            self.text_index = True if text_index is None else text_index
            return None
        collection = self.collection()
        existing = collection.check(self.n_bits, self.model, self.overwrite,
                                    columns={name: (None, 0) for name in columns}, text_index=text_index)
        if existing is not None and not self.overwrite:
            self.text_index = existing.text_index
            return existing
        why_not = text_index_support(collection.client, self.target.uri, collection.timeout)
        self.text_index = (True if text_index is None else text_index) if why_not is None else False
        if why_not is not None and text_index:
            raise ConfigError(f"text_index=True: {mask_uri(self.target.uri)} cannot keep one ({why_not}); drop "
                              "text_index=True to keep codes only, or ingest into Milvus 2.5 or later", field="text_index")
        if why_not is not None and text_index is None:
            logger.warning("no text index: %s; %s keeps codes only (search by codes)", why_not, collection.name)
        return None

    def stored_parts(self) -> tuple[tuple[int, int, Any], ...] | None:
        """The rows of ``source`` an existing collection holds, for the read tasks (a rerun encodes only
        what changed): (first id, last id, a Ray reference to their sorted ids and digests) per part."""
        import ray

        collection, parts, held = self.collection(), [], 0
        if not self.target.lite or collection.count_source(self.source):
            for ids, digests in collection.digests(self.source):  # each part to the object store as it is read
                parts.append((int(ids[0]), int(ids[-1]), ray.put((ids, digests))))
                held += len(ids)
        if held:
            logger.info("%s holds %s rows of %s: those read as they were stored are not encoded again",
                        collection.name, f"{held:,}", self.source)
        if not self.target.lite:
            self.close()
        return tuple(parts) or None

    # ---- Ray's hooks ----------------------------------------------------------------------------
    def on_write_start(self, schema: Any = None) -> None:
        """Create the collection (or check the existing one), refuse ``first_ids`` holding another
        source's rows, and mark the ledger ``writing`` (``schema``: Ray's, of the first block; unused)."""
        collection = self.collection()
        info = collection.ensure(self.n_bits, self.model, self.index, self.overwrite, columns=self.columns,
                                 model_dir=self.model_dir, text_index=self.text_index)
        if info.text_store == "file":  # a new generation of its words, rebuilt where not in step with the rows
            collection.renew_words()
        collection.refuse_foreign_rows(self.first_ids.tolist(), self.source)  # ids carry a hash of the source
        if not self.keys:
            collection.refuse_dropping_keys(info, self.source)
        if self.target.lite:  # counted once: the file's writer is this process until on_write_complete
            self.held, self.source_held = collection.count(), collection.count_source(self.source)
        ledger.mark(collection.client, info.name, ledger.WRITING, self.source, timeout=collection.timeout)
        self.info = info
        if not self.target.lite:
            self.close()  # a server's rows are written by Ray tasks, each on a client of its own

    def write(self, blocks: Iterable, ctx) -> dict[str, Any]:
        """A Ray write task (a Milvus server): its blocks upserted on a client of its own."""
        if self.target.lite:
            raise ConfigError(f"uri={self.target.uri}: Ray's write tasks write from many processes but a milvus-lite "
                              "file takes one; call write_dataset(ds, sink), which writes from the driver", field="uri")
        written = passed = 0
        with self.target.open(create=False) as collection:
            for block in blocks:
                batch = BlockAccessor.for_block(block).to_batch_format("numpy")
                for start in range(0, len(batch["id"]), BATCH_ROWS):
                    rows, stored = self._rows({name: values[start : start + BATCH_ROWS] for name, values in batch.items()})
                    written, passed = written + collection.upsert(rows), passed + stored
        return {"rows": written, "unchanged": passed, "writer": f"{socket.gethostname()}:{os.getpid()}"}

    def on_write_complete(self, write_result: WriteResult) -> dict[str, Any]:
        """Verify the write (the module's docstring), mark the ledger ``verified``, point the alias;
        returns (and keeps in ``figures``) the rows written, passed over, verified and removed."""
        returns = list(write_result.write_returns)
        try:
            self.figures = {"rows_written": sum(r["rows"] for r in returns),
                            "rows_unchanged": sum(r["unchanged"] for r in returns),
                            "writers": len({r["writer"] for r in returns}) or 1, **self._verify()}
        finally:
            self.close()
        return self.figures

    def on_write_failed(self, error: Exception) -> None:
        self.close()

    def get_name(self) -> str:
        return "Milvus"

    def __getstate__(self) -> dict[str, Any]:  # write tasks get plain config, never an open client
        return {**self.__dict__, "_session": None, "_collection": None, "expected": None, "first_ids": None}

    # ---- the rows ---------------------------------------------------------------------------------
    def _rows(self, batch: dict[str, np.ndarray]) -> tuple[Columns, int]:
        """An encoded batch's rows to write, as an upsert takes them, and how many it passed over as stored."""
        batch, stored = unstored(batch)
        return code_rows(batch, self.n_bits, self.source), stored

    def write_here(self, batches: Iterable[dict[str, np.ndarray]], bar: Any) -> dict[str, Any]:
        """milvus-lite: the driver writes the batches (inserts where the collection held none of the
        source's rows; else the rows not stored as they are); returns what a write task returns."""
        collection, written, passed = self.collection(), 0, 0
        if self.source_held == 0:  # every row is new: inserted, the next batch's words written meanwhile
            for count in collection.insert_each(self._rows(batch)[0] for batch in batches):
                written += count
                bar.update(count)
        else:  # a rerun: the rows not stored as they are
            for batch in batches:
                rows, stored = self._rows(batch)
                wrote, unchanged = collection.upsert_changed(rows)
                written, passed = written + wrote, passed + unchanged + stored
                bar.update(wrote + unchanged + stored)
        return {"rows": written, "unchanged": passed, "writer": f"{socket.gethostname()}:{os.getpid()}"}

    def _verify(self) -> dict[str, Any]:
        """Stale rows deleted, the source's rows counted (StoreError if not as expected), ledger marked, alias moved."""
        collection, expected = self.collection(), self.expected
        removed = 0
        if expected is not None and expected.dropped_ids is not None:  # the whole source: the rest are rows <= last
            removed, of_source = collection.delete_stale_rows(self.source, expected.last_row, expected.dropped_ids)
            stored = of_source
            if removed:
                logger.info("removed %d rows of %s that an earlier ingest wrote and the source no longer has",
                            removed, self.source)
        else:  # a part (or rows without a plan): later rows of an earlier, larger write stay
            stored = collection.count_source(self.source, None if expected is None else expected.last_row)
            of_source = stored if expected is None else collection.count_source(self.source)
        if expected is not None and stored != expected.n_documents:
            raise StoreError(f"collection {self.target.collection!r} holds {stored} rows of {self.source} up to row "
                             f"{expected.last_row} but {expected.n_documents} were ingested; rerun the same ingest to "
                             "repair it")
        out = {"stale_rows_removed": removed, "rows_in_collection": stored, "rows_of_source": of_source}
        # the name the ledger knows it by: the collection itself, where the target names an alias of it
        ledger.mark(collection.client, self.info.name, ledger.VERIFIED, self.source, stored, timeout=collection.timeout)
        if self.target.lite and (total := self.held - self.source_held + of_source) > LITE_ADVISED_CODES:
            logger.warning("%s holds %s codes in milvus-lite, which scans them all for each query, one query at "
                           "a time (about 0.1 s at 10 million on 2 cores); past %s a Milvus server with "
                           "BIN_IVF_FLAT answers in milliseconds (docs/ingest-and-search.md, 'How big')",
                           self.target.collection, f"{total:,}", f"{LITE_ADVISED_CODES:,}")
        if self.alias is not None:  # verified: now the applications move
            out["alias"], out["alias_was"] = self.alias, collection.point_alias(self.alias) or ""
            logger.info("alias %s now points at %s%s", self.alias, self.target.collection,
                        f" (was {out['alias_was']})" if out["alias_was"] else "")
        return out


def write_dataset(ds, sink: MilvusDatasink, progress: bool = False, total: int | None = None,
                  write_tasks: int = 2, batch_rows: int = 500) -> dict[str, Any]:
    """Write ``ds`` through ``sink``: Ray's write tasks (``write_tasks`` of them) on a server, the
    driver on a milvus-lite file (``batch_rows`` a write), the same hooks either way; returns
    ``on_write_complete``'s figures (``total``: the rows expected, for the progress bar)."""
    if not sink.target.lite:  # upserts wait on the network, not the CPU, and must run whatever the encoders hold
        ds.write_datasink(sink, concurrency=write_tasks, ray_remote_args={"num_cpus": 0})
        return sink.figures
    from tqdm.auto import tqdm

    sink.on_write_start()
    try:
        after = sink.held - sink.source_held + (total or 0)
        if after > LITE_OPEN_ADVISED_DOCS:
            logger.warning("%s will hold %s documents in milvus-lite: past %s, each process that opens the file "
                           "waits over 30 s while it loads the codes; search it through dhim-ray serve (opened "
                           "once) or a Milvus server (docs/ingest-and-search.md, 'How big')", sink.target.collection,
                           f"{after:,}", f"{LITE_OPEN_ADVISED_DOCS:,}")
        with tqdm(total=total, desc=f"ingest {sink.target.collection}", unit="doc", disable=not progress) as bar:
            done = sink.write_here(ds.iter_batches(batch_size=batch_rows, batch_format="numpy"), bar)
    except BaseException as exc:
        sink.on_write_failed(exc)
        raise
    return sink.on_write_complete(WriteResult(done["rows"], 0, [done]))
