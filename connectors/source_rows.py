"""The rows one source wrote into a code collection, as an ingest reads and checks them:
``SourceRows`` gives ``CodeCollection`` its per-source counts, digests, stale-row deletes and
the refusals that keep one source from writing over another's rows (pymilvus; never torch)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from dhim_ray.connectors.rows import DIGEST_FIELD, KEY_FIELD, SOURCE_MAX, id_range
from dhim_ray.connectors.schema import CollectionInfo, _failed, quote
from dhim_ray.errors import CollectionMismatchError, StoreError

logger = logging.getLogger(__name__)


class SourceRows:
    """``CodeCollection``'s reads and checks of one source's rows."""

    def refuse_foreign_rows(self, ids: Sequence[int], source: str) -> None:
        """Raise CollectionMismatchError if any of ``ids`` already holds a row of another
        source: an upsert would overwrite it."""
        if len(ids) == 0:
            return
        foreign = sorted({r["source"] for r in self.get(ids, ["source"]).values() if r["source"] != source})
        if foreign:
            raise CollectionMismatchError(
                f"collection {self.name!r}: the ids of {source} already hold rows of {foreign[0]}; refusing to "
                "overwrite them: ingest into another collection"
            )

    def refuse_dropping_keys(self, info: CollectionInfo, source: str) -> None:
        """An ingest without an id column upserts every row with an empty key: where this
        source's rows already hold their documents' own ids (an earlier ingest with one),
        that would erase them, so it is refused, naming the way to keep them."""
        rows = self.client.query(self.name, filter=f"{self._at('source')} == {quote(source)} and {self._at(KEY_FIELD)} "
                                 '!= ""', output_fields=["id"], limit=1, timeout=self.timeout)
        if rows:
            raise CollectionMismatchError(
                f"collection {self.name!r}: the rows of {source} hold their documents' own ids (an ingest with an "
                "id column); ingesting without one would erase them: pass the same id column again"
            )

    def delete_stale_rows(self, source: str, last_row: int, dropped_ids: Sequence[int] = ()) -> tuple[int, int]:
        """After a whole source was ingested: delete its rows that the source no longer has
        (row numbers past ``last_row``, left by an earlier ingest of a longer version) and
        the rows this ingest left out (``dropped_ids``: empty texts skipped, which an
        earlier version may have filled). Returns how many rows went and how many of the
        source's are left; other sources' rows are never touched."""
        before = self.count_source(source)
        stale = f"{self._at('source')} == {quote(source)} and row > {int(last_row)}"
        try:
            ours = [i for i, r in self.get(dropped_ids, ["source"]).items() if r["source"] == source]
            if self._words_kept():
                self.words.delete(self.name, [*self._ids_where(stale), *ours])
            self.client.delete(self.name, filter=stale, timeout=self.timeout)
            for start in range(0, len(ours), 1000):
                self.client.delete(self.name, ids=ours[start : start + 1000], timeout=self.timeout)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(_failed(f"collection {self.name!r}: deleting rows the source no longer has failed",
                                     exc)) from exc
        left = self.count_source(source)
        return before - left, left

    def count_source(self, source: str, max_row: int | None = None) -> int:
        """Rows of one source (``row <= max_row`` only, when given), exact (strong consistency)."""
        self._flush()
        expr = f"{self._at('source')} == {quote(source)}" + (
            f" and row <= {int(max_row)}" if max_row is not None else "")
        res = self.client.query(self.name, filter=expr, output_fields=["count(*)"], consistency_level="Strong",
                                timeout=self.timeout)
        return int(res[0]["count(*)"])

    def digests(self, source: str, batch_size: int = 16384) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The ids and digests of ``source``'s rows that carry one (a collection with the digest
        field), ``batch_size`` rows at a time, each part sorted by id: what a rerun of its ingest
        need not encode again, read without holding the whole collection's (16 bytes a row). The
        rows are paged through by their ids' range (``document_ids``), the source checked here: a
        filter on the source would have milvus-lite read every row's document again for each page."""
        self._flush()
        first, last = id_range(source)
        for page in self._pages(f"id >= {first} and id <= {last}", self._asked(["id", "source", DIGEST_FIELD]),
                                "reading the rows' digests", batch_size):
            rows = [r for r in (self._read(r, ["source", DIGEST_FIELD]) for r in page)
                    if r[DIGEST_FIELD] and r["source"] == source[:SOURCE_MAX]]
            if rows:
                ids = np.fromiter((r["id"] for r in rows), np.int64, len(rows))
                digests = np.fromiter((r[DIGEST_FIELD] for r in rows), np.int64, len(rows))
                order = np.argsort(ids, kind="stable")
                yield ids[order], digests[order]

    def _pages(self, expr: str, fields: list[str], what: str, batch_size: int = 16384) -> Iterator[list[dict]]:
        """The rows where ``expr`` holds, a page of ``batch_size`` at a time; a failure is a StoreError."""
        try:
            it = self.client.query_iterator(self.name, batch_size=batch_size, filter=expr, output_fields=fields,
                                            timeout=self.timeout)
            while page := it.next():
                yield page
            it.close()
        except Exception as exc:
            raise StoreError(_failed(f"collection {self.name!r}: {what} failed", exc)) from exc
