"""Checkpoints: a folder with config.json and model.safetensors (nothing unpickles).

config.json holds the DHIMConfig, the encoder it was trained on (name, hidden
size, fingerprint), the format version and the training summary, so loading
rebuilds the model from the folder alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .config import DHIMConfig
from .errors import CheckpointError, ConfigError
from .model import DHIM

FORMAT = "dhim-ray/checkpoint"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_checkpoint(
    path: str | Path,
    model: DHIM,
    config: DHIMConfig,
    encoder_fingerprint: str = "",
    summary: dict[str, Any] | None = None,
) -> Path:
    """Write ``path/config.json`` and ``path/model.safetensors`` (atomically per file)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "encoder": {
            "name": config.features.encoder,
            "hidden_size": config.model.hidden_size,
            "fingerprint": encoder_fingerprint,
        },
        "summary": summary or {},
    }
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = path / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": FORMAT})
    os.replace(tmp, path / WEIGHTS_FILE)
    tmp = path / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, path / CONFIG_FILE)
    return path


def is_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint, validated; raises CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path}: no such folder; pass the --out folder of a finished 'dhim-ray train'")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: is a file; pass the folder that holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path}: missing {name}; the run may not have finished, train again")
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is corrupt ({exc}); train again or restore it") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is not a dhim-ray checkpoint config")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format version {meta['format_version']} is newer than this dhim-ray "
            f"({FORMAT_VERSION}); upgrade dhim-ray"
        )
    return meta


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> tuple[DHIM, DHIMConfig, dict[str, Any]]:
    """Rebuild the model from a checkpoint folder.

    Returns (model in eval mode, config, metadata). Raises CheckpointError for a
    missing, incomplete, corrupt or incompatible checkpoint.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    meta = read_meta(path)
    try:
        config = DHIMConfig.from_dict(meta["config"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path}: config is invalid ({exc})") from exc
    try:
        state = load_file(str(path / WEIGHTS_FILE), device=map_location)
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: {WEIGHTS_FILE} is corrupt ({exc}); train again or restore it") from exc
    model = DHIM(config.model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(f"checkpoint {path}: weights do not match its config ({first})") from exc
    return model.eval(), config, meta


# ---- resumable training state (per-epoch checkpoints of distributed runs) --------------
STATE_FILE = "train_state.safetensors"
STATE_META = "train_state.json"


def save_training_state(
    path: str | Path,
    model: DHIM,
    config: DHIMConfig,
    optimizer: torch.optim.Optimizer,
    best_state: dict[str, torch.Tensor] | None,
    progress: dict[str, Any],
    encoder_fingerprint: str = "",
) -> Path:
    """A checkpoint folder that also resumes training: current weights (config.json +
    model.safetensors, loadable as usual), the best weights so far, Adam's moments and
    the loop's progress (epoch, early-stopping state, history). No pickle."""
    from safetensors.torch import save_file

    path = save_checkpoint(path, model, config, encoder_fingerprint, {"epoch": progress.get("epoch")})
    tensors: dict[str, torch.Tensor] = {}
    steps: dict[str, float] = {}
    for i, (param, state) in enumerate(_adam_states(optimizer)):
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"optim.{i}.{key}"] = state[key].detach().cpu().contiguous()
        if "step" in state:
            steps[str(i)] = float(state["step"])
    for key, value in (best_state or {}).items():
        tensors[f"best.{key}"] = value.detach().cpu().contiguous()
    save_file(tensors, str(path / STATE_FILE))
    (path / STATE_META).write_text(json.dumps({"progress": progress, "optim_steps": steps}, default=float))
    return path


def _adam_states(optimizer: torch.optim.Optimizer):
    for group in optimizer.param_groups:
        for param in group["params"]:
            yield param, optimizer.state.get(param, {})


def load_training_state(path: str | Path, model: DHIM, optimizer: torch.optim.Optimizer) -> tuple[dict, dict | None]:
    """Restore weights and Adam state saved by save_training_state.

    Returns (progress, best_state or None). Raises CheckpointError if the folder
    holds no training state.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / STATE_FILE).is_file() or not (path / STATE_META).is_file():
        raise CheckpointError(f"{path}: no training state ({STATE_FILE}); it is not a resumable dhim-ray run")
    loaded, _, _ = load_checkpoint(path)
    model.load_state_dict(loaded.state_dict())
    tensors = load_file(str(path / STATE_FILE))
    meta = json.loads((path / STATE_META).read_text())
    for i, (param, _) in enumerate(_adam_states(optimizer)):
        if f"optim.{i}.exp_avg" in tensors:
            optimizer.state[param] = {
                "step": torch.tensor(meta["optim_steps"].get(str(i), 0.0)),
                "exp_avg": tensors[f"optim.{i}.exp_avg"].to(param.device),
                "exp_avg_sq": tensors[f"optim.{i}.exp_avg_sq"].to(param.device),
            }
    best = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")} or None
    return meta["progress"], best
