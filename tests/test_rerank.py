"""Asymmetric re-ranking: agreement of the query's pre-threshold scores with candidates' bits."""

import numpy as np
import pytest
import torch

from dhim_ray.codes import pack_codes
from dhim_ray.errors import ConfigError
from dhim_ray.model.inference import query_scores
from dhim_ray.retrieval.rerank import agreement, check_rerank, rerank_topk


def brute_force_rerank(db_bits, q_bits, scores, k, m):
    """Candidates = the k x m nearest by (Hamming distance, index); then by agreement, stable."""
    dist = (q_bits[:, None, :] != db_bits[None, :, :]).sum(-1)
    out = []
    for i in range(len(q_bits)):
        cand = np.argsort(dist[i], kind="stable")[: k * m]
        agree = [(scores[i] * (2 * db_bits[j] - 1)).sum() for j in cand]
        out.append(cand[np.argsort(-np.array(agree), kind="stable")[:k]])
    return np.array(out)


@pytest.mark.parametrize("n_bits", [16, 32, 64, 128])
def test_rerank_equals_brute_force(n_bits):
    rng = np.random.default_rng(n_bits)
    pool = rng.integers(0, 2, (30, n_bits))  # many ties in Hamming distance
    db_bits, q_bits = pool[rng.integers(0, 30, 300)], pool[rng.integers(0, 30, 17)]
    scores = rng.uniform(-1, 1, (17, n_bits)).astype(np.float32)
    idx, agree = rerank_topk(pack_codes(db_bits), pack_codes(q_bits), scores, k=10, m=4)
    assert np.array_equal(idx, brute_force_rerank(db_bits, q_bits, scores, 10, 4))
    expected = np.array([[(scores[i] * (2 * db_bits[j] - 1)).sum() for j in row] for i, row in enumerate(idx)])
    assert np.allclose(agree, expected, atol=1e-4)
    assert np.all(np.diff(agree, axis=1) <= 1e-6)  # best first


def test_sure_scores_keep_the_hamming_order_and_unsure_bits_break_ties():
    from dhim_ray.retrieval.metrics import hamming_topk

    rng = np.random.default_rng(0)
    db_bits, q_bits = rng.integers(0, 2, (200, 32)), rng.integers(0, 2, (5, 32))
    db, q = pack_codes(db_bits), pack_codes(q_bits)
    # scores of +-1: agreement = n_bits - 2 * Hamming distance, so the order is Hamming's (ties by index)
    idx, agree = rerank_topk(db, q, (2.0 * q_bits - 1).astype(np.float32), k=20, m=5)
    ref, dist = hamming_topk(db, q, 20)
    assert np.array_equal(idx, ref) and np.allclose(agree, 32 - 2 * dist)
    # two candidates at one distance, differing on a sure and an unsure bit: the one that keeps the sure bit wins
    scores = np.array([[0.9, 0.1] + [0.5] * 6], dtype=np.float32)
    cands = pack_codes(np.array([[[0, 1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1, 1, 1]]]).reshape(2, 8))[None]
    assert agreement(scores, cands)[0, 1] > agreement(scores, cands)[0, 0]


def test_scores_are_the_models_bernoulli_probabilities_and_sign_is_the_code(tiny_config):
    from conftest import make_toy_corpus

    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.model.inference import hash_features, score_features
    from dhim_ray.training.loop import build_model

    feats = FrozenEncoder(tiny_config.features).features([t for _, t in make_toy_corpus(5)], progress=False)
    model = build_model(tiny_config)
    codes, scores = score_features(model, feats)
    assert np.array_equal(codes, hash_features(model, feats))
    assert np.array_equal(pack_codes(scores > 0), codes) and np.all(np.abs(scores) < 1)
    with torch.no_grad():
        logits = model.global_logits(torch.tensor(feats.tokens[:3]).float(), torch.tensor(feats.mask[:3])).numpy()
    p = 1 / (1 + np.exp(-logits / tiny_config.model.alpha))
    assert np.allclose(query_scores(logits, tiny_config.model.alpha), 2 * p - 1, atol=1e-5)


@pytest.mark.parametrize("bad", [0, -2, 65, 2.5, True])
def test_bad_rerank(bad):
    with pytest.raises(ConfigError, match="rerank="):
        check_rerank(bad)
