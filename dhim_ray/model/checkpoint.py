"""Checkpoints: a folder with config.json and model.safetensors (nothing unpickles).

config.json holds the DHIMConfig, the encoder it was trained on (name, hidden
size, fingerprint), the format version and the training summary, so loading
rebuilds the model from the folder alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dhim_ray.config import DHIMConfig
from dhim_ray.errors import CheckpointError, ConfigError, first_line

if TYPE_CHECKING:  # reading a checkpoint's config needs no torch (a one-shot search never loads it)
    import torch

    from dhim_ray.model.dhim import DHIM

FORMAT = "dhim-ray/checkpoint"
#: The layout of config.json (with weights_sha256) and its config; another is refused in one line.
FORMAT_VERSION = 4
#: The one older format read, and how: 3 also held train.feature_dropout, a retired training lever.
UPGRADES = {3: lambda sections: sections.get("train", {}).pop("feature_dropout", None)}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's config.json says, validated: read without loading weights."""

    path: Path
    config: DHIMConfig
    encoder_name: str
    encoder_fingerprint: str
    weights_sha256: str  # "" for checkpoints written before digests were recorded
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def n_bits(self) -> int:
        return self.config.model.n_bits

    @property
    def model_id(self) -> str:
        """A stable id of the weights, stamped on every collection ingested with them."""
        return f"dhim:{(self.weights_sha256 or file_sha256(self.path / WEIGHTS_FILE))[:16]}"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_writable(path: str | Path) -> Path:
    """Fail before any work when ``path`` cannot become a checkpoint folder: it is a
    file, lies under a file, or cannot be written. Creates the folder."""
    path = Path(path)
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            raise CheckpointError(f"out={path}: {parent} is a file, not a folder; pick another output folder", field="out")
        if parent.exists():
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"out={path}: cannot write there ({exc.strerror or exc}); pick a writable folder", field="out") from exc
    return path


