"""The words of a milvus-lite file's collections beside it in tantivy (BM25 top-k by block-max
WAND, phrases), one index per collection under ``NAME.db.words/``, each row's fields and code
stored, so a text search reads no milvus-lite row (BENCHMARKS.md, "The words' engine").

    >>> TextIndex("codes.db").top("news_64", "a football club in spain", k=10)   # codes.db.words/news_64/"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from dhim_ray.errors import StoreError, first_line

#: The folder beside a file: ``codes.db`` keeps its words in ``codes.db.words/``.
SUFFIX = ".words"
#: Distinct words of one query sent to the engine: a longer query keeps its rarest MAX_QUERY_WORDS
#: (the words BM25 weighs most), so a whole document as a query stays one bounded OR.
MAX_QUERY_WORDS = 256
#: Words of a query whose quoted parts are phrases (a longer query is a document: its quotes are text).
MAX_PHRASE_WORDS = 32
#: What one text search may be asked at once: the sum over its texts of (distinct words x k). One
#: whole document as a query (MAX_QUERY_WORDS words) with k=1,000 fits; 256 texts of 8 words, k=127.
MAX_TEXT_WORK = MAX_QUERY_WORDS * 1024
_STATE = "dhim_ray.json"
_FORMAT = 1
_PHRASE = re.compile(r'"([^"]*)"')
_HEAP_BYTES = 64_000_000
#: Hits read past the last one asked for while their score equals its (ties taken whole, then by id).
_TIES = 8192


def text_file(lite_file: str | Path) -> Path:
    """Where the words of the milvus-lite file ``lite_file`` are kept."""
    return Path(str(lite_file) + SUFFIX)


def _analyzer():
    import tantivy

    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.ascii_fold()).build())


def _schema():
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("id", indexed=True, fast=True)
    builder.add_text_field("text", tokenizer_name="words", index_option="position")
    builder.add_bytes_field("fields", stored=True)
    builder.add_bytes_field("code", stored=True)
    return builder.build()


class Hit(NamedTuple):
    id: int
    score: float
    fields: dict[str, Any]  # the row's stored fields
    code: bytes


class Query(NamedTuple):
    words: list[str]  # the distinct words ranked (the analyzer's tokens), at most MAX_QUERY_WORDS
    phrases: list[list[str]]  # each quoted part's tokens: a hit holds them in order


def parse_query(text: str, analyze=None) -> Query:
    """A query text as the engine reads it: every word counts towards BM25, each once; in a query
    of at most MAX_PHRASE_WORDS words, ``"quoted parts"`` are phrases every hit holds (a longer
    one is a document, whose quotes are its own)."""
    analyze = analyze or _analyzer().analyze
    tokens = analyze(text.replace('"', " "))
    phrases = [part for text_part in _PHRASE.findall(text) if len(part := analyze(text_part)) > 1]
    return Query(list(dict.fromkeys(tokens)), phrases if len(tokens) <= MAX_PHRASE_WORDS else [])


def text_work(texts: Sequence[str], k: int) -> int:
    """A text search's work: the sum over ``texts`` of their distinct words (at most MAX_QUERY_WORDS) times k."""
    return sum(min(len(set(re.findall(r"\w+", str(t).lower()))), MAX_QUERY_WORDS) for t in texts) * int(k)


