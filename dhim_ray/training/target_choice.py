"""``target_transform="auto"``: train DHIM once per candidate regulariser target (the
plain sentence vector and its whitened form) on the same features and keep the model
whose chosen epoch scores higher on the validation slice that already picks epochs.

Which target wins depends on the corpus (the whitened one wins every 20ng seed at 16 bits
and loses on agnews); the slice picked the better one on 7 of 11 pairs measured, +1.3
points over the plain target on average (docs/experiments.md). It costs one training per
candidate; the features are computed once. While it runs, ``OUT/targets/<target>`` holds each candidate's run (finished ones
are kept across ``--resume``); at the end the winner is saved to ``OUT`` with both
scores in its summary, and the candidates are removed. The saved model holds the chosen
target, so eval, ingest and search read it like any other.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dhim_ray.config import AUTO_TARGET, AUTO_TARGET_CANDIDATES, DHIMConfig
from dhim_ray.errors import CheckpointError, ConfigError
from dhim_ray.model.checkpoint import CONFIG_FILE, has_training_state, load_checkpoint, read_checkpoint, save_checkpoint
from dhim_ray.model.dhim import DHIM

logger = logging.getLogger(__name__)

CANDIDATES_DIR = "targets"
#: The summary field holding the chosen epoch's score, by selection criterion.
SLICE_SCORE = {"labels": "best_val_precision_at_k_tie_aware", "neighbours": "best_val_neighbour_recall_at_k"}

#: train_one(candidate config, its folder, resume it?) -> the run summary; it leaves a checkpoint in the folder.
TrainOne = Callable[[DHIMConfig, Path, bool], dict[str, Any]]


def is_auto(config: DHIMConfig) -> bool:
    return config.model.target_transform == AUTO_TARGET


def check_auto(config: DHIMConfig) -> None:
    """Refuse a selection that cannot compare the candidates, before any work."""
    if config.train.select == "objective":
        raise ConfigError("model.target_transform=auto compares the targets' val scores, but --select objective scores "
                          "each by its own loss: select by labels or neighbours, or name the target")


def candidates_folder(out: str | Path) -> Path:
    return Path(out) / CANDIDATES_DIR


def unfinished(out: str | Path) -> bool:
    """Whether ``out`` holds an interrupted auto run (its candidates' folder)."""
    return candidates_folder(out).is_dir()


def _finished(folder: Path) -> bool:
    return (folder / CONFIG_FILE).is_file() and not has_training_state(folder)


def slice_score(summary: dict[str, Any]) -> float:
    """The validation slice's score of a run's chosen epoch, under the run's criterion."""
    key = SLICE_SCORE.get(summary.get("criterion") or "")
    if key is None or summary.get(key) is None:
        raise ConfigError(f"model.target_transform=auto needs a val score to compare targets; this run was selected by "
                          f"{summary.get('selected_by')!r}: name the target instead")
    return float(summary[key])


def train_each_target(config: DHIMConfig, out: str | Path, train_one: TrainOne,
                      resume: bool = False) -> tuple[DHIM, DHIMConfig, dict[str, Any]]:
    """Train every candidate target with ``train_one`` into ``out/targets/<target>``, save
    the one with the higher slice score (a tie keeps the plain target) to ``out``, and
    remove the candidates. With ``resume`` finished candidates are kept and an
    interrupted one continues. Returns (model, its config, its summary)."""
    out = Path(out)
    folder = candidates_folder(out)
    summaries: dict[str, dict[str, Any]] = {}
    for i, target in enumerate(AUTO_TARGET_CANDIDATES, 1):
        sub = folder / target
        if resume and _finished(sub):
            summaries[target] = read_checkpoint(sub).summary
            logger.info("regulariser target %s: finished before the interruption, kept", target)
            continue
        logger.info("regulariser target %s (%d of %d)", target, i, len(AUTO_TARGET_CANDIDATES))
        candidate = config.replace(model={"target_transform": target})
        summaries[target] = train_one(candidate, sub, resume and has_training_state(sub))
    scores = {target: slice_score(summary) for target, summary in summaries.items()}
    chosen = max(AUTO_TARGET_CANDIDATES, key=lambda t: scores[t])  # max keeps the first of equals: "none"
    model, chosen_config, info = load_checkpoint(folder / chosen)
    summary = {**summaries[chosen], "target_transform": {
        "chosen": chosen, "selected_by": summaries[chosen].get("selected_by"), "scores": scores,
        "best_epochs": {t: s.get("best_epoch") for t, s in summaries.items()},
        "epochs_run": {t: s.get("epochs_run") for t, s in summaries.items()},
    }}
    logger.info("regulariser target: %s (%s)", chosen,
                ", ".join(f"{t} {scores[t]:.4f}" for t in AUTO_TARGET_CANDIDATES))
    save_checkpoint(out, model, chosen_config, info.encoder_fingerprint, summary)
    shutil.rmtree(folder, ignore_errors=True)
    return model, chosen_config, summary


def check_resume(out: str | Path, resume: bool) -> None:
    """An auto run resumes only an interrupted auto run, and never overwrites one unasked."""
    if resume and not unfinished(out):
        raise CheckpointError(f"resume={out}: no unfinished run there (it finished, or never started)")
    if not resume and unfinished(out):
        raise CheckpointError(f"out={out} holds an unfinished model.target_transform=auto run; continue it with --resume "
                              "or pick another --out")
