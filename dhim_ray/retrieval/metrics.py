"""Exact Hamming search and precision@k on packed codes: faiss' ``IndexBinaryFlat`` with ties
broken by database order (equal to a sort by (distance, index)), a chunk of queries at a time;
``hamming_distances`` (the full matrix) is for small inputs and tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dhim_ray.codes import check_codes
from dhim_ray.errors import ConfigError, DataError

DEFAULT_MEMORY_MB = 256


def _as_words(codes: np.ndarray) -> np.ndarray:
    """Packed uint8 (n, n_bytes) -> uint64 (n, ceil(n_bytes / 8)), zero-padded."""
    n, n_bytes = codes.shape
    n_words = -(-n_bytes // 8)
    if n_bytes != n_words * 8:
        padded = np.zeros((n, n_words * 8), dtype=np.uint8)
        padded[:, :n_bytes] = codes
        codes = padded
    return np.ascontiguousarray(codes).view(np.uint64)


def _check_search(database: np.ndarray, queries: np.ndarray) -> None:
    check_codes(database)
    check_codes(queries, database.shape[1] * 8)
    if len(database) == 0:
        raise DataError("database of 0 codes: nothing to search; encode some documents first")


QUERY_CHUNK = 1024  # queries per faiss call: results stay (chunk, k)
TIE_CHUNK = 64  # queries per range search when counting the ties at the k-th distance


def _chunk_rows(n_database: int, memory_mb: int) -> int:
    # A chunk holds a (rows, n_database) float32 matrix plus temporaries of the same size.
    return max(1, int(memory_mb * 2**20 // (3 * 8 * max(n_database, 1))))


def hamming_distances(database: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Full (n_queries, n_database) distance matrix, int32. For small inputs and tests."""
    _check_search(database, queries)
    db, q = _as_words(database), _as_words(queries)
    out = np.zeros((len(q), len(db)), dtype=np.int32)
    for w in range(db.shape[1]):
        out += np.bitwise_count(q[:, w, None] ^ db[None, :, w])
    return out


def _faiss():
    try:
        import faiss
    except ImportError as exc:  # a dependency; say how to get it back
        raise ConfigError("exact search needs faiss: pip install faiss-cpu") from exc
    return faiss


def _index(database: np.ndarray):
    faiss = _faiss()
    index = faiss.IndexBinaryFlat(database.shape[1] * 8)
    # Counting selection (use_heap False) is the faster kernel up to 64 bits, the heap above.
    index.use_heap = database.shape[1] > 8
    index.query_batch_size = QUERY_CHUNK  # one pass over the database per chunk of queries (default 32)
    index.add(np.ascontiguousarray(database))
    return index


