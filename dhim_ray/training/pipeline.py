"""Training, orchestrated once: read the corpus, compute features, resume, the summary and
the save (no Ray, no Milvus). Where the epochs run is a ``TrainBackend``: this process
(``InProcess``) or Ray Train workers (dhim_ray.jobs.train.RayTrain)."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dhim_ray.config import DHIMConfig, FeatureConfig
from dhim_ray.corpus.data import Split, load_corpus
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.encoding.encoder import Features, FrozenEncoder
from dhim_ray.errors import CheckpointError, ConfigError, TrainingInterrupted
from dhim_ray.folders import removed_unless_kept
from dhim_ray.model.checkpoint import (
    CONFIG_FILE,
    check_checkpoint_folder,
    clear_training_state,
    has_training_state,
    read_checkpoint,
    save_checkpoint,
    save_training_state,
)
from dhim_ray.training.loop import (
    ONE_LABEL_HINT,
    FitResult,
    LoopState,
    TrainCallback,
    carve_validation,
    fit,
    selection_criterion,
)

logger = logging.getLogger(__name__)

SCRATCH_FEATURES = "features.tmp"


@dataclass
class TrainingData:
    """Train/val features and labels, ready for fit."""

    train: Features
    val: Features | None
    train_labels: np.ndarray | None
    val_labels: np.ndarray | None
    encoder: FrozenEncoder
    config: DHIMConfig
    n_train: int
    val_source: str


def load_train_val(corpus: CorpusSpec, config: DHIMConfig) -> tuple[Split, Split, str]:
    """(train, val, where val came from): the corpus' val split, or a deterministic
    slice carved out of train when it has none. Both share one label vocabulary.
    ``CORPUS:SPLIT`` trains on that split (a split the corpus lacks is a DataError naming
    those it has), its val slice carved out of it unless it is train and a val split exists."""
    data = load_corpus(corpus.with_split(None))
    name = data_split_name(corpus.split, data) if corpus.split else "train"
    train = data.split(name)
    if name == "train" and "val" in data.splits:
        val, val_source = data.split("val"), "val split"
    else:
        tr_idx, val_idx = carve_validation(len(train), config.train)
        train, val = train.take(tr_idx), train.take(val_idx)
        val_source = f"{len(val)} document{'s' if len(val) != 1 else ''} carved from train (seed {config.train.seed})"
    # Refuse or redirect a selection labels cannot make before any feature is computed.
    has_labels = train.labels is not None and val.labels is not None
    n_labels = len(np.unique(train.labels)) if has_labels else None
    criterion = selection_criterion(config.train.select, True, has_labels, n_labels)
    if has_labels and criterion != "labels" and config.train.select == "auto":
        logger.warning("every training document has the same label, so val P@%d cannot rank epochs: selecting by "
                       "cosine neighbours (label-free) instead; %s", config.train.k, ONE_LABEL_HINT)
    return train, val, val_source


def data_split_name(split: str, data) -> str:
    """The canonical name of ``split`` in ``data`` (val for validation/dev, ...), or a DataError."""
    from dhim_ray.corpus.spec import SPLIT_ALIASES

    for canonical, aliases in SPLIT_ALIASES.items():
        if split in aliases and canonical in data.splits:
            return canonical
    data.split(split)  # raises: the corpus has no such split, naming those it has
    return split


def pick_device(name: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; anything else is checked and kept."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device={name}: not a torch device; use auto, cpu or cuda", field="device") from None
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={name}: dhim-ray runs on cpu, cuda or mps; use auto, cpu or cuda", field="device")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name}: this machine has no CUDA GPU torch can use; use device=cpu", field="device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device={name}: this machine has {torch.cuda.device_count()} CUDA GPUs; "
                          "use cuda:0 or device=auto", field="device")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={name}: this machine has no Apple GPU torch can use; use device=cpu", field="device")
    return name


DEFAULT_FEATURE_MEMORY_GB = 2.0


def features_on_disk(n_docs: int, features: FeatureConfig, hidden: int, memory_gb: float | None) -> bool:
    """Whether n_docs documents' frozen features exceed the memory budget (GiB; None: no limit)."""
    if memory_gb is None:
        return False
    return n_docs * Features.bytes_per_document(features.n_tokens, hidden) > memory_gb * 2**30


