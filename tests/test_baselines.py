import numpy as np
import pytest

from dhim_ray.errors import ConfigError
from dhim_ray.retrieval.baselines import BASELINES, make_baseline
from dhim_ray.retrieval.metrics import precision_at_k


def clustered(n=600, d=48, k=4, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    centres = rng.standard_normal((k, d)) * 3
    return centres[labels] + rng.standard_normal((n, d)), labels


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_hash_and_find_clusters(name):
    x, y = clustered()
    model = make_baseline(name, None if name == "ubinary" else 16).fit(x[:500])  # ubinary: one bit per dim
    db, q = model.hash(x[:500]), model.hash(x[500:])
    assert db.dtype == np.uint8 and db.shape == (500, 6 if name == "ubinary" else 2)
    assert precision_at_k(db, y[:500], q, y[500:], k=20).precision_at_k_tie_aware > 0.6


def test_ubinary_is_the_sign_of_every_dimension_and_refuses_another_width():
    x, _ = clustered(d=16)
    model = make_baseline("ubinary", None).fit(x)
    assert model.n_bits == 16
    np.testing.assert_array_equal(model.hash(x[:5]), np.packbits(x[:5] > 0, axis=1))  # quantize_embeddings' ubinary
    with pytest.raises(ConfigError, match="n_bits=64: ubinary takes one bit per dimension"):
        make_baseline("ubinary", 64).fit(x)


def test_itq_reduces_quantisation_error_versus_pca_sign():
    x, _ = clustered(d=64)
    pca = make_baseline("pca-sign", 32).fit(x)
    itq = make_baseline("itq", 32).fit(x)

    def err(m):
        v = m.project(x)
        return np.sum((np.sign(v) - v / np.abs(v).mean()) ** 2)

    # ITQ minimises ||B - VR||; compare in the same units
    v_pca = pca.project(x)
    v_itq = itq.project(x)
    assert np.sum((np.sign(v_itq) - v_itq) ** 2) < np.sum((np.sign(v_pca) - v_pca) ** 2)


def test_pca_median_bits_are_balanced():
    x, _ = clustered()
    bits = make_baseline("pca-median", 16).fit(x).bits(x)
    assert np.allclose(bits.mean(0), 0.5, atol=0.01)


def test_errors():
    with pytest.raises(ConfigError, match="baseline='sh': choose one of lsh, pca-sign, pca-median, itq"):
        make_baseline("sh", 16)
    with pytest.raises(ConfigError, match="n_bits=64: itq needs at most"):
        make_baseline("itq", 64).fit(np.random.default_rng(0).standard_normal((100, 32)))
    with pytest.raises(ConfigError, match="call fit"):
        make_baseline("lsh", 16).hash(np.zeros((2, 4)))


def test_whitening_sign_equals_pca_sign_bits():
    """Whitening only rescales each principal axis, so its sign bits are PCA-sign's."""
    x, _ = clustered(d=32)
    white = make_baseline("whitening-sign", 16).fit(x)
    pca = make_baseline("pca-sign", 16).fit(x)
    agree = (white.bits(x) == pca.bits(x)).mean(0)
    # an eigenvector's sign is arbitrary: each bit equals PCA-sign's or its complement
    assert np.all((agree > 0.999) | (agree < 0.001))


def test_transform_baselines_refuse_more_bits_than_dims():
    with pytest.raises(ConfigError, match="n_bits=64: whitening-sign keeps at most the vectors' 32 dims"):
        make_baseline("whitening-sign", 64).fit(np.random.default_rng(0).standard_normal((100, 32)))