class _Collection:
    """One collection's index: a writer opened at the first write, a reader reloaded after each commit."""

    def __init__(self, folder: Path, create: bool):
        import tantivy

        if create:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.folder, self.schema = folder, _schema()
        self.index = tantivy.Index(self.schema, str(folder), reuse=not create)
        self.analyzer = _analyzer()
        self.index.register_tokenizer("words", self.analyzer)
        self.writer = None
        self.pending = False

    def add(self, rows: dict[str, Sequence], replace: bool) -> None:
        import tantivy

        if self.writer is None:
            self.writer = self.index.writer(heap_size=_HEAP_BYTES, num_threads=1)
        stored = [name for name in rows if name not in ("id", "code", "digest")]
        for n, (i, text, code) in enumerate(zip(rows["id"], rows["text"], rows["code"])):
            if replace:
                self.writer.delete_documents_by_term("id", int(i))
            doc = tantivy.Document()
            doc.add_integer("id", int(i))
            doc.add_text("text", text or "")
            doc.add_bytes("fields", orjson.dumps({name: rows[name][n] for name in stored}))
            doc.add_bytes("code", bytes(code[0] if isinstance(code, list) else code))  # milvus-lite's read: [bytes]
            self.writer.add_document(doc)
        self.pending = True

    def delete(self, ids: Sequence[int]) -> None:
        if self.writer is None:
            self.writer = self.index.writer(heap_size=_HEAP_BYTES, num_threads=1)
        for i in ids:
            self.writer.delete_documents_by_term("id", int(i))
        self.pending = True

    def commit(self) -> bool:
        if not self.pending:
            return False
        self.writer.commit()
        self.index.reload()
        self.pending = False
        return True

    def close(self) -> None:
        if self.writer is not None:
            self.commit()
            self.writer.wait_merging_threads()
            self.writer = None

    def query(self, parsed: Query, searcher):
        import tantivy

        words = parsed.words
        if len(words) > MAX_QUERY_WORDS:  # the rarest the index holds: the words BM25 weighs most
            held = {w: searcher.doc_freq("text", w) for w in words}
            words = sorted(words, key=lambda w: (held[w] == 0, held[w], words.index(w)))[:MAX_QUERY_WORDS]
        should = [(tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", w)) for w in words]
        must = [(tantivy.Occur.Must, tantivy.Query.phrase_query(self.schema, "text", p)) for p in parsed.phrases]
        return tantivy.Query.boolean_query(must + should) if must or should else None

    def top(self, text: str, k: int, offset: int = 0) -> list[Hit]:
        """Hits ``offset`` to ``offset + k`` by BM25, equal scores by id: the engine's top list is
        read past the last hit until the score falls below it (ties whole, at most _TIES more)."""
        parsed = parse_query(text, self.analyzer.analyze)
        searcher = self.index.searcher()
        query = self.query(parsed, searcher)
        if query is None or searcher.num_docs == 0:
            return []
        n = offset + k
        limit = 2 * n
        while True:
            found = searcher.search(query, limit, count=False).hits
            if len(found) < limit or round(found[-1][0], 4) < round(found[n - 1][0], 4) or limit >= n + _TIES:
                break
            limit = min(4 * limit, n + _TIES)
        ids = searcher.fast_field_values("id", [address for _, address in found])
        order = sorted(range(len(found)), key=lambda j: (-round(found[j][0], 4), ids[j]))[offset:n]  # as shown
        out = []
        for j in order:
            doc = searcher.doc(found[j][1])
            out.append(Hit(int(ids[j]), float(found[j][0]), orjson.loads(doc["fields"][0]), bytes(doc["code"][0])))
        return out


class TextIndex:
    """The tantivy indexes beside one milvus-lite file, one per collection, opened at first use
    and shared by threads under a lock (a service answers from several)."""

    def __init__(self, lite_file: str | Path):
        self.path = text_file(lite_file)
        self._open: dict[str, _Collection] = {}
        self._lock = threading.Lock()

    def _folder(self, name: str) -> Path:
        return self.path / name  # collection names are checked: letters, digits and _

    def _get(self, name: str, create: bool = False) -> _Collection:
        if create or name not in self._open:
            if not create and not (self._folder(name) / "meta.json").is_file():
                raise StoreError(f"{self._folder(name)}: no words' index for collection {name!r}")
            if name in self._open:
                self._open.pop(name).close()
            try:
                self._open[name] = _Collection(self._folder(name), create)
            except (OSError, ValueError) as exc:
                raise StoreError(f"{self._folder(name)}: the words' index cannot be opened ({first_line(exc)})") from exc
        return self._open[name]

    def _run(self, what: str, name: str, action, create: bool = False, locked: bool = True):
        """``action`` on collection ``name``'s index; ``locked=False`` (a search): the lock only to find it."""
        try:
            if not locked:
                with self._lock:
                    index = self._get(name, create)
                return action(index)
            with self._lock:
                return action(self._get(name, create))
        except StoreError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the engine's own errors are ValueErrors
            raise StoreError(f"{self._folder(name)}: {what} failed ({first_line(exc)})") from exc

    def create(self, name: str) -> None:
        """A new, empty index for collection ``name`` (one left by a dropped collection goes)."""
        self._run("creating the words' index", name, lambda c: None, create=True)

    def generation(self, name: str) -> str | None:
        """The generation collection ``name``'s words were last committed in; None where there is
        no index or none recorded; a StoreError where the index cannot be read."""
        state = self._folder(name) / _STATE
        if not (self._folder(name) / "meta.json").is_file():
            return None
        try:
            recorded = json.loads(state.read_text()) if state.exists() else {}
        except (OSError, ValueError) as exc:
            raise StoreError(f"{state}: unreadable ({first_line(exc)})") from exc
        self._run("opening the words' index", name, lambda c: c.index.searcher())
        return recorded.get("generation") if recorded.get("format") == _FORMAT else None

    def set_generation(self, name: str, generation: str) -> None:
        """Record that collection ``name``'s words are committed in step with ``generation``."""
        self.commit(name)
        state = self._folder(name) / _STATE
        tmp = state.with_name(_STATE + ".tmp")
        tmp.write_text(json.dumps({"format": _FORMAT, "generation": generation}))
        os.replace(tmp, state)

    def write(self, name: str, rows: dict[str, Sequence], new: bool = False) -> None:
        """Rows (by column: id, text, code and the fields a hit returns) hold these words and
        fields; a row already kept is replaced unless ``new``. Seen by searches after ``commit``."""
        self._run("writing the words' index", name, lambda c: c.add(rows, replace=not new))

    def delete(self, name: str, ids: Sequence[int]) -> None:
        self._run("deleting from the words' index", name, lambda c: c.delete(ids))

    def commit(self, name: str) -> bool:
        """Publish collection ``name``'s pending writes; whether there were any."""
        if name not in self._open:
            return False
        return self._run("committing the words' index", name, lambda c: c.commit())

    def top(self, name: str, text: str, k: int, offset: int = 0) -> list[Hit]:
        """The ``k`` best rows by BM25 for ``text`` after the first ``offset``, best first."""
        return self._run("a text search", name, lambda c: c.top(text, k, offset), locked=False)  # readers share

    def close(self) -> None:
        with self._lock:
            for name in list(self._open):
                self._open.pop(name).close()