def prepare_training_data(
    corpus: CorpusSpec,
    config: DHIMConfig,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    device: str = "cpu",
    encoder: FrozenEncoder | None = None,
    feature_memory_gb: float | None = DEFAULT_FEATURE_MEMORY_GB,
    scratch_dir: str | Path | None = None,
) -> TrainingData:
    """Load the corpus, carve a val slice if needed, and compute frozen features once.

    Features that fit in ``feature_memory_gb`` are held in memory; larger ones are
    written batch by batch to a FeatureStore (in ``cache_dir``, else ``scratch_dir``)
    and training reads them back batch by batch, so memory stays bounded.
    """
    from dhim_ray.errors import ConfigError

    train, val, val_source = load_train_val(corpus, config)
    encoder = encoder or FrozenEncoder(config.features, device=device, reach=config.model.pad_reach)
    config = config.for_encoder(encoder.hidden_size)
    on_disk = features_on_disk(len(train) + len(val), config.features, encoder.hidden_size, feature_memory_gb)
    store = cache_dir if cache_dir is not None else (scratch_dir if on_disk else None)
    if on_disk:
        if store is None:
            raise ConfigError(f"feature_memory_gb={feature_memory_gb}: the features of {len(train) + len(val)} "
                              "documents exceed it; give a cache_dir to keep them on disk", field="feature_memory_gb")
        logger.info("features of %d documents exceed %.1f GiB: kept on disk in %s, read batch by batch",
                    len(train) + len(val), feature_memory_gb, store)
    train_f = encoder.features(train.texts, progress=progress, cache_dir=store, in_memory=not on_disk)
    val_f = encoder.features(val.texts, progress=progress, cache_dir=store, in_memory=not on_disk)
    return TrainingData(train_f, val_f, train.labels, val.labels, encoder, config, len(train), val_source)


class CheckpointEachEpoch(TrainCallback):
    """After every epoch the run folder holds the best weights so far (a loadable
    checkpoint) and what ``--resume`` needs, so an interruption loses at most one epoch."""

    def __init__(self, out: Path, fingerprint: str, context: dict[str, Any]):
        self.out, self.fingerprint, self.context = out, fingerprint, context

    def on_epoch_end(self, state: LoopState) -> None:
        if state.rank == 0:
            best = state.stopper.best_epoch if state.best_state is not None else state.epoch
            save_training_state(self.out, state.model, state.config, state.optimizer, state.best_state,
                                state.progress(), self.fingerprint,
                                {**self.context, "unfinished": True, "epochs_run": state.epoch + 1,
                                 "best_epoch": best + 1})


#: Settings a resumed run may change: the epoch budget and patience (the width comes from the encoder).
RESUMABLE_CHANGES = {"train.max_epochs", "train.patience", "model.hidden_size"}


def resume_config(out: Path, requested: DHIMConfig, corpus: str | None = None) -> DHIMConfig:
    """The config of the run being resumed. It must be the command's: the same corpus (where
    given) and the same settings but the epoch budget and patience, or a CheckpointError
    names the first difference."""
    info = read_checkpoint(out)
    started = info.summary.get("corpus")
    if corpus is not None and started and started != corpus:
        raise CheckpointError(f"resume={out}: that run trains on {started}, not {corpus}; resume it with its own "
                              "corpus, or train into another out=FOLDER", field="resume")
    # the command's config as the run had it: the shipped identity bits fitted to the encoder's width
    asked = requested.for_encoder(info.config.model.hidden_size, warn=False).to_dict()
    stored = info.config.to_dict()
    for section, fields in asked.items():
        for name, value in fields.items():
            key, before = f"{section}.{name}", stored.get(section, {}).get(name)
            if key not in RESUMABLE_CHANGES and _comparable(before) != _comparable(value):
                raise CheckpointError(f"resume={out}: that run was started with {key}={before!r}, this command "
                                      f"asks for {value!r}; resume with the settings it was started with", field="resume")
    return info.config.replace(train={"max_epochs": requested.train.max_epochs, "patience": requested.train.patience})


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value


class TrainBackend(Protocol):
    """Where a run's epochs run: this process (``InProcess``) or Ray Train workers
    (dhim_ray.jobs.train.RayTrain). ``train`` does the rest once for both."""

    def resume_point(self, out: Path) -> Path: ...  # the checkpoint --resume continues, or an error
    def prepare(self, corpus: CorpusSpec, config: DHIMConfig, out: Path) -> Prepared: ...  # corpus + features, once
    def fit(self, prepared: Prepared, out: Path,  # the epochs: (fit, summary fields)
            resume_from: Path | None) -> tuple[FitResult, dict[str, Any]]: ...
    def finish(self, prepared: Prepared) -> None: ...  # remove what the run kept for itself


@dataclass
class Prepared:
    """What a backend computed once for a run: the config with the encoder's width, the
    encoder's fingerprint, the summary's context and the features (backend-specific)."""

    config: DHIMConfig
    fingerprint: str
    context: dict[str, Any]
    features: Any = None


def train(corpus: CorpusSpec, config: DHIMConfig, out: str | Path, backend: TrainBackend,
          resume: bool = False) -> tuple[FitResult, dict[str, Any]]:
    """Train DHIM on a corpus with ``backend`` and save the best checkpoint to ``out``.

    ``resume=True`` continues an interrupted run (the settings must be the run's but the
    epoch budget and patience). Returns (fit result, the summary written into the
    checkpoint).
    """
    out = Path(out)
    with removed_unless_kept(out, _worth_keeping):
        return _train(corpus, config, out, backend, resume)