def check_checkpoint_folder(path: str | Path) -> Path:
    """``check_writable``, and refuse a folder that holds something other than a dhim-ray
    checkpoint under the names a checkpoint writes (a Hugging Face model, a
    fine-tuned encoder): saving there would overwrite its config.json and weights."""
    path = check_writable(path)
    config = path / CONFIG_FILE
    if not config.exists():
        if (path / WEIGHTS_FILE).exists():
            raise CheckpointError(f"out={path} holds a {WEIGHTS_FILE} without a dhim-ray config.json; writing a "
                                  "checkpoint there would overwrite it; pick an empty folder", field="out")
        return path
    try:
        ours = json.loads(config.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise CheckpointError(f"out={path} holds a {CONFIG_FILE} that is not a dhim-ray checkpoint's (another model?); "
                              "writing there would overwrite it; pick an empty folder", field="out")
    return path


def save_checkpoint(
    path: str | Path,
    model: DHIM | dict[str, torch.Tensor],
    config: DHIMConfig,
    encoder_fingerprint: str = "",
    summary: dict[str, Any] | None = None,
) -> Path:
    """Write ``path/model.safetensors`` then ``path/config.json`` (each atomically);
    config.json records the weights' SHA-256, checked on every load. ``model`` is the
    model or its state dict."""
    from safetensors.torch import save_file

    path = check_checkpoint_folder(path)
    weights = model if isinstance(model, dict) else model.state_dict()
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    tmp = path / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": FORMAT})
    digest = file_sha256(tmp)
    os.replace(tmp, path / WEIGHTS_FILE)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "encoder": {
            "name": config.features.encoder,
            "hidden_size": config.model.hidden_size,
            "fingerprint": encoder_fingerprint,
        },
        "weights_sha256": digest,
        "summary": summary or {},
    }
    tmp = path / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=_json_default))
    os.replace(tmp, path / CONFIG_FILE)
    return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """config.json of a checkpoint, validated through the config dataclasses (weights
    not loaded). Raises CheckpointError saying what is wrong and how to fix it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path}: no such folder; pass the folder a finished 'dhim-ray train' wrote (its out)")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: is a file; pass the folder that holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    inside = sorted(p.name for p in path.iterdir() if (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file())
    if inside and not (path / CONFIG_FILE).exists():
        raise CheckpointError(f"checkpoint {path}: a folder of models ({', '.join(inside[:5])}); pass one of them, "
                              f"e.g. {path / inside[0]}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path}: missing {name}; the run may not have finished, train again")
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is corrupt ({exc}); train again or restore it") from exc
    except (RecursionError, ValueError):  # brackets nested past the parser's depth, an integer of 4,300+ digits
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is not a config dhim-ray wrote (nested too deeply "
                              "or a number too long); train again or restore it") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} is not a dhim-ray checkpoint config")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version != FORMAT_VERSION and version not in UPGRADES:
        raise CheckpointError(f"checkpoint {path}: format version {version!r} and this dhim-ray reads {FORMAT_VERSION}; "
                              + ("upgrade dhim-ray" if isinstance(version, int) and version > FORMAT_VERSION else
                                 "train the model again with this version (dhim-ray train)"))
    sections = meta.get("config")
    if not isinstance(sections, dict) or not all(isinstance(sections.get(s), dict) for s in ("model", "features")):
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} has no model/features config; train again")
    if version in UPGRADES and isinstance(sections.get("train", {}), dict):
        UPGRADES[version](sections)
    try:
        config = DHIMConfig.from_dict(sections)
    except (ConfigError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} holds an invalid config ({exc}); train again") from exc
    if not (isinstance(meta.get("weights_sha256"), str) and len(meta["weights_sha256"]) == 64):
        raise CheckpointError(f"checkpoint {path}: {CONFIG_FILE} has no weights_sha256, so its weights cannot be "
                              "checked; restore config.json from the run or train again")
    encoder = meta.get("encoder") if isinstance(meta.get("encoder"), dict) else {}
    summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
    return CheckpointInfo(path, config, str(encoder.get("name", config.features.encoder)),
                          str(encoder.get("fingerprint", "")), str(meta.get("weights_sha256", "")), summary)


def verify_weights(info: CheckpointInfo) -> None:
    """The weights file must be the one config.json recorded (flipped bytes, a partial
    copy or a file from another run are refused)."""
    if info.weights_sha256 and file_sha256(info.path / WEIGHTS_FILE) != info.weights_sha256:
        raise CheckpointError(
            f"checkpoint {info.path}: {WEIGHTS_FILE} does not match the SHA-256 recorded in {CONFIG_FILE} "
            "(corrupt or replaced); restore the folder or train again"
        )


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> tuple[DHIM, DHIMConfig, CheckpointInfo]:
    """Rebuild the model from a checkpoint folder.

    Returns (model in eval mode, config, checkpoint info). Raises CheckpointError for
    a missing, incomplete, corrupt, modified or incompatible checkpoint.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    info = read_checkpoint(path)
    path = info.path
    verify_weights(info)
    try:
        state = load_file(str(path / WEIGHTS_FILE), device=map_location)
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: {WEIGHTS_FILE} is corrupt ({exc}); train again or restore it") from exc
    from dhim_ray.model.dhim import DHIM

    model = DHIM(info.config.model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {path}: weights do not match its config ({first_line(exc)})") from exc
    return model.eval(), info.config, info


# ---- resumable training state --------------------------------------------------------
# A run folder is always a loadable checkpoint of the best weights so far (config.json +
# model.safetensors); these two files beside them hold what resuming needs: the current
# weights, Adam's moments and the loop's progress. No pickle.
STATE_FILE = "train_state.safetensors"
STATE_META = "train_state.json"


def has_training_state(path: str | Path) -> bool:
    return (Path(path) / STATE_FILE).is_file() and (Path(path) / STATE_META).is_file()


def save_training_state(
    path: str | Path,
    model: DHIM,
    config: DHIMConfig,
    optimizer: torch.optim.Optimizer,
    best_state: dict[str, torch.Tensor] | None,
    progress: dict[str, Any],
    encoder_fingerprint: str = "",
    summary: dict[str, Any] | None = None,
) -> Path:
    """Write a resumable checkpoint: the best weights so far (or the current ones before
    any model selection) as the loadable checkpoint, then the current weights, Adam
    state and ``progress`` (JSON) beside them. The state files go last, so a folder with
    them always has a matching checkpoint."""
    from safetensors.torch import save_file

    current = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # a state dict, not a new DHIM: building one would draw from torch's RNG mid-run
    path = save_checkpoint(path, best_state if best_state is not None else current, config, encoder_fingerprint, summary or {"epoch": progress.get("epoch")})
    tensors: dict[str, torch.Tensor] = {f"current.{k}": v for k, v in current.items()}
    steps: dict[str, float] = {}
    for i, (_, state) in enumerate(_adam_states(optimizer)):
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"optim.{i}.{key}"] = state[key].detach().cpu().contiguous()
        if "step" in state:
            steps[str(i)] = float(state["step"])
    tmp = path / (STATE_FILE + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path / STATE_FILE)
    meta = {"progress": progress, "optim_steps": steps, "has_best": best_state is not None}
    tmp = path / (STATE_META + ".tmp")
    tmp.write_text(json.dumps(meta, default=_json_default))
    os.replace(tmp, path / STATE_META)
    return path


def clear_training_state(path: str | Path) -> None:
    """Remove the resume files of a finished run (its checkpoint stays)."""
    for name in (STATE_FILE, STATE_META):
        Path(path, name).unlink(missing_ok=True)


def _adam_states(optimizer: torch.optim.Optimizer):
    for group in optimizer.param_groups:
        for param in group["params"]:
            yield param, optimizer.state.get(param, {})


def load_training_state(
    path: str | Path, model: DHIM, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Restore the current weights and Adam state saved by save_training_state.

    Returns (progress, best weights or None). Raises CheckpointError if the folder
    holds no (or a broken) training state.
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not has_training_state(path):
        raise CheckpointError(f"{path}: no training state ({STATE_FILE}); it is not a resumable dhim-ray run")
    best_model, _, _ = load_checkpoint(path)
    try:
        tensors = load_file(str(path / STATE_FILE))
        meta = json.loads((path / STATE_META).read_text())
        current = {k[len("current."):]: v for k, v in tensors.items() if k.startswith("current.")}
        model.load_state_dict(current)
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: the training state is corrupt ({str(exc)[:200]}); start a new run") from exc
    for i, (param, _) in enumerate(_adam_states(optimizer)):
        if f"optim.{i}.exp_avg" in tensors:
            optimizer.state[param] = {
                "step": torch.tensor(meta["optim_steps"].get(str(i), 0.0)),
                "exp_avg": tensors[f"optim.{i}.exp_avg"].to(param.device),
                "exp_avg_sq": tensors[f"optim.{i}.exp_avg_sq"].to(param.device),
            }
    best = {k: v.clone() for k, v in best_model.state_dict().items()} if meta.get("has_best") else None
    return meta["progress"], best
