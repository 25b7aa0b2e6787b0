"""Inference in the model's room: cached or freshly encoded features -> the DHIM head's
logits, codes and scores. Training, the Hasher and evaluation all threshold here."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from dhim_ray.codes import pack_codes
from dhim_ray.encoding.encoder import Features
from dhim_ray.model.dhim import DHIM


def query_scores(logits: np.ndarray, alpha: float) -> np.ndarray:
    """Pre-threshold global logits (n, bits) -> scores in (-1, 1): 2 sigmoid(logit / alpha) - 1."""
    return np.tanh(np.asarray(logits, dtype=np.float32) / (2 * alpha))


def to_tensors(
    feats: Features,
    idx: np.ndarray,
    regulariser: str,
    device: torch.device,
    trim: int | None = None,
    crop: int = 0,
    rng: np.random.Generator | None = None,
):
    """Cached features -> (tokens (B,T,H) float32, mask (B,T), target (B,H) or None). ``trim``: cut
    padding past the last word but ``trim`` positions (codes unchanged where padding is masked);
    ``crop`` > 0: a random window of that many word positions per document (needs ``rng``)."""
    mask_np = feats.mask[idx]
    tok_np = feats.tokens[idx]  # a numpy array, or the batch's rows read from a FeatureStore
    if crop:
        lengths = mask_np.sum(1)
        starts = (rng.random(len(idx)) * np.maximum(lengths - crop + 1, 1)).astype(np.int64)
        cols = np.minimum(starts[:, None] + np.arange(crop)[None, :], mask_np.shape[1] - 1)
        rows = np.arange(len(idx))[:, None]
        tok_np, mask_np = tok_np[rows, cols], mask_np[rows, cols]
        mask_np &= np.arange(crop)[None, :] < np.minimum(lengths, crop)[:, None]
    if trim is not None and mask_np.any():
        last = min(mask_np.shape[1], int(np.flatnonzero(mask_np.any(0))[-1]) + 1 + trim)
        tok_np, mask_np = tok_np[:, :last], mask_np[:, :last]
    tokens = torch.from_numpy(np.ascontiguousarray(tok_np)).to(device).float()
    mask = torch.from_numpy(np.ascontiguousarray(mask_np)).to(device)
    target = feats.target(regulariser)
    target_t = None if target is None else torch.from_numpy(np.ascontiguousarray(target[idx])).to(device).float()
    return tokens, mask, target_t


@torch.no_grad()
def global_logits(model: DHIM, feats: Features, batch_size: int,
                   device: torch.device) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(document indices, their global logits) a batch at a time, in eval mode."""
    model.eval()
    if isinstance(feats.tokens, torch.Tensor):  # one encoder batch, still on the encoder's device
        yield np.arange(len(feats)), model.global_logits(feats.tokens.to(device).float(), feats.mask.to(device))
        return
    trim = model.config.pad_reach
    # Shortest documents first, so trimmed batches carry little padding.
    order = np.argsort(feats.mask.sum(1), kind="stable") if trim is not None else np.arange(len(feats))
    for start in range(0, len(feats), batch_size):
        idx = np.sort(order[start : start + batch_size])
        tokens, mask, _ = to_tensors(feats, idx, "none", device, trim)
        yield idx, model.global_logits(tokens, mask)


def hash_features(
    model: DHIM, feats: Features, batch_size: int = 512, device: torch.device = torch.device("cpu")
) -> np.ndarray:
    """Deterministic codes of cached features: packed uint8 (n, n_bits // 8)."""
    out = np.empty((len(feats), model.config.n_bits // 8), dtype=np.uint8)
    for idx, logits in global_logits(model, feats, batch_size, device):
        out[idx] = pack_codes((logits > 0).to(torch.uint8).cpu().numpy())
    return out


def score_features(
    model: DHIM, feats: Features, batch_size: int = 512, device: torch.device = torch.device("cpu")
) -> tuple[np.ndarray, np.ndarray]:
    """(packed codes, pre-threshold scores (n, bits) float32 in (-1, 1)) of cached features:
    the scores are what asymmetric re-ranking compares candidates' bits with (dhim_ray.retrieval.rerank)."""
    codes = np.empty((len(feats), model.config.n_bits // 8), dtype=np.uint8)
    scores = np.empty((len(feats), model.config.n_bits), dtype=np.float32)
    for idx, logits in global_logits(model, feats, batch_size, device):
        codes[idx] = pack_codes((logits > 0).to(torch.uint8).cpu().numpy())
        scores[idx] = query_scores(logits.float().cpu().numpy(), model.config.alpha)
    return codes, scores