def _worth_keeping(out: Path) -> bool:
    """A failed run's folder is kept when it holds something to resume or a finished model."""
    return has_training_state(out) or (out / CONFIG_FILE).is_file()


def _train(corpus: CorpusSpec, config: DHIMConfig, out: Path, backend: TrainBackend,
           resume: bool) -> tuple[FitResult, dict[str, Any]]:
    point = backend.resume_point(out) if resume else None
    if point is not None:
        config = resume_config(point, config, corpus.display)
    elif has_training_state(out):
        raise CheckpointError(f"out={out} holds an unfinished run; continue it with resume={out} or pick another "
                              "out=FOLDER", field="out")
    check_checkpoint_folder(out)  # another model's config.json is refused as such
    if not resume and (out / CONFIG_FILE).is_file():
        raise CheckpointError(f"out={out} holds a trained model (codes ingested with it would no longer match a new "
                              "one's); pick another out=FOLDER, or remove that folder to train anew", field="out")
    prepared = backend.prepare(corpus, config, out)
    result, extra = backend.fit(prepared, out, point)
    summary = result.summary(**prepared.context, **extra)
    save_checkpoint(out, result.model, prepared.config, prepared.fingerprint, summary)
    clear_training_state(out)
    backend.finish(prepared)
    return result, summary


@dataclass
class InProcess:
    """The backend that trains in this process (CPU or one GPU): features in memory, or on
    disk past ``feature_memory_gb`` (``cache_dir``, else a scratch folder in the run's
    --out removed when it finishes); the run folder holds the best weights so far after
    every epoch."""

    device: str = "cpu"
    cache_dir: str | Path | None = None
    feature_memory_gb: float | None = DEFAULT_FEATURE_MEMORY_GB
    progress: bool = True
    callbacks: tuple[TrainCallback, ...] = ()

    def resume_point(self, out: Path) -> Path:
        if not has_training_state(out):
            raise CheckpointError(f"resume={out}: no unfinished run there (it finished, or never started)", field="resume")
        return out

    def prepare(self, corpus: CorpusSpec, config: DHIMConfig, out: Path) -> Prepared:
        t0 = time.perf_counter()
        data = prepare_training_data(corpus, config, cache_dir=self.cache_dir, progress=self.progress,
                                     device=self.device, feature_memory_gb=self.feature_memory_gb,
                                     scratch_dir=out / SCRATCH_FEATURES)  # kept for --resume
        context = {"corpus": corpus.display, "n_train": data.n_train, "validation": data.val_source,
                   "feature_seconds": round(time.perf_counter() - t0, 2),
                   "features": "on disk" if data.train.on_disk else "in memory"}
        return Prepared(data.config, data.encoder.fingerprint, context, (data, out / SCRATCH_FEATURES))

    def fit(self, prepared: Prepared, out: Path, resume_from: Path | None) -> tuple[FitResult, dict[str, Any]]:
        data = prepared.features[0]
        saver = CheckpointEachEpoch(out, prepared.fingerprint, prepared.context)
        try:
            return fit(data.train, data.val, prepared.config, data.train_labels, data.val_labels,
                       progress=self.progress, device=self.device, callbacks=(saver, *self.callbacks),
                       resume_from=resume_from), {}
        except KeyboardInterrupt:
            raise TrainingInterrupted(_interrupted_message(out)) from None

    def finish(self, prepared: Prepared) -> None:
        scratch = prepared.features[1]
        prepared.features = None  # drop the features (and the memory maps of a scratch store) before removing it
        shutil.rmtree(scratch, ignore_errors=True)


def train_corpus(
    corpus: CorpusSpec,
    config: DHIMConfig,
    out: str | Path,
    progress: bool = True,
    device: str = "cpu",
    cache_dir: str | Path | None = None,
    resume: bool = False,
    callbacks: tuple[TrainCallback, ...] = (),
    feature_memory_gb: float | None = DEFAULT_FEATURE_MEMORY_GB,
) -> dict[str, Any]:
    """``train`` in this process: ``out`` holds the best weights after every epoch; ``resume=True``
    continues a run there. Returns the summary written into the checkpoint; raises
    TrainingInterrupted on Ctrl-C, naming what was kept and how to resume."""
    backend = InProcess(device, cache_dir, feature_memory_gb, progress, tuple(callbacks))
    return train(corpus, config, out, backend, resume)[1]


def _interrupted_message(out: Path) -> str:
    if not has_training_state(out):
        return f"interrupted before the first epoch finished; nothing was saved in {out}"
    info = read_checkpoint(out)
    return (f"interrupted after epoch {info.summary.get('epochs_run', 0)}; {out} holds the best epoch so far "
            f"({info.summary.get('best_epoch')}); continue with the same command and resume={out}")
