import numpy as np
import pytest

from dhim_ray.codes import pack_codes
from dhim_ray.errors import ConfigError, DataError
from dhim_ray.retrieval.metrics import cosine_precision_at_k, hamming_distances, hamming_topk, precision_at_k


def brute_force(db_bits, q_bits, k):
    dist = (q_bits[:, None, :] != db_bits[None, :, :]).sum(-1)
    # stable sort keeps database order among ties
    idx = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(dist, idx, axis=1), dist


@pytest.mark.parametrize("n_bits", [8, 16, 72, 128])
def test_topk_equals_bruteforce_including_ties(n_bits):
    rng = np.random.default_rng(n_bits)
    # few distinct codes -> many exact ties at every distance
    pool = rng.integers(0, 2, (12, n_bits))
    db_bits = pool[rng.integers(0, 12, 300)]
    q_bits = pool[rng.integers(0, 12, 40)]
    idx, dist = hamming_topk(pack_codes(db_bits), pack_codes(q_bits), k=37)
    ref_idx, ref_dist, full = brute_force(db_bits, q_bits, 37)
    assert np.array_equal(dist, ref_dist)
    assert np.array_equal(idx, ref_idx)
    assert np.array_equal(hamming_distances(pack_codes(db_bits), pack_codes(q_bits)), full)


def test_topk_k_equals_database_size():
    db = pack_codes(np.random.default_rng(0).integers(0, 2, (10, 16)))
    idx, dist = hamming_topk(db, db[:3], k=10)
    assert sorted(idx[0].tolist()) == list(range(10)) and dist[0, 0] == 0


def test_tie_aware_precision_hand_computed():
    # query = 0000_0000; database distances: 0 (rel), 1 (irr), 1 (rel), 1 (irr), 2 (rel)
    db_bits = np.array([
        [0, 0, 0, 0, 0, 0, 0, 0],  # d=0, label 1 (relevant)
        [1, 0, 0, 0, 0, 0, 0, 0],  # d=1, label 2
        [0, 1, 0, 0, 0, 0, 0, 0],  # d=1, label 1 (relevant)
        [0, 0, 1, 0, 0, 0, 0, 0],  # d=1, label 2
        [1, 1, 0, 0, 0, 0, 0, 0],  # d=2, label 1 (relevant)
    ])
    db_labels = np.array([1, 2, 1, 2, 1])
    q = pack_codes(np.zeros((1, 8), dtype=np.uint8))
    r = precision_at_k(pack_codes(db_bits), db_labels, q, np.array([1]), k=2)
    # k=2: one sure relevant at d=0, then 1 slot among 3 tied at d=1 of which 1 relevant.
    assert r.precision_at_k_tie_aware == pytest.approx((1 + 1 * 1 / 3) / 2)
    # database order fills the slot with index 1 (irrelevant)
    assert r.precision_at_k == pytest.approx(0.5)
    r3 = precision_at_k(pack_codes(db_bits), db_labels, q, np.array([1]), k=3)
    assert r3.precision_at_k_tie_aware == pytest.approx((1 + 2 * 1 / 3) / 3)
    assert r3.precision_at_k == pytest.approx(2 / 3)  # indices 0, 1, 2


def test_ordered_precision_matches_topk_and_tie_aware_is_expectation():
    rng = np.random.default_rng(5)
    db_bits, q_bits = rng.integers(0, 2, (400, 16)), rng.integers(0, 2, (30, 16))
    db_l, q_l = rng.integers(0, 3, 400), rng.integers(0, 3, 30)
    db, q = pack_codes(db_bits), pack_codes(q_bits)
    r = precision_at_k(db, db_l, q, q_l, k=25)
    idx, _ = hamming_topk(db, q, 25)
    assert r.precision_at_k == pytest.approx(np.mean(db_l[idx] == q_l[:, None]))
    # Monte Carlo over random tie-breaking converges to the tie-aware value
    dist = hamming_distances(db, q)
    sims = []
    for s in range(300):
        noise = np.random.default_rng(s).random(dist.shape)
        order = np.lexsort((noise, dist), axis=1)[:, :25]
        sims.append(np.mean(db_l[order] == q_l[:, None]))
    assert np.mean(sims) == pytest.approx(r.precision_at_k_tie_aware, abs=0.01)


