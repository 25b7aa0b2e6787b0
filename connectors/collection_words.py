"""The words of a code collection (BM25 over its stored text): searched with ``search_text``,
kept in step with the rows (``words_state``, ``check_words``, ``renew_words``); ``CodeCollection``
takes these methods from ``CollectionWords`` (pymilvus + tantivy; never torch)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dhim_ray.codes import hamming
from dhim_ray.connectors import ledger
from dhim_ray.connectors.lexical import TextIndex
from dhim_ray.connectors.rows import CODE_FIELD, OUTPUT_FIELDS, TEXT_SPARSE_FIELD
from dhim_ray.connectors.schema import _ahead, check_search_k
from dhim_ray.errors import StoreError

logger = logging.getLogger(__name__)


class CollectionWords:
    """``CodeCollection``'s text index: its search and its generation beside the rows."""

    def search_text(self, texts: Sequence[str], k: int, output_fields: Iterable[str] = OUTPUT_FIELDS,
                    filter: str | None = None, batch_size: int = 100,
                    codes: np.ndarray | None = None) -> list[list[dict[str, Any]]]:
        """Top-k rows by BM25 over the stored text (a collection with a text index) for each
        query text: one list per query of {"id", "bm25" (float, higher is better), and the
        output fields}, best first (ties by id). A query that shares no term with any row finds
        nothing. ``filter`` as in ``search``. ``codes``: the queries' codes, for each hit's
        ``distance`` where the engine beside the file stores the rows' codes."""
        check_search_k(k)
        expr = self._filter(filter)
        if self._words_kept():
            self._commit_words()
            self.check_words()
            found = [self._search_words(str(t), k, list(output_fields), expr) for t in texts]
            for i, row in enumerate(found):
                for h in row:
                    code = h.pop("_code", None)
                    if codes is not None and code is not None:
                        h["distance"] = hamming(code, codes[i])
            return found
        out: list[list[dict[str, Any]]] = []
        for start in range(0, len(texts), batch_size):
            data = [str(t) for t in texts[start : start + batch_size]]
            for hits in self._search(data, TEXT_SPARSE_FIELD, {"metric_type": "BM25", "params": {}}, _ahead(k),
                                     output_fields, expr):
                rows = [{"id": h["id"], "bm25": round(float(h["distance"]), 4), **h.get("entity", {})} for h in hits]
                rows.sort(key=lambda h: (-h["bm25"], h["id"]))
                out.append(rows[:k])
        return out

    def _search_words(self, text: str, k: int, fields: list[str], expr: str | None) -> list[dict[str, Any]]:
        """``search_text`` beside the file: the engine's stored rows, or (a filter) its pages through Milvus'."""
        hits, offset, page = [], 0, k if expr is None else max(2 * k, 64)  # ties by id: lexical.top
        while len(hits) < k:
            part = self.words.top(self.name, text, page, offset)
            if not part:
                break
            stored = expr is None and all(f in h.fields for h in part for f in fields)
            found = {h.id: h.fields for h in part} if stored else self._rows_where([h.id for h in part], fields, expr)
            hits += [{"id": h.id, "bm25": round(h.score, 4), **{f: found[h.id].get(f) for f in fields}, "_code": h.code}
                     for h in part if h.id in found]
            if len(part) < page or expr is None:
                break
            offset, page = offset + page, min(4 * page, 8192)  # a filter most rows fail: larger pages, fewer calls
        return hits[:k]  # the engine's order: BM25, then equal scores by id

    def _rows_where(self, ids: list[int], fields: list[str], expr: str | None) -> dict[int, dict[str, Any]]:
        """Rows ``ids``' ``fields`` (without id), only those the filter ``expr`` holds for."""
        if expr is None:
            rows = self.get(ids, fields).values()  # a stored row without the fields asked
        else:
            rows = self._query(f"id in {ids} and ({expr})", fields, "search", expr)
        return {int(r["id"]): {f: r[f] for f in fields if f != "id"} for r in rows}

    @property
    def words(self) -> TextIndex:
        """The words' indexes beside the milvus-lite file (tantivy, one per collection)."""
        if self._words is None:
            self._words = TextIndex(self.lite_file)
        return self._words

    def words_state(self) -> str | None:
        """Why the words kept beside the file cannot answer for this collection (missing, damaged,
        or stale: of another generation than the collection's); None where they are in step."""

        try:
            side = self.words.generation(self.name)
        except StoreError as exc:
            logger.debug("the words of %s: %s", self.name, exc)
            return "damaged (the engine cannot read it)"
        if side is None:
            return "missing" if not self.words.path.exists() else "missing for this collection"
        if side != ledger.words_generation(self.client, self.name, self.timeout):
            return "stale (written before the collection last changed)"
        return None

    def check_words(self) -> None:
        """A StoreError saying how to mend it where this collection's words are not in step with it."""
        if self._words_checked:
            return
        why = self.words_state()
        if why is not None:
            raise StoreError(f"collection {self.name!r}: its words' index ({self.words.path}) is {why}; rerun the "
                             "same ingest (it rebuilds them from the stored text), or search with mode codes")
        self._words_checked = True

    def renew_words(self) -> None:
        """Start a write session of this collection's words: a new generation, recorded in the file
        now and beside it once the session's words are committed (``close``); words not in step
        are rebuilt from the stored rows first (said in one line)."""

        why, self._generation, self._recorded = self.words_state(), uuid.uuid4().hex, False
        ledger.set_words_generation(self.client, self.name, self._generation, self.timeout)  # the old words: stale
        if why is not None and why.startswith("damaged"):
            self.words.close()
            aside = self.words.path.with_name(f"{self.words.path.name}.damaged-{int(time.time())}")
            self.words.path.rename(aside)
            logger.warning("%s was damaged: moved to %s; each collection's words are rebuilt at its next ingest",
                           self.words.path, aside)
        if why is not None:
            self.words.create(self.name)
            fields, rows = ["id", CODE_FIELD, *self.describe().output_fields], 0
            for page in self._pages("", self._asked(fields), "reading the stored rows"):
                page = [self._read(r, fields) for r in page]
                self.words.write(self.name, {f: [r.get(f) for r in page] for f in fields}, new=True)
                rows += len(page)
            if rows:
                logger.info("%s: its words' index was %s; rebuilt from the stored text of %s rows", self.name, why,
                            f"{rows:,}")
            self.words.set_generation(self.name, self._generation)
            self._recorded = True
        self._words_checked = True

    def _commit_words(self) -> None:
        """This session's words published, and their generation recorded beside the file."""
        if self._words is None:
            return
        committed = self.words.commit(self.name)
        if self._generation and (committed or not self._recorded):
            self.words.set_generation(self.name, self._generation)
            self._recorded = True

    def _words_kept(self) -> bool:
        """Whether this collection's words are kept beside its milvus-lite file (lexical.TextIndex)."""
        if not self.lite_file:
            return False
        if self._text_store is None:
            self.describe()
        return self._text_store == "file"
