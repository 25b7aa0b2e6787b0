"""Sentence-vector transforms: whitening gives identity covariance, the flow gives
z ~ N(0, I) on its training data and a better likelihood than whitening alone on
non-Gaussian data; both travel inside a DHIM checkpoint."""

import numpy as np
import pytest
import torch

from dhim_ray.encoding.transforms import Flow, Whitening, fit_transform, transform
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


def test_flow_z_is_standard_normal_on_its_training_data():
    x = anisotropic()
    flow = Flow(16).fit(x, seed=0)
    z = transform(flow, x)
    assert np.abs(z.mean(0)).max() < 0.1
    assert np.abs(np.cov(z, rowvar=False) - np.eye(16)).max() < 0.15
    # marginals of the skewed half got closer to Gaussian than whitening leaves them
    w = transform(flow.whitening, x)
    skew = lambda a: np.abs(((a - a.mean(0)) ** 3).mean(0) / a.std(0) ** 3)[: 8].mean()  # noqa: E731
    assert skew(z) < 0.5 * skew(w)


def test_flow_fits_better_than_whitening_and_is_invertible_per_dim():
    x = anisotropic()
    flow = Flow(16).fit(x, seed=0)
    xt = torch.from_numpy(x).float()
    with torch.no_grad():
        nll_flow = float(flow.nll(xt))
        start = Flow(16)
        start.whitening.fit(x)
        nll_white = float(start.nll(xt))
    assert nll_flow < nll_white - 0.05
    # same seed, same data -> same flow (fitted state is deterministic)
    again = Flow(16).fit(x, seed=0)
    np.testing.assert_array_equal(transform(flow, x[:50]), transform(again, x[:50]))


def test_transform_input_errors():
    with pytest.raises(DataError, match="at least 10 vectors"):
        Flow(4).fit(np.zeros((5, 4)))
    with pytest.raises(DataError, match="width 3: this transform was built for width 4"):
        Whitening(4).fit(np.ones((20, 3)))
    with pytest.raises(DataError, match="NaN"):
        Whitening(2).fit(np.array([[1.0, np.nan]] * 5))
    with pytest.raises(ConfigError, match="transform='pca': choose one of none, whitening, flow"):
        fit_transform("pca", np.ones((20, 3)))


def test_dhim_with_transforms_fits_them_and_saves_them_with_the_model(tmp_path, tiny_config):
    """model.target_transform / neighbour_transform are fitted on the training vectors
    before the first step, change the neighbour positives, and reload from the checkpoint."""
    from test_model import toy_features

    from dhim_ray.model.checkpoint import load_checkpoint, save_checkpoint
    from dhim_ray.model.inference import hash_features
    from dhim_ray.training.loop import fit, neighbour_table, neighbour_vectors

    feats, _ = toy_features(n=120, h=32)
    feats.mean[:] = feats.mean * np.linspace(4, 0.2, 32)[None, :] + 3.0  # anisotropic, off-centre
    cfg = tiny_config.replace(model={"target_transform": "flow", "neighbour_transform": "whitening"},
                              train={"max_epochs": 2})
    result = fit(feats, None, cfg, progress=False)
    model = result.model
    white = Whitening(32).fit(np.asarray(feats.mean, dtype=np.float64))
    np.testing.assert_allclose(neighbour_vectors(feats, model), transform(white, feats.mean), atol=1e-4)
    assert not np.array_equal(neighbour_table(neighbour_vectors(feats, model), 5), neighbour_table(feats.mean, 5))
    flow = Flow(32).fit(np.asarray(feats.mean, dtype=np.float64), seed=cfg.train.seed)
    np.testing.assert_allclose(transform(model.target_transform, feats.mean), transform(flow, feats.mean), atol=1e-4)

    path = save_checkpoint(tmp_path / "ckpt", model, cfg, "toy-features")
    loaded, loaded_cfg, _ = load_checkpoint(path)
    assert loaded_cfg.model.target_transform == "flow"
    np.testing.assert_array_equal(transform(loaded.target_transform, feats.mean),
                                  transform(model.target_transform, feats.mean))
    np.testing.assert_array_equal(hash_features(loaded, feats), hash_features(model, feats))


def test_target_transform_needs_a_regulariser(tiny_config):
    with pytest.raises(ConfigError, match="target_transform='whitening' transforms the regulariser target"):
        tiny_config.replace(model={"target_transform": "whitening", "regulariser": "none"})
    with pytest.raises(ConfigError, match="neighbour_transform='zca': choose one of none, whitening, flow"):
        tiny_config.replace(model={"neighbour_transform": "zca"})
