"""DHIM training on cached features (torch only; Ray Train reuses these pieces).

``fit`` is the single-process loop: Adam, gradient-norm clipping every step,
early stopping on validation precision@k, best weights kept. ``train_epoch``,
``hash_features`` and ``EarlyStopping`` are what the Ray worker loop calls.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .codes import pack_codes
from .config import DHIMConfig, ModelConfig, TrainConfig
from .encoder import Features
from .errors import ConfigError, DataError
from .metrics import PrecisionResult, precision_at_k
from .model import DHIM


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def carve_validation(n: int, config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, val) index split of n documents when there is no val split."""
    n_val = min(config.max_val, max(1, int(round(n * config.val_fraction))))
    if n - n_val < 2:
        raise DataError(f"{n} documents are too few to carve a validation slice; give at least 3 or a val split")
    order = np.random.default_rng(config.seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def selection_database(n: int, config: TrainConfig) -> np.ndarray:
    """Indices of the training documents that model selection searches each epoch: all
    of them up to ``max_select_database``, else a fixed random sample. Selection only
    ranks epochs; hashing every training document each epoch would cost more than the
    epoch itself on long documents, and grows with the corpus."""
    m = config.max_select_database
    if not m or n <= m:
        return np.arange(n)
    return np.sort(np.random.default_rng(config.seed + 1).choice(n, m, replace=False))


def selection_sample(feats: Features, labels: np.ndarray, config: TrainConfig) -> tuple[Features, np.ndarray]:
    """The training documents (features, labels) that model selection searches: see selection_database."""
    idx = selection_database(len(feats), config)
    return feats.take(idx), labels[idx]


def token_mean(feats: Features, chunk: int = 1024) -> np.ndarray:
    """Mean of each document's word-position token features (what the linear path's
    readout sees): (n, H) float32."""
    out = np.empty((len(feats), feats.tokens.shape[-1]), dtype=np.float32)
    for start in range(0, len(feats), chunk):
        tok = feats.tokens[start : start + chunk].astype(np.float32)
        w = feats.mask[start : start + chunk].astype(np.float32)[:, :, None]
        out[start : start + chunk] = (tok * w).sum(1) / np.maximum(w.sum(1), 1)
    return out


def init_from_itq(model: DHIM, feats: Features, seed: int = 0) -> None:
    """Start the model's linear path as ITQ (PCA + rotation) of the mean token feature,
    scaled so every bit's logit has unit spread over the training documents."""
    from .baselines import ITQ

    x = token_mean(feats)
    itq = ITQ(model.config.n_bits, seed).fit(x)
    w = itq.w @ itq.rotation  # (H, bits)
    scale = (itq.project(x)).std(axis=0) + 1e-6
    model.init_linear_path((w / scale).T, -(itq.mean @ w) / scale)


def neighbour_table(vectors: np.ndarray, m: int, chunk: int = 2048) -> np.ndarray:
    """Each row's m nearest other rows by cosine similarity: (n, m) int64."""
    x = torch.nn.functional.normalize(torch.from_numpy(np.asarray(vectors, dtype=np.float32)), dim=1)
    m = min(m, len(x) - 1)
    out = np.empty((len(x), m), dtype=np.int64)
    for start in range(0, len(x), chunk):
        sim = x[start : start + chunk] @ x.T
        sim[torch.arange(len(sim)), torch.arange(start, start + len(sim))] = -float("inf")
        out[start : start + chunk] = sim.topk(m, dim=1).indices.numpy()
    return out


def pair_batches(
    n: int, batch_size: int, table: np.ndarray, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of (anchor, random top-m neighbour) pairs: indices (b,) and the (b, b)
    bool matrix of extra positives (each anchor with its neighbour, and copies of the
    same document with each other)."""
    half = max(1, batch_size // 2)
    for anchors in batch_indices(n, half, rng):
        partners = table[anchors, rng.integers(0, table.shape[1], size=len(anchors))]
        idx = np.concatenate([anchors, partners])
        b = len(anchors)
        pairs = idx[:, None] == idx[None, :]
        pairs[np.arange(b), np.arange(b) + b] = True
        pairs[np.arange(b) + b, np.arange(b)] = True
        yield idx, pairs


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffled minibatches; a last batch of one document (no negatives) is dropped."""
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        if len(idx) >= 2:
            yield np.sort(idx)  # sorted: contiguous reads from the feature arrays


def trim_margin(config: ModelConfig) -> int | None:
    """Positions past the last word that the convolutions read (None: do not trim,
    because the paper's formulation counts padding positions as words)."""
    return max(config.windows) // 2 if config.mask_padding else None


def to_tensors(
    feats: Features,
    idx: np.ndarray,
    regulariser: str,
    device: torch.device,
    trim: int | None = None,
    crop: int = 0,
    rng: np.random.Generator | None = None,
):
    """Batch of cached features -> (tokens (B,T,H) float32, mask (B,T), target (B,H) or None).

    trim: if not None, cut trailing positions that are padding in every document of
        the batch, keeping ``trim`` positions past the last word (the convolutions'
        reach), so codes do not change; only valid when padding is masked out (the
        paper's code counts padding as words).
    crop: if > 0, keep a random window of ``crop`` word positions per document
        (training augmentation for long documents; needs ``rng``).
    """
    mask_np = feats.mask[idx]
    if crop:
        lengths = mask_np.sum(1)
        starts = (rng.random(len(idx)) * np.maximum(lengths - crop + 1, 1)).astype(np.int64)
        cols = np.minimum(starts[:, None] + np.arange(crop)[None, :], mask_np.shape[1] - 1)
        rows = np.asarray(idx)[:, None]
        tok_np, mask_np = feats.tokens[rows, cols], mask_np[np.arange(len(idx))[:, None], cols]
        mask_np &= np.arange(crop)[None, :] < np.minimum(lengths, crop)[:, None]
    else:
        tok_np = feats.tokens[idx]
    if trim is not None and mask_np.any():
        last = min(mask_np.shape[1], int(np.flatnonzero(mask_np.any(0))[-1]) + 1 + trim)
        tok_np, mask_np = tok_np[:, :last], mask_np[:, :last]
    tokens = torch.from_numpy(np.ascontiguousarray(tok_np)).to(device).float()
    mask = torch.from_numpy(np.ascontiguousarray(mask_np)).to(device)
    target = feats.target(regulariser)
    target_t = None if target is None else torch.from_numpy(np.ascontiguousarray(target[idx])).to(device).float()
    return tokens, mask, target_t


def epoch_batches(
    feats: Features,
    config: DHIMConfig,
    rng: np.random.Generator,
    device: torch.device,
    batch_size: int | None = None,
    neighbours: np.ndarray | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """One epoch of training batches as tensors: (tokens, mask, target, pairs).

    Shuffled batches of ``batch_size`` (default: the config's) documents, or, with a
    ``neighbours`` table (see neighbour_table), anchor/neighbour pairs whose ``pairs``
    matrix marks the extra positives. Crops and padding trims follow the config.
    """
    batch_size = batch_size or config.train.batch_size
    if neighbours is None:
        batches = ((idx, None) for idx in batch_indices(len(feats), batch_size, rng))
    else:
        batches = pair_batches(len(feats), batch_size, neighbours, rng)
    trim = trim_margin(config.model)
    for idx, pairs in batches:
        tokens, mask, target = to_tensors(feats, idx, config.model.regulariser, device, trim,
                                          config.train.crop_tokens, rng)
        yield tokens, mask, target, None if pairs is None else torch.from_numpy(pairs).to(device)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    target: torch.Tensor | None,
    config: TrainConfig,
    gather: Callable | None = None,
    pairs: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimiser step on one batch; returns the loss and both MI terms."""
    model.train()
    if config.feature_dropout:
        tokens = F.dropout(tokens, config.feature_dropout)
    out = model(tokens, mask, target, config.beta, gather=gather, pairs=pairs)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return {"loss": out.loss.item(), "mi_local": out.mi_local.item(), "mi_regulariser": out.mi_regulariser.item()}


def train_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    feats: Features,
    config: DHIMConfig,
    rng: np.random.Generator,
    device: torch.device = torch.device("cpu"),
    neighbours: np.ndarray | None = None,
) -> dict[str, float]:
    """One pass over ``feats`` in shuffled batches; returns mean loss and MI terms.
    With a ``neighbours`` table (see neighbour_table), batches are anchor/neighbour pairs."""
    sums: dict[str, float] = {}
    steps = 0
    for tokens, mask, target, pairs in epoch_batches(feats, config, rng, device, neighbours=neighbours):
        for key, value in train_step(model, optimizer, tokens, mask, target, config.train, pairs=pairs).items():
            sums[key] = sums.get(key, 0.0) + value
        steps += 1
    if steps == 0:
        raise DataError(f"{len(feats)} training documents make no batch of 2; give at least 2 documents")
    return {k: v / steps for k, v in sums.items()} | {"steps": steps}


@torch.no_grad()
def hash_features(
    model: DHIM, feats: Features, batch_size: int = 512, device: torch.device = torch.device("cpu")
) -> np.ndarray:
    """Deterministic codes of cached features: packed uint8 (n, n_bits // 8)."""
    model.eval()
    out = np.empty((len(feats), model.config.n_bits // 8), dtype=np.uint8)
    trim = trim_margin(model.config)
    # Shortest documents first, so trimmed batches carry little padding.
    order = np.argsort(feats.mask.sum(1), kind="stable") if trim is not None else np.arange(len(feats))
    for start in range(0, len(feats), batch_size):
        idx = np.sort(order[start : start + batch_size])
        tokens, mask, _ = to_tensors(feats, idx, "none", device, trim)
        out[idx] = pack_codes(model.hash(tokens, mask).cpu().numpy())
    return out


class EarlyStopping:
    """Tracks the best validation value; stops after ``patience`` epochs without a better one."""

    def __init__(self, patience: int):
        self.patience = patience
        self.best = -math.inf
        self.best_epoch = -1
        self.bad_epochs = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record an epoch's value; True if it is a new best."""
        if value > self.best:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_epochs >= self.patience

    def state(self) -> dict:
        return {"best": self.best, "best_epoch": self.best_epoch, "bad_epochs": self.bad_epochs}

    def load(self, state: dict) -> None:
        self.best, self.best_epoch, self.bad_epochs = state["best"], state["best_epoch"], state["bad_epochs"]


def validate(
    model: DHIM,
    database: Features,
    database_labels: np.ndarray,
    queries: Features,
    query_labels: np.ndarray,
    k: int,
    device: torch.device = torch.device("cpu"),
) -> PrecisionResult:
    """Precision@k of the model's codes: database = training docs, queries = val docs."""
    k = min(k, len(database))
    return precision_at_k(
        hash_features(model, database, device=device), database_labels,
        hash_features(model, queries, device=device), query_labels, k,
    )


@dataclass
class FitResult:
    model: DHIM
    config: DHIMConfig
    history: list[dict] = field(default_factory=list)
    best_epoch: int = -1
    best_precision: float | None = None
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "best_epoch": self.best_epoch,
            "epochs_run": len(self.history),
            "best_val_precision_at_k_tie_aware": self.best_precision,
            "train_seconds": round(self.seconds, 2),
        }


def build_model(config: DHIMConfig, device: torch.device = torch.device("cpu")) -> DHIM:
    seed_everything(config.train.seed)
    return DHIM(config.model).to(device)


def fit(
    train: Features,
    val: Features | None,
    config: DHIMConfig,
    train_labels: np.ndarray | None = None,
    val_labels: np.ndarray | None = None,
    progress: bool = True,
    device: str | torch.device = "cpu",
    on_epoch: Callable[[dict], None] | None = None,
) -> FitResult:
    """Train DHIM on cached features, single process.

    Model selection: each epoch, the val codes are searched against the train
    codes (at most ``max_select_database`` of them) and the tie-aware precision@k
    decides; the best epoch's weights are returned. Without labels, it trains ``max_epochs`` and keeps the last.
    """
    device = torch.device(device)
    if train.tokens.shape[-1] != config.model.hidden_size:
        raise ConfigError(
            f"features of width {train.tokens.shape[-1]} do not match hidden_size {config.model.hidden_size}"
        )
    model = build_model(config, device)
    if config.model.init == "itq":
        init_from_itq(model, train, config.train.seed)
    table = neighbour_table(train.mean, config.train.neighbours) if config.train.neighbours else None
    optimizer = torch.optim.Adam(model.parameters(), lr=config.train.lr)
    rng = np.random.default_rng(config.train.seed)
    selecting = val is not None and train_labels is not None and val_labels is not None
    if selecting:
        database, database_labels = selection_sample(train, train_labels, config.train)
    stopper = EarlyStopping(config.train.patience)
    best_state = None
    result = FitResult(model, config)
    start = time.perf_counter()
    bar = tqdm(range(config.train.max_epochs), desc=f"train {config.model.n_bits}b", unit="epoch", disable=not progress)
    for epoch in bar:
        t0 = time.perf_counter()
        stats = train_epoch(model, optimizer, train, config, rng, device, table)
        record = {"epoch": epoch, **stats}
        if selecting:
            p = validate(model, database, database_labels, val, val_labels, config.train.k, device)
            record["val_precision"] = p.precision_at_k_tie_aware
            if stopper.update(p.precision_at_k_tie_aware, epoch):
                best_state = copy.deepcopy(model.state_dict())
        record["seconds"] = time.perf_counter() - t0
        result.history.append(record)
        bar.set_postfix(loss=f"{stats['loss']:.4f}", val_p=f"{record.get('val_precision', float('nan')):.4f}",
                        best=f"{stopper.best:.4f}" if selecting else "-")
        if on_epoch:
            on_epoch(record)
        if selecting and stopper.should_stop:
            break
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
        result.best_epoch, result.best_precision = stopper.best_epoch, stopper.best
    else:
        result.best_epoch = len(result.history) - 1
    result.seconds = time.perf_counter() - start
    model.eval()
    return result
