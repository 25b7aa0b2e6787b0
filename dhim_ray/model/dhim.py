"""The DHIM hashing head (torch only): token features -> windowed convolutions -> local logits
per position, global logit = their masked mean -> Bernoulli(sigmoid(logit / alpha)) codes with
a straight-through gradient. Training maximises the JSD MI between a document's global code
and its own local codes, plus ``beta`` x MI with a sentence-level target (docs/training.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dhim_ray.config import ModelConfig
from dhim_ray.encoding.transforms import build_transform
from dhim_ray.model.losses import bilinear_scores, jsd_mi


def bernoulli_straight_through(logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """Sample codes 1[p > u], p = sigmoid(logits / alpha); the backward pass
    hands the gradient to p unchanged (straight-through estimator)."""
    p = torch.sigmoid(logits / alpha)
    hard = (p > torch.rand_like(p)).to(p.dtype)
    return p + (hard - p).detach()


@dataclass
class DHIMOutput:
    loss: torch.Tensor
    mi_local: torch.Tensor
    mi_regulariser: torch.Tensor


class DHIM(nn.Module):
    """DHIM head. Inputs are cached encoder outputs, never raw text."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        h, k, bits = config.hidden_size, config.n_filters, config.head_bits
        self.convs = nn.ModuleList(nn.Conv1d(h, k, w, padding=w // 2) for w in config.windows)
        self.proj = nn.Linear(k * len(config.windows), bits)
        # Optional linear path: its mean over positions is a linear code of the mean token
        # feature, so it can start as ITQ (init_linear_path) and the CNN learns the rest.
        self.linear = nn.Linear(h, bits) if config.linear_path else None
        # The reference code reuses `proj` on the 768-d [CLS] only because 3 x 256 = 768.
        self.target_proj = None if config.shared_cls_projection else nn.Linear(h, bits)
        self.disc_local = nn.Linear(bits, bits, bias=False)
        self.disc_target = nn.Linear(bits, bits, bias=False)
        # Fitted on the training corpus before training (training.fit_transforms), never trained:
        # kept here so a checkpoint holds the transform its training used.
        self.target_transform = build_transform(config.target_transform, h)
        # The identity bits: a fixed linear code of the mean word feature (ITQ, fitted with the
        # transforms by training.fit_transforms), appended to the head's bits
        r = config.identity_bits
        self.register_buffer("identity_weight", torch.zeros(r, h) if r else None)
        self.register_buffer("identity_bias", torch.zeros(r) if r else None)

    # ---- codes -------------------------------------------------------------
    def local_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, H) -> local logits (B, T, bits)."""
        x = tokens.transpose(1, 2)  # (B, H, T) for Conv1d
        h = torch.cat([torch.relu(conv(x)) for conv in self.convs], dim=1)  # (B, K*w, T)
        logits = self.proj(h.transpose(1, 2))  # (B, T, bits)
        return logits if self.linear is None else logits + self.linear(tokens)

    def _positions(self, mask: torch.Tensor) -> torch.Tensor:
        # Paper code: every position (incl. [SEP]/[PAD]) counts as a word.
        return mask if self.config.mask_padding else torch.ones_like(mask)

    @staticmethod
    def _readout(local_logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Masked mean over positions; equals proj(mean h) since proj is affine."""
        w = positions.to(local_logits.dtype)[:, :, None]  # (B, T, 1)
        return (local_logits * w).sum(1) / w.sum(1).clamp_min(1)  # (B, bits)

    def global_logits(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, H), mask (B, T) -> global logits (B, n_bits). 1[logit > 0] is the code:
        the head's bits, then the identity bits."""
        head = self.head_logits(tokens, mask)
        if self.identity_weight is None:
            return head
        return torch.cat([head, self.identity_logits(tokens, mask)], dim=1)

    def head_logits(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, H), mask (B, T) -> the head's global logits (B, head_bits)."""
        return self._readout(self.local_logits(tokens), self._positions(mask))

    def identity_logits(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, H), mask (B, T) -> the identity bits' logits (B, identity_bits): the
        fixed projection of the mean over word positions."""
        return self._readout(tokens, mask) @ self.identity_weight.T + self.identity_bias

    @torch.no_grad()
    def set_identity(self, weight, bias) -> None:
        """Set the identity bits' projection (identity_bits, H) and bias (identity_bits,)."""
        self.identity_weight.copy_(torch.as_tensor(weight, dtype=self.identity_weight.dtype))
        self.identity_bias.copy_(torch.as_tensor(bias, dtype=self.identity_bias.dtype))

    def _target_logits(self, target: torch.Tensor) -> torch.Tensor:
        if self.target_transform is not None:
            target = self.target_transform(target)
        if self.target_proj is None:
            return self.proj(target)
        return self.target_proj(target)

    @torch.no_grad()
    def init_linear_path(self, weight, bias, conv_scale: float = 0.1) -> None:
        """Start the linear path at a given projection (bits, H) and bias (bits,), e.g. ITQ's,
        and shrink the CNN's projection so the codes start as that projection's."""
        if self.linear is None:
            raise ValueError("init_linear_path needs ModelConfig(linear_path=True)")
        self.linear.weight.copy_(torch.as_tensor(weight, dtype=self.linear.weight.dtype))
        self.linear.bias.copy_(torch.as_tensor(bias, dtype=self.linear.bias.dtype))
        self.proj.weight.mul_(conv_scale)
        self.proj.bias.mul_(conv_scale)

    # ---- training ----------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        target: torch.Tensor | None,
        beta: float,
        gather=None,
        pairs: torch.Tensor | None = None,
    ) -> DHIMOutput:
        """Training loss for a batch: ``tokens`` (n, T, H), ``mask`` (n, T) True at words, ``target``
        (n, H) or None, ``beta`` the regulariser's weight. ``gather``: all-gathers global codes across
        workers with autograd (negatives span the global batch; None: this batch); ``pairs``: (n, n)
        bool extra positives."""
        cfg = self.config
        positions = self._positions(mask)
        local = self.local_logits(tokens)  # (n, T, bits)
        local_codes = bernoulli_straight_through(local, cfg.alpha)
        global_logits = self._readout(local, positions)  # (n, bits)
        global_codes = bernoulli_straight_through(global_logits, cfg.alpha)  # (n, bits)
        if gather is None:
            all_global, own = global_codes, torch.arange(len(tokens), device=tokens.device)
        else:
            all_global, own = gather(global_codes)
        positive = torch.zeros(len(tokens), len(all_global), dtype=torch.bool, device=tokens.device)
        positive[torch.arange(len(tokens), device=tokens.device), own] = True
        if pairs is not None:
            positive[:, own] |= pairs

        scores = bilinear_scores(local_codes, all_global, self.disc_local)  # (n, N, T)
        mi_local = jsd_mi(scores, positive, positions, cfg.score_sigmoid)

        if cfg.regulariser == "none" or target is None or beta == 0:
            mi_reg = torch.zeros((), device=tokens.device)
        else:
            target_codes = bernoulli_straight_through(self._target_logits(target), cfg.alpha)  # (n, bits)
            reg_scores = bilinear_scores(target_codes[:, None, :], all_global, self.disc_target)  # (n, N, 1)
            ones = torch.ones(len(tokens), 1, dtype=torch.bool, device=tokens.device)
            mi_reg = jsd_mi(reg_scores, positive, ones, cfg.score_sigmoid)
        loss = -(mi_local + beta * mi_reg)
        return DHIMOutput(loss=loss, mi_local=mi_local.detach(), mi_regulariser=mi_reg.detach())
