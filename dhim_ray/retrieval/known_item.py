"""Known-item retrieval: does a phrase cut from a document find that document? No labels needed.
Ranks follow precision@k's tie rule: a target with ``better`` documents strictly nearer and
``tied`` at its distance (itself included) sits at each of ranks better+1 .. better+tied with
equal chance, so recall@k = clip((k - better) / tied, 0, 1) and MRR and mean rank follow.

    >>> better, tied = hamming_ranks(db_codes, hasher.encode(queries.texts), queries.targets)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dhim_ray.codes import check_codes
from dhim_ray.errors import DataError, check_range

#: The ks recall is reported at, and the one that is the task's primary metric.
RECALL_KS = (1, 10, 100)
PRIMARY = "recall_at_10"
TASK = "known-item"


@dataclass(frozen=True)
class KnownItemQueries:
    """Word windows and the database index of the document each was cut from."""

    texts: list[str]
    targets: np.ndarray  # (n,) int64 indices into the database
    words: int
    seed: int


def check_window(words: int, n_queries: int) -> None:
    check_range("window_words", words, 1, 512, example=8)
    check_range("n_windows", n_queries, 1, 1_000_000, example=1000)


def cut_windows(texts: Sequence[str], n_queries: int = 1000, words: int = 8, seed: int = 0,
                candidates: np.ndarray | None = None, cleaning: str = "unicode") -> KnownItemQueries:
    """``n_queries`` seeded windows of ``words`` consecutive words, each from a long enough document of
    ``texts`` (among ``candidates``), every one drawn once before any twice; a window that ``cleaning``
    leaves empty is cut again. Raises DataError when no document is long enough."""
    from dhim_ray.corpus.text import has_text

    check_window(words, n_queries)
    pool = np.arange(len(texts)) if candidates is None else np.asarray(candidates, dtype=np.int64)
    split = [texts[i].split() for i in pool]
    eligible = np.flatnonzero([len(w) >= words for w in split])
    if not len(eligible):
        raise DataError(f"no document has {words} words to cut a known-item window from; use fewer window words")
    rng = np.random.default_rng([seed, words])
    # every eligible document once (in random order) before any twice
    rounds = -(-n_queries // len(eligible))
    picks = np.concatenate([rng.permutation(eligible) for _ in range(rounds)])[:n_queries]
    out, targets = [], []
    for p in picks:
        doc = split[p]
        for _ in range(8):  # a few tries at a window with words in it
            start = int(rng.integers(0, len(doc) - words + 1))
            window = " ".join(doc[start : start + words])
            if has_text(window, cleaning):
                out.append(window)
                targets.append(pool[p])
                break
    if not out:
        raise DataError(f"no {words}-word window with any words left after cleaning; check the text column")
    return KnownItemQueries(out, np.asarray(targets, dtype=np.int64), words, seed)


def _popcount_rows(db_words: np.ndarray, q_words: np.ndarray) -> np.ndarray:
    out = np.zeros((len(q_words), len(db_words)), dtype=np.int32)
    for w in range(db_words.shape[1]):
        out += np.bitwise_count(q_words[:, w, None] ^ db_words[None, :, w])
    return out


def hamming_ranks(database: np.ndarray, queries: np.ndarray, targets: np.ndarray,
                  memory_mb: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(better, tied) per query: database codes strictly nearer to the query than its target,
    and codes at the target's distance (the target included). Exact; queries go a chunk at a
    time so memory stays near ``memory_mb`` for any database size."""
    from dhim_ray.retrieval.metrics import _as_words

    check_codes(database)
    check_codes(queries, database.shape[1] * 8)
    targets = np.asarray(targets, dtype=np.int64)
    db, q = _as_words(database), _as_words(queries)
    chunk = max(1, int(memory_mb * 2**20 // (8 * max(len(db), 1))))
    better = np.empty(len(q), dtype=np.int64)
    tied = np.empty(len(q), dtype=np.int64)
    for a in range(0, len(q), chunk):
        d = _popcount_rows(db, q[a : a + chunk])
        own = d[np.arange(len(d)), targets[a : a + chunk]][:, None]
        better[a : a + chunk] = (d < own).sum(1)
        tied[a : a + chunk] = (d == own).sum(1)
    return better, tied


def cosine_ranks(database: np.ndarray, queries: np.ndarray, targets: np.ndarray,
                 chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(better, tied) by cosine similarity of float vectors (higher is nearer; ties, which
    continuous scores almost never have, counted like Hamming ties)."""
    x = _unit(database)
    qv = _unit(queries)
    targets = np.asarray(targets, dtype=np.int64)
    better = np.empty(len(qv), dtype=np.int64)
    tied = np.empty(len(qv), dtype=np.int64)
    for a in range(0, len(qv), chunk):
        sims = qv[a : a + chunk] @ x.T
        own = sims[np.arange(len(sims)), targets[a : a + chunk]][:, None]
        better[a : a + chunk] = (sims > own).sum(1)
        tied[a : a + chunk] = (sims == own).sum(1)
    return better, tied


def list_ranks(ranked: np.ndarray, targets: np.ndarray, n_database: int) -> tuple[np.ndarray, np.ndarray]:
    """(better, tied) from ranked candidate lists (n, c) of database indices, as a two-stage
    search returns them: a target at position p has p better; one missing from its list is
    taken as last of the database (better = n_database - 1): no recall, almost no MRR."""
    ranked = np.asarray(ranked)
    hit = ranked == np.asarray(targets)[:, None]
    found = hit.any(1)
    better = np.where(found, hit.argmax(1), max(n_database - 1, ranked.shape[1])).astype(np.int64)
    return better, np.ones(len(ranked), dtype=np.int64)


def known_item_scores(better: np.ndarray, tied: np.ndarray, ks: Sequence[int] = RECALL_KS) -> dict[str, float]:
    """recall@k for each k, MRR and the mean rank, with ties averaged (see the module doc)."""
    better = np.asarray(better, dtype=np.float64)
    tied = np.asarray(tied, dtype=np.float64)
    if not len(better):
        raise DataError("no known-item queries to score")
    if np.any(tied < 1):
        raise DataError("a target must tie with itself: tied >= 1")
    out = {f"recall_at_{k}": float(np.clip((k - better) / tied, 0, 1).mean()) for k in ks}
    out["mrr"] = float(np.mean(_harmonic_gap(better, tied)))
    out["mean_rank"] = float(np.mean(better + (tied + 1) / 2))
    return out


def _harmonic_gap(better: np.ndarray, tied: np.ndarray) -> np.ndarray:
    """(H(better + tied) - H(better)) / tied: the mean of 1/r over r = better+1 .. better+tied."""
    top = int((better + tied).max())
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, top + 1))])
    return (harmonic[(better + tied).astype(np.int64)] - harmonic[better.astype(np.int64)]) / tied


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