def test_precision_errors():
    db = pack_codes(np.zeros((5, 8), dtype=np.uint8))
    with pytest.raises(ConfigError, match="k=6: larger than the database"):
        precision_at_k(db, np.zeros(5), db, np.zeros(5), k=6)
    with pytest.raises(DataError, match="queries has no labels"):
        precision_at_k(db, np.zeros(5), db, None, k=2)
    with pytest.raises(DataError, match="database labels of shape"):
        precision_at_k(db, np.zeros(4), db, np.zeros(5), k=2)


def test_cosine_precision_perfect_clusters():
    centers = np.eye(3)
    db = np.repeat(centers, 10, axis=0) + 0.01 * np.random.default_rng(0).standard_normal((30, 3))
    labels = np.repeat(np.arange(3), 10)
    assert cosine_precision_at_k(db, labels, centers, np.arange(3), k=10) == 1.0


@pytest.mark.parametrize("n_bits", [16, 32, 64, 128])
def test_search_and_precision_equal_brute_force_across_query_chunks(n_bits, monkeypatch):
    """Faiss-backed search and tie-aware precision equal brute force at every width,
    with heavy ties, over several query chunks and tie groups."""
    import dhim_ray.retrieval.metrics as metrics

    monkeypatch.setattr(metrics, "QUERY_CHUNK", 16)
    monkeypatch.setattr(metrics, "TIE_CHUNK", 3)
    rng = np.random.default_rng(n_bits + 1)
    pool = rng.integers(0, 2, (40, n_bits))
    db_bits = pool[rng.integers(0, 40, 2000)] ^ (rng.random((2000, n_bits)) < 0.02)
    q_bits = pool[rng.integers(0, 40, 70)]
    db_l, q_l = rng.integers(0, 4, 2000), rng.integers(0, 4, 70)
    db, q = pack_codes(db_bits), pack_codes(q_bits)
    idx, dist = hamming_topk(db, q, k=100)
    ref_idx, ref_dist, full = brute_force(db_bits, q_bits, 100)
    assert np.array_equal(idx, ref_idx) and np.array_equal(dist, ref_dist)
    r = precision_at_k(db, db_l, q, q_l, k=100)
    relevant = db_l[None, :] == q_l[:, None]
    expected = metrics.tie_aware_hits(full, relevant, 100).sum() / (70 * 100)
    assert r.precision_at_k_tie_aware == pytest.approx(expected)
    assert r.precision_at_k == pytest.approx(np.mean(db_l[ref_idx] == q_l[:, None]))


def brute_force_neighbour_recall(db_bits, q_bits, neighbours, k):
    """The label-free criterion by hand: relevance = membership in the query's neighbour list."""
    dist = (q_bits[:, None, :] != db_bits[None, :, :]).sum(-1)
    total = 0.0
    for i in range(len(q_bits)):
        rel = np.isin(np.arange(len(db_bits)), neighbours[i, :k])
        kth = np.sort(dist[i])[k - 1]
        closer, tied = dist[i] < kth, dist[i] == kth
        total += (rel[closer].sum() + (k - closer.sum()) * rel[tied].sum() / tied.sum()) / k
    return total / len(q_bits)


