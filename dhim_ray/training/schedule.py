"""The training schedule's rules, free of torch: early stopping and the label-free
criterion's warm-up (what a bench replays from recorded histories, without training)."""

from __future__ import annotations

import math

from dhim_ray.config import TrainConfig


def selection_warmup(criterion: str | None, config: TrainConfig) -> int:
    """Epochs the criterion does not pick from. The label-free criterion rewards codes that
    keep the encoder's cosine geometry, and early epochs (an ITQ start above all) are
    closest to it before training moves the codes towards the corpus' structure
    (docs/experiments.md, "Model selection"): it waits ``patience`` epochs."""
    return min(config.patience, config.max_epochs - 1) if criterion == "neighbours" else 0


class EarlyStopping:
    """Tracks the best validation value; stops after ``patience`` epochs without a better one.
    Epochs before ``warmup`` are not candidates (and do not count towards patience)."""

    def __init__(self, patience: int, warmup: int = 0):
        self.patience = patience
        self.warmup = warmup
        self.best = -math.inf
        self.best_epoch = -1
        self.bad_epochs = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record an epoch's value; True if it is a new best."""
        if epoch < self.warmup:
            return False
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
