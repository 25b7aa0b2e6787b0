"""Sentence-vector whitening: identity covariance on the data it was fitted on, the
largest-variance axes first; it travels inside a DHIM checkpoint."""

import numpy as np
import pytest

from dhim_ray.encoding.transforms import Whitening, fit_transform, transform
from dhim_ray.errors import ConfigError, DataError


def anisotropic(n=3000, d=16, seed=0):
    """Correlated, skewed, narrow-cone vectors (like a frozen encoder's)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, d))
    z[:, : d // 2] = np.exp(0.6 * z[:, : d // 2])  # skewed half: not Gaussian
    mix = rng.standard_normal((d, d)) * np.linspace(3, 0.1, d)[None, :]
    return z @ mix + 5.0  # far from the origin: a cone


def test_whitening_yields_zero_mean_identity_covariance():
    x = anisotropic()
    z = transform(Whitening(16).fit(x), x)
    assert np.abs(z.mean(0)).max() < 1e-4
    assert np.abs(np.cov(z, rowvar=False) - np.eye(16)).max() < 1e-3


def test_whitening_truncates_to_largest_variance_axes():
    x = anisotropic()
    full = transform(Whitening(16).fit(x), x)
    top = transform(Whitening(16, k=4).fit(x), x)
    assert top.shape == (3000, 4)
    np.testing.assert_allclose(top, full[:, :4], atol=1e-4)
    # first axis = direction of largest variance of x
    w = Whitening(16, k=1).fit(x).weight.numpy()[:, 0]
    w /= np.linalg.norm(w)
    top_axis = np.linalg.eigh(np.cov(x, rowvar=False))[1][:, -1]
    assert abs(w @ top_axis) > 0.999


def test_transform_input_errors():
    with pytest.raises(DataError, match="at least 2 vectors"):
        Whitening(4).fit(np.zeros((1, 4)))
    with pytest.raises(DataError, match="width 3: this transform was built for width 4"):
        Whitening(4).fit(np.ones((20, 3)))
    with pytest.raises(DataError, match="NaN"):
        Whitening(2).fit(np.array([[1.0, np.nan]] * 5))
    with pytest.raises(ConfigError, match="transform='pca': choose one of none, whitening"):
        fit_transform("pca", np.ones((20, 3)))


def test_dhim_with_a_whitened_target_fits_it_and_saves_it_with_the_model(tmp_path, tiny_config):
    """model.target_transform is fitted on the training vectors before the first step and
    reloads from the checkpoint."""
    from test_model import toy_features

    from dhim_ray.model.checkpoint import load_checkpoint, save_checkpoint
    from dhim_ray.model.inference import hash_features
    from dhim_ray.training.loop import fit

    feats, _ = toy_features(n=120, h=32)
    feats.mean[:] = feats.mean * np.linspace(4, 0.2, 32)[None, :] + 3.0  # anisotropic, off-centre
    cfg = tiny_config.replace(model={"target_transform": "whitening", "regulariser": "mean"}, train={"max_epochs": 2})
    model = fit(feats, None, cfg, progress=False).model
    white = Whitening(32).fit(np.asarray(feats.mean, dtype=np.float64))
    np.testing.assert_allclose(transform(model.target_transform, feats.mean), transform(white, feats.mean), atol=1e-4)

    path = save_checkpoint(tmp_path / "ckpt", model, cfg, "toy-features")
    loaded, loaded_cfg, _ = load_checkpoint(path)
    assert loaded_cfg.model.target_transform == "whitening"
    np.testing.assert_array_equal(transform(loaded.target_transform, feats.mean),
                                  transform(model.target_transform, feats.mean))
    np.testing.assert_array_equal(hash_features(loaded, feats), hash_features(model, feats))


def test_target_transform_needs_a_regulariser(tiny_config):
    with pytest.raises(ConfigError, match="target_transform='whitening' transforms the regulariser target"):
        tiny_config.replace(model={"target_transform": "whitening", "regulariser": "none"})
    with pytest.raises(ConfigError, match="target_transform='flow': choose one of none, whitening"):
        tiny_config.replace(model={"target_transform": "flow"})
