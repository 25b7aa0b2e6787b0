"""The words of a milvus-lite file's collections, kept beside it in SQLite's FTS5: BM25 whose writes
hold their rate as the file grows and which opens at once, where milvus-lite's own slows past a
million rows (BENCHMARKS.md, 'The text index past a million documents').

    >>> index = TextIndex("codes.db")          # codes.db.text, one FTS5 table per collection
    >>> index.search("news_64", ["a football club in spain"], k=10)"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from dhim_ray.errors import StoreError, first_line

#: The sidecar file: ``codes.db`` keeps its words in ``codes.db.text``.
SUFFIX = ".text"
_WORD = re.compile(r"\w+")
#: Words of one query sent to FTS5 (a whole document as a query stays one bounded OR).
MAX_QUERY_WORDS = 256


def text_file(lite_file: str | Path) -> Path:
    """Where the words of the milvus-lite file ``lite_file`` are kept."""
    return Path(str(lite_file) + SUFFIX)


def query_words(text: str) -> list[str]:
    """The distinct words of ``text``, lower-cased, in order, at most MAX_QUERY_WORDS."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:MAX_QUERY_WORDS]


def match_query(text: str | Sequence[str]) -> str | None:
    """``text`` (or its words) as an FTS5 query: each word quoted (no word is read as an
    operator), joined by OR, as BM25 ranks a query's words; None where it has no word."""
    words = query_words(text) if isinstance(text, str) else text
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words) or None


class TextIndex:
    """The FTS5 tables beside one milvus-lite file; a connection of its own, opened at first use
    and shared by threads under a lock (a service answers from several)."""

    def __init__(self, lite_file: str | Path):
        self.path = text_file(lite_file)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        #: per table: (the file's version when counted, rows, {word: rows holding it})
        self._counts: dict[str, tuple[tuple[int, int], int, dict[str, int]]] = {}

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                probe = sqlite3.connect(":memory:")
                probe.execute("create virtual table fts5_probe using fts5(x)")
                probe.execute("select count(*) from json_each('[]')")
                probe.close()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: this Python's sqlite3 has no FTS5 or JSON ({first_line(exc)}); use a "
                                 "Python whose sqlite3 has both (python.org and Debian builds do)") from exc
            try:
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                db.execute("pragma journal_mode=wal")
                db.execute("pragma synchronous=normal")
                db.execute("create table if not exists dhim_ray_generation (name text primary key, generation text)")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: the words' index cannot be opened ({first_line(exc)})") from exc
            self._db = db
        return self._db

    @staticmethod
    def _table(name: str) -> str:
        return f'"words_{name}"'  # collection names are checked: letters, digits and _

    def _run(self, what: str, sql: str, args: Sequence = (), many: bool = False) -> sqlite3.Cursor:
        try:
            db = self._connect()
            return db.executemany(sql, args) if many else db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {what} failed ({first_line(exc)})") from exc

    def create(self, name: str) -> None:
        """A new, empty table for collection ``name`` (one left by a dropped collection goes)."""
        with self._lock:
            self._run("dropping a text table", f"drop table if exists {self._table(name)}")
            self._run("creating a text table", f"create virtual table {self._table(name)} using "
                      "fts5(text, tokenize='unicode61 remove_diacritics 2')")

    def generation(self, name: str) -> str | None:
        """The generation table ``name``'s words were last written in (None: no table or none recorded)."""
        if not self.path.exists():
            return None
        with self._lock:
            if self._run("reading the text tables", "select 1 from sqlite_master where name = ?",
                         (f"words_{name}",)).fetchone() is None:
                return None
            found = self._run("reading the generation", "select generation from dhim_ray_generation where name = ?",
                              (name,)).fetchone()
        return found[0] if found else None

    def set_generation(self, name: str, generation: str) -> None:
        with self._lock:
            self._run("writing the generation", "insert or replace into dhim_ray_generation values (?, ?)",
                      (name, generation))

    def has(self, name: str) -> bool:
        if not self.path.exists():
            return False
        with self._lock:
            return self._run("reading the text tables", "select 1 from sqlite_master where name = ?",
                             (f"words_{name}",)).fetchone() is not None

    def write(self, name: str, ids: Sequence[int], texts: Sequence[str]) -> None:
        """Rows ``ids`` hold ``texts`` (a row already kept is replaced): one statement over the rows
        as a JSON array, all or none, so SQLite indexes them without taking Python's lock back row
        by row (a thread writing words leaves the others their turn)."""
        rows = orjson.dumps([[int(i), t.replace("\x00", " ")] for i, t in zip(ids, texts)]).decode()  # SQLite's JSON ends a text at a NUL
        with self._lock:
            self._run("writing the text index", f"insert or replace into {self._table(name)}(rowid, text) "
                      "select json_extract(value, '$[0]'), json_extract(value, '$[1]') from json_each(?)", (rows,))

    def delete(self, name: str, ids: Sequence[int]) -> None:
        with self._lock:
            self._run("deleting from the text index", f"delete from {self._table(name)} where rowid = ?",
                      [(int(i),) for i in ids], many=True)

    def ranked(self, name: str, text: str) -> Iterator[tuple[int, float]]:
        """(id, BM25 score, higher is better) of every row sharing a word with ``text``, best
        first, ties by id: read lazily, so a caller that needs ten reads ten. Words held by half
        the rows or more (FTS5 gives them an idf of ~0) are matched last: the rows sharing a
        rarer word come first without reading the common words' long lists."""
        words = query_words(text)
        if not words:
            return
        common = self._common(name, words) if len(words) > 1 else set()
        rare = [w for w in words if w not in common]
        seen: set[int] = set()
        if rare and common:
            for hit in self._scan(name, rare):
                seen.add(hit[0])
                yield hit
        yield from (hit for hit in self._scan(name, words) if hit[0] not in seen)

    def _scan(self, name: str, words: list[str]) -> Iterator[tuple[int, float]]:
        table = self._table(name)
        with self._lock:
            cursor = self._run("a text search", f"select rowid, -bm25({table}) as score from {table} where {table} "
                               "match ? order by score desc, rowid", (match_query(words),))
            rows = cursor.fetchmany(64)
        while rows:
            yield from ((int(i), float(s)) for i, s in rows)
            with self._lock:
                rows = cursor.fetchmany(1024)

    def _common(self, name: str, words: list[str]) -> set[str]:
        """Those of ``words`` in half of table ``name``'s rows or more, counted once per change of the file."""
        with self._lock:
            version = (self._run("reading the version", "pragma data_version").fetchone()[0], self._db.total_changes)
            known = self._counts.get(name)
            if known is None or known[0] != version:
                rows = self._run("counting rows", f'select count(*) from "words_{name}_docsize"').fetchone()[0]
                self._run("reading the vocabulary", f'create virtual table if not exists temp."vocab_{name}" '
                          f"using fts5vocab(main, {self._table(name)}, 'row')")
                known = self._counts[name] = (version, rows, {})
            _, rows, held = known
            missing = [w for w in words if w not in held]
            if missing:
                held.update(dict.fromkeys(missing, 0))
                held.update(self._run("reading the vocabulary", f'select term, doc from temp."vocab_{name}" where '
                                      f"term in ({','.join('?' * len(missing))})", missing).fetchall())
        return {w for w in words if 2 * held[w] >= rows}

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._counts.clear()  # the vocabulary tables were the connection's
