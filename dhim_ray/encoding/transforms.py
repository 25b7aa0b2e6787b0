"""Sentence-vector whitening fitted on a corpus (BERT-whitening, Su et al. 2021; torch, no Ray):
z = (x - mu) V Lambda^(-1/2), axes by variance, optionally the first k. ``Whitening`` is an
``nn.Module`` whose state is buffers, so a model that uses it (``model.target_transform``)
saves and verifies it with its weights; ``transform(x)`` applies it to numpy, chunk by chunk."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from dhim_ray.config import TRANSFORMS
from dhim_ray.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

_EPS = 1e-6  # eigenvalues below this share of the largest are floored (a rank-deficient sample)


def check_transform(name: str, field: str = "transform") -> str:
    if name not in TRANSFORMS:
        raise ConfigError(f"{field}={name!r}: choose one of {', '.join(TRANSFORMS)}")
    return name


def _as_matrix(vectors, dim: int | None = None, min_rows: int = 2) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2 or len(x) < min_rows:
        raise DataError(f"vectors of shape {x.shape}: a transform is fitted on at least {min_rows} vectors (n, d)")
    if dim is not None and x.shape[1] != dim:
        raise DataError(f"vectors of width {x.shape[1]}: this transform was built for width {dim}")
    if not np.isfinite(x).all():
        raise DataError("vectors hold NaN or infinite values: a transform cannot be fitted on them")
    return x


class Whitening(nn.Module):
    """z = (x - mu) V Lambda^(-1/2)[:, :k]: zero mean, identity covariance on the data it was fitted on.

    ``k`` (default: all dims) keeps the first k principal axes, largest variance first.
    """

    kind = "whitening"

    def __init__(self, dim: int, k: int | None = None):
        super().__init__()
        self.dim, self.k = dim, k or dim
        if not 1 <= self.k <= dim:
            raise ConfigError(f"k={k}: whitening keeps between 1 and {dim} dims", field="k")
        self.register_buffer("mu", torch.zeros(dim))
        self.register_buffer("weight", torch.eye(dim)[:, : self.k].clone())
        self.register_buffer("log_det", torch.zeros(()))  # log |det W|: unused, kept so saved models load

    @torch.no_grad()
    def fit(self, vectors) -> Whitening:
        x = _as_matrix(vectors, self.dim)
        mu = x.mean(axis=0)
        values, axes = np.linalg.eigh(np.cov(x - mu, rowvar=False))
        order = np.argsort(values)[::-1]
        values = np.maximum(values[order], _EPS * max(values.max(), _EPS))
        w = axes[:, order] / np.sqrt(values)[None, :]
        self.mu.copy_(torch.from_numpy(mu))
        self.weight.copy_(torch.from_numpy(w[:, : self.k]))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mu.to(x.dtype)) @ self.weight.to(x.dtype)


def build_transform(name: str, dim: int) -> Whitening | None:
    """An unfitted transform by name, or None for 'none'."""
    return Whitening(dim) if check_transform(name) == "whitening" else None


def fit_transform(name: str, vectors) -> Whitening | None:
    """Build ``name`` for the vectors' width and fit it on them (None for 'none')."""
    module = build_transform(name, np.asarray(vectors).shape[-1])
    return None if module is None else module.fit(vectors)


@torch.no_grad()
def transform(module: Whitening | None, vectors, chunk: int = 8192) -> np.ndarray:
    """Apply a fitted transform to (n, d) vectors (numpy or a RowFile) chunk by chunk, on
    the device its buffers are on: (n, d') float32."""
    if module is None:
        return np.asarray(vectors[:], dtype=np.float32)
    device = next(module.buffers()).device
    out = [np.zeros((0, module.k), np.float32)]
    for start in range(0, len(vectors), chunk):
        x = torch.from_numpy(np.asarray(vectors[start : start + chunk], dtype=np.float32)).to(device)
        out.append(module(x).float().cpu().numpy())
    return np.concatenate(out)


def fitting_sample(n: int, limit: int, seed: int) -> np.ndarray:
    """Sorted row indices of at most ``limit`` of n rows (all when n <= limit): what a transform is fitted on."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))
