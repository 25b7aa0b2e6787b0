"""Asymmetric re-ranking of Hamming candidates (numpy only). A query keeps its pre-threshold
scores s_b = 2 sigmoid(logit_b / alpha) - 1; a candidate scores sum_b s_b (2 c_b - 1), so a
mismatch on an unsure bit costs little and codes at one distance get an order. Nothing extra is
stored.

    >>> idx, score = rerank_topk(db_codes, query_codes, query_scores, k=100, m=4)"""

from __future__ import annotations

import numpy as np

from dhim_ray.errors import ConfigError

MAX_RERANK = 64
BY_BITS = "agreement with the query's bit scores"
RERANK_CHUNK = 256  # queries scored at a time: (chunk, k * m, bits) float32 stays small


def check_rerank(m: int) -> int:
    """The candidate multiple: k x m Hamming candidates are re-ranked (1 = off)."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= MAX_RERANK:
        raise ConfigError(f"rerank={m!r}: must be an integer in 1..{MAX_RERANK} (1 = off; e.g. 4 re-ranks 4 x k "
                          "Hamming candidates)", field="rerank")
    return int(m)


def agreement(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """scores (n, bits) float, packed candidate codes (n, c, n_bytes) -> (n, c) sum_b s_b (2 c_b - 1)."""
    bits = np.unpackbits(codes, axis=-1).astype(np.float32)  # (n, c, bits), most significant bit first
    return 2 * np.einsum("ncb,nb->nc", bits, scores) - scores.sum(axis=1)[:, None]


def _best(score: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k highest scores, best first; equal scores keep the candidates' order."""
    order = np.argsort(-score, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(score, order, axis=1)


def rerank(scores: np.ndarray, candidate_codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Order each query's candidates (listed nearest first by Hamming distance) by
    agreement, best first; equal agreement keeps the Hamming order.
    Returns (positions into the candidate list (n, k), agreement (n, k))."""
    return _best(agreement(scores, candidate_codes), k)


def rerank_topk(database: np.ndarray, queries: np.ndarray, scores: np.ndarray, k: int,
                m: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact Hamming top-(k x m) of each query (ties by database order), re-ranked by
    agreement with the query's scores; returns (database indices (n, k), agreement (n, k))."""
    from dhim_ray.retrieval.metrics import hamming_topk

    m = check_rerank(m)
    candidates, _ = hamming_topk(database, queries, min(k * m, len(database)))
    idx_out = np.empty((len(queries), min(k, candidates.shape[1])), dtype=np.int64)
    score_out = np.empty(idx_out.shape, dtype=np.float32)
    for start in range(0, len(queries), RERANK_CHUNK):
        cand = candidates[start : start + RERANK_CHUNK]
        order, agree = rerank(scores[start : start + RERANK_CHUNK], database[cand], k)
        idx_out[start : start + RERANK_CHUNK] = np.take_along_axis(cand, order, axis=1)
        score_out[start : start + RERANK_CHUNK] = agree
    return idx_out, score_out
