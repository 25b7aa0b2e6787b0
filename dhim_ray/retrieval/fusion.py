"""One ranking from two lists, the codes' (the topic) and BM25's (the words), by positions only.
``phrase`` (default, ``phrase:5``): the text list's first ``depth`` hits holding ``PHRASE_COVER``
of the query's words, then the codes' list; ``head``: those hits ungated; ``rrf``: reciprocal
rank fusion (BENCHMARKS.md, "One search for both tasks").

    >>> fuse(code_hits, text_hits, k=10, fusion=Fusion("phrase", depth=5), query="the phrase")"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dhim_ray.errors import ConfigError

#: What a search ranks by: the codes alone, the text index alone, or both fused.
MODES = ("codes", "text", "hybrid")
METHODS = ("head", "phrase", "rrf")
#: The share of a query's distinct words a text hit must hold to go first (``phrase``).
PHRASE_COVER = 0.8
#: rrf fuses each list's first max(k, RRF_DEPTH): a page of k up to it is the first k of any larger one.
RRF_DEPTH = 100
_WORD = re.compile(r"\w+")

Hits = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Fusion:
    """How hybrid search fuses the two lists: ``method`` phrase (of the first ``depth`` text hits,
    those holding ``cover`` of the query's words go first), head (``depth`` text hits first) or
    rrf (constant ``c``)."""

    method: str = "phrase"
    depth: int = 5
    c: int = 60
    cover: float = PHRASE_COVER  # phrase: the share of the query's words a text hit must hold

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"fusion={self.method!r}: choose one of {', '.join(METHODS)}", field="fusion")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or not 1 <= self.depth <= 100:
            raise ConfigError(f"fusion depth={self.depth!r}: text hits put first, between 1 and 100, e.g. 3")
        if isinstance(self.c, bool) or not isinstance(self.c, int) or not 1 <= self.c <= 10_000:
            raise ConfigError(f"fusion c={self.c!r}: the RRF constant, between 1 and 10000, e.g. 60")
        if not 0 < self.cover <= 1:
            raise ConfigError(f"fusion cover={self.cover!r}: a share of the query's words, in (0, 1], e.g. 0.8")

    @classmethod
    def parse(cls, value: str | None) -> Fusion:
        """``head``, ``head:5``, ``phrase``, ``phrase:5``, ``rrf`` or ``rrf:60`` (the CLI's spelling)."""
        if value is None or not str(value).strip():
            return cls()
        method, _, number = str(value).strip().partition(":")
        if method not in METHODS or (number and not number.isdigit()):
            raise ConfigError(f"fusion={value!r}: write head, head:DEPTH, phrase, phrase:DEPTH, rrf or rrf:C, e.g. "
                              "phrase:3", field="fusion")
        if not number:
            return cls(method)
        return cls(method, c=int(number)) if method == "rrf" else cls(method, depth=int(number))

    def text_hits_needed(self, k: int) -> int:
        """How many text hits a fused list of k takes: ``depth`` whatever k for head and phrase, so
        the first k hits are those of any larger k (rrf: of any larger k up to RRF_DEPTH)."""
        return max(k, RRF_DEPTH) if self.method == "rrf" else self.depth

    def code_hits_needed(self, k: int) -> int:
        """How many code hits a fused list of k takes: k (rrf: as many as it takes text hits)."""
        return self.text_hits_needed(k) if self.method == "rrf" else k

    def __str__(self) -> str:
        return f"{self.method}:{self.c if self.method == 'rrf' else self.depth}"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: choose codes, text or hybrid (both fused)", field="mode")
    return mode


def coverage(query: str, text: str) -> float:
    """The share of the query's distinct words (lowercased, as Milvus' standard analyzer splits
    them) that ``text`` holds."""
    words = set(_WORD.findall(query.lower()))
    return len(words & set(_WORD.findall(text.lower()))) / len(words) if words else 0.0


def fuse(code_hits: Hits, text_hits: Hits, k: int, fusion: Fusion = Fusion(), query: str = "") -> list[dict[str, Any]]:
    """The first k of one fused list. A hit found by both lists appears once, carrying the
    fields of both (``distance`` from the codes, ``bm25`` from the text index); ``rrf`` adds
    each hit's ``rrf_score``. Equal RRF scores keep the codes' order, then the text's.
    ``phrase`` reads each text hit's ``text`` against the ``query``."""
    by_id: dict[Any, dict[str, Any]] = {}
    for hit in (*code_hits, *text_hits):
        by_id.setdefault(hit["id"], {}).update(hit)
    if fusion.method in ("head", "phrase"):
        first = text_hits[: fusion.depth]
        if fusion.method == "phrase":
            first = [h for h in first if coverage(query, h.get("text", "")) >= fusion.cover]
        head = [h["id"] for h in first]
        taken = set(head)
        order = head + [h["id"] for h in code_hits if h["id"] not in taken]
        return [by_id[i] for i in order[:k]]
    score: dict[Any, float] = {}
    first_seen: dict[Any, int] = {}
    for hits in (code_hits, text_hits):
        for rank, hit in enumerate(hits, start=1):
            score[hit["id"]] = score.get(hit["id"], 0.0) + 1.0 / (fusion.c + rank)
            first_seen.setdefault(hit["id"], len(first_seen))
    order = sorted(score, key=lambda i: (-score[i], first_seen[i]))
    return [{**by_id[i], "rrf_score": round(score[i], 6)} for i in order[:k]]
