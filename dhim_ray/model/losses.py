"""Jensen-Shannon mutual-information estimator over in-batch negatives (torch only). A worker
scores its own local codes against *all* global codes of the batch (``global_codes``, gathered
with autograd); ``own_index`` says where its documents sit in it (one worker: ``arange(n)``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def jsd_mi(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor,
    score_sigmoid: bool = False,
) -> torch.Tensor:
    """Jensen-Shannon MI lower bound, E_pos[-softplus(-s)] - E_neg[softplus(s)], over ``scores``
    (n, N, T) of n documents' local codes against N global codes; ``positive`` (n, N) marks each
    document's own, ``valid`` (n, T) its words; each document's negatives weigh 1/(N-1).
    ``score_sigmoid``: the reference code's squash (bounded, admits the all-zero solution)."""
    if score_sigmoid:
        scores = torch.sigmoid(scores)
    weight = valid[:, None, :].to(scores.dtype)  # (n, 1, T)
    pos_w = positive[:, :, None].to(scores.dtype) * weight  # (n, N, T)
    neg_w = (~positive)[:, :, None].to(scores.dtype) * weight
    e_pos = (-F.softplus(-scores) * pos_w).sum() / pos_w.sum().clamp_min(1)
    e_neg = (F.softplus(scores) * neg_w).sum() / neg_w.sum().clamp_min(1)
    return e_pos - e_neg


def bilinear_scores(local_codes: torch.Tensor, global_codes: torch.Tensor, weight: torch.nn.Linear) -> torch.Tensor:
    """D(b, B) = b^T W B for every local code against every global code.

    local_codes (n, T, bits), global_codes (N, bits) -> scores (n, N, T).
    """
    projected = weight(global_codes)  # (N, bits)
    return torch.einsum("ntb,mb->nmt", local_codes, projected)