def _ordered(distances: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by (distance, index): faiss keeps the lowest tied indices but not in order."""
    key = distances.astype(np.int64) << np.int64(40) | indices
    key.sort(axis=1)
    return key & np.int64((1 << 40) - 1), (key >> np.int64(40)).astype(np.int32)


def hamming_topk(
    database: np.ndarray, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest database codes of each query by Hamming distance, ties by database order.

    ``database`` (n, n_bytes) and ``queries`` (m, n_bytes) packed codes of one width; returns
    (indices, distances), both (m, k), sorted by (distance, index).

        >>> idx, dist = hamming_topk(db_codes, query_codes, k=10)"""
    _check_search(database, queries)
    k = check_k(k, len(database))
    index = _index(database)
    indices = np.empty((len(queries), k), dtype=np.int64)
    distances = np.empty((len(queries), k), dtype=np.int32)
    for start in range(0, len(queries), QUERY_CHUNK):
        d, i = index.search(np.ascontiguousarray(queries[start : start + QUERY_CHUNK]), k)
        indices[start : start + QUERY_CHUNK], distances[start : start + QUERY_CHUNK] = _ordered(d, i)
    return indices, distances


def check_k(k: int, n_database: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k={k!r}: must be a positive integer, e.g. 100", field="k")
    if k > n_database:
        raise ConfigError(
            f"k={k}: larger than the database ({n_database} codes); use k={n_database} or less", field="k"
        )
    return int(k)


@dataclass(frozen=True)
class PrecisionResult:
    """Precision@k of a query set against a database (two tie rules)."""

    k: int
    precision_at_k: float
    """Ties at the k-th distance broken by database order (lower index first)."""
    precision_at_k_tie_aware: float
    """Expected precision when ties at the k-th distance are broken uniformly at random."""
    n_queries: int
    n_database: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "k": self.k,
            "precision_at_k": self.precision_at_k,
            "precision_at_k_tie_aware": self.precision_at_k_tie_aware,
            "n_queries": self.n_queries,
            "n_database": self.n_database,
        }


def _check_labels(labels: np.ndarray | None, n: int, role: str) -> np.ndarray:
    if labels is None:
        raise DataError(
            f"{role} has no labels: precision needs a label per document; pass label_column=NAME"
        )
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise DataError(f"{role} labels of shape {labels.shape}: expected ({n},), one per code")
    return labels


def tie_aware_hits(distances: np.ndarray, relevant: np.ndarray, k: int) -> np.ndarray:
    """Expected relevant hits among the k nearest, per row, when ties at the k-th
    distance are broken uniformly at random: ``r_lt + (k - n_lt) * r_eq / n_eq``.

    distances, relevant: (rows, candidates); the candidates must include every one
    at the k-th distance (all of the database, or a search that fetched the ties).
    """
    kth = np.partition(distances, k - 1, axis=1)[:, k - 1 : k]
    closer, tied = distances < kth, distances == kth
    n_lt, r_lt = closer.sum(axis=1), (closer & relevant).sum(axis=1)
    n_eq, r_eq = tied.sum(axis=1), (tied & relevant).sum(axis=1)
    return r_lt + (k - n_lt) * r_eq / n_eq


def precision_at_k(
    database: np.ndarray,
    database_labels: np.ndarray,
    queries: np.ndarray,
    query_labels: np.ndarray,
    k: int = 100,
) -> PrecisionResult:
    """Precision@k by Hamming distance, averaged over queries, two ways: ties by database order,
    and tie-aware, (r_lt + (k - n_lt) * r_eq / n_eq) / k with n_lt codes nearer than the k-th
    distance (r_lt relevant) and n_eq at it (r_eq relevant)."""
    _check_search(database, queries)
    k = check_k(k, len(database))
    db_labels = _check_labels(database_labels, len(database), "database")
    q_labels = _check_labels(query_labels, len(queries), "queries")
    ordered, expected = _search_hits(database, queries, k, lambda rows, ids: db_labels[ids] == q_labels[rows])
    n_q = len(queries)
    return PrecisionResult(k=k, precision_at_k=ordered / (n_q * k), precision_at_k_tie_aware=expected / (n_q * k),
                           n_queries=n_q, n_database=len(database))


def cosine_topk(database: np.ndarray, queries: np.ndarray, k: int, memory_mb: int = DEFAULT_MEMORY_MB,
                exclude_self: bool = False) -> np.ndarray:
    """Indices (n_queries, k) of each query's k nearest database vectors by cosine,
    nearest first (ties by database order). ``exclude_self``: queries are the database
    itself and a vector is not its own neighbour. Chunked: memory stays bounded."""
    database, queries = np.asarray(database, np.float32), np.asarray(queries, np.float32)
    k = check_k(k, len(database) - int(exclude_self))
    db = database / np.linalg.norm(database, axis=1, keepdims=True).clip(1e-12)
    out = np.empty((len(queries), k), dtype=np.int64)
    rows = _chunk_rows(len(db), memory_mb)
    for start in range(0, len(queries), rows):
        q = queries[start : start + rows]
        sim = (q / np.linalg.norm(q, axis=1, keepdims=True).clip(1e-12)) @ db.T
        if exclude_self:
            sim[np.arange(len(q)), np.arange(start, start + len(q))] = -np.inf
        part = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        order = np.lexsort((part, -np.take_along_axis(sim, part, 1)), axis=1)
        out[start : start + len(q)] = np.take_along_axis(part, order, 1)
    return out


@dataclass(frozen=True)
class NeighbourRecallResult:
    """How much of each query's float cosine top-k its Hamming top-k recovers."""

    k: int
    recall_at_k: float
    """Tie-aware: ties at the k-th Hamming distance broken uniformly at random."""
    n_queries: int
    n_database: int

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def neighbour_recall_at_k(database: np.ndarray, queries: np.ndarray, neighbours: np.ndarray,
                          k: int = 100) -> NeighbourRecallResult:
    """Label-free quality: the share of each query's ``neighbours`` ((n_queries, m) database indices
    by another measure, e.g. ``cosine_topk``; the first k used) among its k nearest codes, tie-aware
    as in precision_at_k, averaged over queries."""
    _check_search(database, queries)
    k = check_k(k, len(database))
    neighbours = np.asarray(neighbours)
    if neighbours.ndim != 2 or len(neighbours) != len(queries) or neighbours.shape[1] < k:
        raise DataError(f"neighbours of shape {neighbours.shape}: expected ({len(queries)}, >= {k}), "
                        "k database indices per query")
    n_db = np.int64(len(database))
    keys = np.sort((np.arange(len(queries), dtype=np.int64)[:, None] * n_db + neighbours[:, :k]).ravel())

    def relevant(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        key = rows.astype(np.int64) * n_db + ids
        pos = np.searchsorted(keys, key).clip(max=len(keys) - 1)
        return keys[pos] == key

    _, expected = _search_hits(database, queries, k, relevant)
    return NeighbourRecallResult(k=k, recall_at_k=expected / (len(queries) * k), n_queries=len(queries),
                                 n_database=len(database))


def _search_hits(database: np.ndarray, queries: np.ndarray, k: int, relevant) -> tuple[float, float]:
    """Relevant codes among each query's k nearest, summed: (ties by database order, tie-aware)."""
    index = _index(database)
    ordered_hits = expected_hits = 0.0
    for start in range(0, len(queries), QUERY_CHUNK):
        q = np.ascontiguousarray(queries[start : start + QUERY_CHUNK])
        rows = np.arange(start, start + len(q))
        idx, dist = _ordered(*index.search(q, k))
        rel = relevant(np.broadcast_to(rows[:, None], idx.shape), idx)
        ordered_hits += float(rel.sum())
        kth = dist[:, -1]
        closer = dist < kth[:, None]
        n_lt, r_lt = closer.sum(axis=1), (closer & rel).sum(axis=1)
        n_eq, r_eq = _ties_at(index, q, kth, lambda members, ids, rows=rows: relevant(rows[members], ids))
        expected_hits += float(np.sum(r_lt + (k - n_lt) * r_eq / n_eq))
    return ordered_hits, expected_hits


def _ties_at(index, queries: np.ndarray, kth: np.ndarray, relevant) -> tuple[np.ndarray, np.ndarray]:
    """Per query: codes at exactly its k-th distance, and how many of those are relevant."""
    n_eq = np.zeros(len(queries), dtype=np.int64)
    r_eq = np.zeros(len(queries), dtype=np.int64)
    for d in np.unique(kth):
        group = np.flatnonzero(kth == d)
        for s in range(0, len(group), TIE_CHUNK):
            members = group[s : s + TIE_CHUNK]
            lims, dist, ids = index.range_search(queries[members], int(d) + 1)  # dist <= d
            owner = np.repeat(np.arange(len(members)), np.diff(lims).astype(np.int64))
            at = dist == d
            n_eq[members] = np.bincount(owner[at], minlength=len(members))
            rel = at & relevant(members[owner], ids)
            r_eq[members] = np.bincount(owner[rel], minlength=len(members))
    return n_eq, r_eq


def cosine_precision_at_k(
    database: np.ndarray,
    database_labels: np.ndarray,
    queries: np.ndarray,
    query_labels: np.ndarray,
    k: int = 100,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> float:
    """Precision@k of exact cosine kNN on float vectors: the unhashed reference."""
    db_labels = _check_labels(database_labels, len(database), "database")
    q_labels = _check_labels(query_labels, len(queries), "queries")
    top = cosine_topk(database, queries, k, memory_mb)
    return float((db_labels[top] == q_labels[:, None]).mean())


def precision_ceiling(db_labels: np.ndarray, query_labels: np.ndarray, k: int) -> float:
    """The highest P@k any codes can score: per query, its class's documents in the database (at most k) over k."""
    classes, sizes = np.unique(np.asarray(db_labels), return_counts=True)
    held = dict(zip(classes.tolist(), sizes.tolist()))
    return float(np.mean([min(k, held.get(y, 0)) / k for y in np.asarray(query_labels).tolist()])) if len(query_labels) else 1.0
