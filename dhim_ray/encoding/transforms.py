"""Sentence-vector transforms fitted on a corpus: whitening and a normalising flow (torch; no Ray).

Frozen BERT-family sentence vectors sit in a narrow, anisotropic cone, so cosine
similarity between them is dominated by a few directions. Two post-hoc fixes from
the literature map them to an isotropic space:

- ``Whitening`` (BERT-whitening, Su et al. 2021; WhiteningBERT, Huang et al. 2021):
  z = (x - mu) V Lambda^(-1/2), principal axes in order of variance, optionally
  truncated to the first k.
- ``Flow`` (BERT-flow, Li et al. 2020): an invertible map fitted by maximum
  likelihood so that z = f^-1(x) ~ N(0, I). Here it is whitening followed by affine
  coupling layers (RealNVP-style, alternating halves, tanh-bounded scales whose last
  layer starts at zero, so training starts from whitening) and stops on a held-out
  tenth's likelihood.

Both are ``nn.Module``s whose fitted state is buffers: a DHIM model that uses one
(``ModelConfig.target_transform`` / ``neighbour_transform``) holds it as a submodule, so
it is saved, verified and reloaded with the model's weights. ``transform(x)`` applies
one to a numpy array, chunk by chunk.
"""

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
            raise ConfigError(f"k={k}: whitening keeps between 1 and {dim} dims")
        self.register_buffer("mu", torch.zeros(dim))
        self.register_buffer("weight", torch.eye(dim)[:, : self.k].clone())
        self.register_buffer("log_det", torch.zeros(()))  # log |det W| (full rank only), for the flow's likelihood

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
        self.log_det.fill_(float(-0.5 * np.log(values).sum()))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mu.to(x.dtype)) @ self.weight.to(x.dtype)


class _Coupling(nn.Module):
    """Affine coupling: the masked half passes through and conditions a scale and
    shift of the other half. Starts as the identity (last layer zero)."""

    def __init__(self, dim: int, mask: torch.Tensor, hidden: int):
        super().__init__()
        self.register_buffer("mask", mask.to(torch.float32))
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 2 * dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = self.mask.to(x.dtype)
        s, t = self.net(x * keep).chunk(2, dim=-1)
        s = torch.tanh(s) * (1 - keep)
        z = x * keep + (1 - keep) * (x * torch.exp(s) + t)
        return z, s.sum(-1)


class Flow(nn.Module):
    """BERT-flow's idea with a small RealNVP: z = couplings(whitening(x)), fitted by
    maximum likelihood under z ~ N(0, I). Dim i of z stays tied to principal axis i
    (couplings never permute), so ``z[:, :k]`` is the Gaussianised top-k subspace."""

    kind = "flow"

    def __init__(self, dim: int, layers: int = 4, hidden: int = 256):
        super().__init__()
        self.dim = dim
        self.whitening = Whitening(dim)
        even = (torch.arange(dim) % 2 == 0)
        self.couplings = nn.ModuleList(_Coupling(dim, even if i % 2 == 0 else ~even, hidden) for i in range(layers))
        for p in self.parameters():
            p.requires_grad_(False)  # fitted by fit(), never by the training that holds it

    def forward_with_log_det(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.whitening(x)
        log_det = self.whitening.log_det.to(x.dtype).expand(len(x))
        for layer in self.couplings:
            z, ld = layer(z)
            log_det = log_det + ld
        return z, log_det

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_log_det(x)[0]

    def nll(self, x: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood per dimension (nats) of x under the flow."""
        z, log_det = self.forward_with_log_det(x)
        return (0.5 * (z ** 2).sum(-1) + 0.5 * self.dim * np.log(2 * np.pi) - log_det).mean() / self.dim

    def fit(self, vectors, seed: int = 0, max_epochs: int = 200, batch_size: int = 256, lr: float = 1e-3,
            patience: int = 5) -> Flow:
        """Whitening first, then the couplings by Adam on the NLL of 90% of the vectors;
        the epoch with the best NLL on the other 10% is kept (stops after ``patience``
        epochs without a better one)."""
        x = _as_matrix(vectors, self.dim, min_rows=10)
        self.whitening.fit(x)
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(x))
        n_held = max(1, len(x) // 10)
        held, fit_rows = torch.from_numpy(x[order[:n_held]]).float(), torch.from_numpy(x[order[n_held:]]).float()
        params = [p for layer in self.couplings for p in layer.parameters()]
        for p in params:
            p.requires_grad_(True)
        gen = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for layer in self.couplings:  # a seeded start, independent of the caller's RNG state
                for m in layer.net[:-1]:
                    if isinstance(m, nn.Linear):
                        m.reset_parameters()
        optimizer = torch.optim.Adam(params, lr=lr)
        with torch.no_grad():
            best, best_state, bad = float(self.nll(held)), self._coupling_state(), 0
        start, epochs_run = best, 0
        for _ in range(max_epochs):
            epochs_run += 1
            perm = torch.randperm(len(fit_rows), generator=gen)
            for i in range(0, len(fit_rows), batch_size):
                loss = self.nll(fit_rows[perm[i : i + batch_size]])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 5.0)
                optimizer.step()
            with torch.no_grad():
                score = float(self.nll(held))
            if score < best - 1e-5:
                best, best_state, bad = score, self._coupling_state(), 0
            else:
                bad += 1
                if bad >= patience:
                    break
        self.couplings.load_state_dict(best_state)
        for p in params:
            p.requires_grad_(False)
        logger.debug("flow fitted on %d vectors: held-out NLL/dim %.4f (whitening alone %.4f), %d epochs",
                     len(x), best, start, epochs_run)
        return self

    def _coupling_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.couplings.state_dict().items()}


def build_transform(name: str, dim: int) -> nn.Module | None:
    """An unfitted transform by name, or None for 'none'."""
    check_transform(name)
    if name == "none":
        return None
    return Whitening(dim) if name == "whitening" else Flow(dim)


def fit_transform(name: str, vectors, seed: int = 0) -> nn.Module | None:
    """Build ``name`` for the vectors' width and fit it on them (None for 'none')."""
    module = build_transform(name, np.asarray(vectors).shape[-1])
    if module is None:
        return None
    return module.fit(vectors, seed=seed) if isinstance(module, Flow) else module.fit(vectors)


@torch.no_grad()
def transform(module: nn.Module | None, vectors, chunk: int = 8192) -> np.ndarray:
    """Apply a fitted transform to (n, d) vectors (numpy or a RowFile) chunk by chunk, on
    the device its buffers are on: (n, d') float32."""
    if module is None:
        return np.asarray(vectors[:], dtype=np.float32)
    device = next(module.buffers()).device
    out = [np.zeros((0, module.k if isinstance(module, Whitening) else module.dim), np.float32)]
    for start in range(0, len(vectors), chunk):
        x = torch.from_numpy(np.asarray(vectors[start : start + chunk], dtype=np.float32)).to(device)
        out.append(module(x).float().cpu().numpy())
    return np.concatenate(out)


def fitting_sample(n: int, limit: int, seed: int) -> np.ndarray:
    """Sorted row indices of at most ``limit`` of n rows (all when n <= limit): what a transform is fitted on."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))
