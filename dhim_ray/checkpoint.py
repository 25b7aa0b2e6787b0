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