@pytest.mark.parametrize("n_bits", [16, 32, 64, 128])
def test_neighbour_recall_equals_brute_force_with_ties(n_bits, monkeypatch):
    import dhim_ray.retrieval.metrics as metrics
    from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k

    monkeypatch.setattr(metrics, "QUERY_CHUNK", 7)  # several query chunks, and tie groups within them
    rng = np.random.default_rng(n_bits)
    pool = rng.integers(0, 2, (20, n_bits))
    db_bits, q_bits = pool[rng.integers(0, 20, 250)], pool[rng.integers(0, 20, 23)]
    vectors = rng.normal(size=(250, 12)).astype(np.float32)
    queries = rng.normal(size=(23, 12)).astype(np.float32)
    neighbours = cosine_topk(vectors, queries, 15)
    r = neighbour_recall_at_k(pack_codes(db_bits), pack_codes(q_bits), neighbours, k=15)
    assert r.recall_at_k == pytest.approx(brute_force_neighbour_recall(db_bits, q_bits, neighbours, 15))
    assert 0 < r.recall_at_k < 1


def test_cosine_topk_equals_sort_and_neighbour_recall_tells_lsh_from_random_lists():
    from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k

    rng = np.random.default_rng(1)
    db, q = rng.normal(size=(300, 8)), rng.normal(size=(10, 8))
    sim = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (db / np.linalg.norm(db, axis=1, keepdims=True)).T
    assert np.array_equal(cosine_topk(db, q, 20, memory_mb=1), np.argsort(-sim, axis=1, kind="stable")[:, :20])
    own = cosine_topk(db, db[:5], 3, exclude_self=True)
    assert not np.any(own == np.arange(5)[:, None])
    # 128 random hyperplanes: the codes' Hamming order follows the angle, so they recover much of the
    # cosine top-20; a random list of 20 "neighbours" is recovered at about chance (20/300).
    planes = rng.normal(size=(8, 128))
    db_codes, q_codes = pack_codes(db @ planes > 0), pack_codes(q @ planes > 0)
    nbrs = cosine_topk(db, q, 20)
    lsh = neighbour_recall_at_k(db_codes, q_codes, nbrs, 20).recall_at_k
    rand = neighbour_recall_at_k(db_codes, q_codes, rng.permutation(300)[None, :20].repeat(10, 0), 20).recall_at_k
    assert lsh > 0.5 > rand


def test_neighbour_recall_bad_shape():
    from dhim_ray.retrieval.metrics import neighbour_recall_at_k

    codes = pack_codes(np.zeros((10, 16), dtype=np.uint8))
    with pytest.raises(DataError, match="neighbours of shape"):
        neighbour_recall_at_k(codes, codes[:2], np.zeros((2, 3), dtype=np.int64), k=5)


def test_a_float_baselines_curve_from_one_search_equals_its_precision_at_each_k():
    """The in-memory vectors' curve (one search for the largest k) is precision@k at every k, as
    the codes' curve is (both tie rules agree: cosine distances do not tie)."""
    from dhim_ray.eval_in_memory import InMemoryVectors, evaluate_codes

    rng = np.random.default_rng(3)
    db, q = rng.normal(size=(300, 16)), rng.normal(size=(40, 16))
    db_labels, q_labels = rng.integers(0, 4, 300), rng.integers(0, 4, 40)
    vectors = InMemoryVectors(db, db_labels)
    out = evaluate_codes(vectors, q, q_labels, k=50, curve=True)
    assert out["curve"]["value"] == pytest.approx([vectors.precision(q, q_labels, c).precision_at_k for c in
                                                   out["curve"]["k"]], abs=1e-12)
    assert out["precision_at_k"] == out["precision_at_k_tie_aware"] == cosine_precision_at_k(db, db_labels, q,
                                                                                              q_labels, 50)


def test_the_precision_ceiling_is_what_the_class_sizes_allow():
    """Classes smaller than k cap P@k below 1 whatever the codes: 7 and 22 relevant of k=100."""
    from dhim_ray.retrieval.metrics import precision_ceiling

    db = np.array([0] * 7 + [1] * 22)
    assert precision_ceiling(db, np.array([0, 1]), 100) == pytest.approx((0.07 + 0.22) / 2)
    assert precision_ceiling(db, np.array([0, 1, 1]), 5) == 1.0
    assert precision_ceiling(db, np.array([2]), 5) == 0.0  # a class the database lacks
