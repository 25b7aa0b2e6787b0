"""End-to-end library functions the CLI calls: train a corpus, evaluate a model
or a baseline (no Ray, no Milvus)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .baselines import make_baseline
from .checkpoint import save_checkpoint
from .config import DHIMConfig
from .data import Split, load_corpus, load_split, parse_spec, require_labels
from .encoder import Features, FrozenEncoder
from .errors import DataError
from .hasher import Hasher
from .metrics import precision_at_k
from .training import FitResult, carve_validation, fit


@dataclass
class PreparedData:
    """Train/val features and labels, ready for fit (single process or Ray)."""

    train: Features
    val: Features | None
    train_labels: np.ndarray | None
    val_labels: np.ndarray | None
    encoder: FrozenEncoder
    config: DHIMConfig
    n_train: int
    val_source: str


def load_train_val(
    corpus: str,
    config: DHIMConfig,
    text_column: str | None = None,
    label_column: str | None = None,
    drop_empty: bool = False,
    limit: int | None = None,
) -> tuple[Split, Split, str]:
    """(train, val, where val came from): the corpus' val split, or a deterministic
    slice carved out of train when it has none."""
    data = load_corpus(corpus, text_column, label_column, drop_empty=drop_empty, limit=limit)
    train = data.split("train")
    if "val" in data.splits:
        val, val_source = data.split("val"), "val split"
    else:
        tr_idx, val_idx = carve_validation(len(train), config.train)
        train, val = train.take(tr_idx), train.take(val_idx)
        val_source = f"{len(val)} documents carved from train (seed {config.train.seed})"
    return train, val, val_source


def prepare_training_data(
    corpus: str,
    config: DHIMConfig,
    text_column: str | None = None,
    label_column: str | None = None,
    drop_empty: bool = False,
    limit: int | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    device: str = "cpu",
    encoder: FrozenEncoder | None = None,
) -> PreparedData:
    """Load the corpus, carve a val slice if needed, and compute frozen features once."""
    train, val, val_source = load_train_val(corpus, config, text_column, label_column, drop_empty, limit)
    encoder = encoder or FrozenEncoder(config.features, device=device)
    config = config.replace(model={"hidden_size": encoder.hidden_size})
    train_f = encoder.features(train.texts, progress=progress, cache_dir=cache_dir)
    val_f = encoder.features(val.texts, progress=progress, cache_dir=cache_dir)
    return PreparedData(train_f, val_f, train.labels, val.labels, encoder, config, len(train), val_source)


def train_corpus(
    corpus: str,
    config: DHIMConfig,
    out: str | Path,
    progress: bool = True,
    device: str = "cpu",
    **data_kwargs: Any,
) -> tuple[FitResult, dict[str, Any]]:
    """Train DHIM on a corpus in this process and save the best checkpoint to ``out``.

    Returns (fit result, summary dict written into the checkpoint).
    """
    t0 = time.perf_counter()
    prep = prepare_training_data(corpus, config, progress=progress, device=device, **data_kwargs)
    t_features = time.perf_counter() - t0
    result = fit(prep.train, prep.val, prep.config, prep.train_labels, prep.val_labels, progress=progress, device=device)
    summary = {
        "corpus": corpus,
        "n_train": prep.n_train,
        "validation": prep.val_source,
        "feature_seconds": round(t_features, 2),
        **result.summary(),
        "history": result.history,
    }
    save_checkpoint(out, result.model, prep.config, prep.encoder.fingerprint, summary)
    return result, summary


def _eval_splits(database: str, queries: str, **kwargs) -> tuple[Split, Split]:
    db = load_split(database, "train", **kwargs)
    q_name, q_split = parse_spec(queries)
    q = load_split(queries, "val", **kwargs) if q_split else load_split(f"{q_name}:val", **kwargs)
    require_labels(db, f"database {database}")
    require_labels(q, f"queries {queries}")
    return db, q


def evaluate_checkpoint(
    model_dir: str | Path,
    database: str,
    queries: str,
    k: int = 100,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    **data_kwargs: Any,
) -> dict[str, Any]:
    """Precision@k of a trained model: hash database and queries, search exactly."""
    hasher = Hasher.load(model_dir, device=device)
    db, q = _eval_splits(database, queries, **data_kwargs)
    t0 = time.perf_counter()
    db_codes = hasher.hash_features(hasher.encoder.features(db.texts, progress=progress, cache_dir=cache_dir))
    q_codes = hasher.hash_features(hasher.encoder.features(q.texts, progress=progress, cache_dir=cache_dir))
    result = precision_at_k(db_codes, db.labels, q_codes, q.labels, k)
    return {"method": "dhim", "model": str(model_dir), "n_bits": hasher.n_bits, **result.as_dict(),
            "seconds": round(time.perf_counter() - t0, 2)}


def evaluate_baseline(
    baseline: str,
    n_bits: int,
    database: str,
    queries: str,
    k: int = 100,
    encoder: str | None = None,
    max_words: int = 50,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    **data_kwargs: Any,
) -> dict[str, Any]:
    """Precision@k of a classic hashing baseline on the frozen mean-pooled features."""
    from .config import DEFAULT_ENCODER, FeatureConfig

    model = make_baseline(baseline, n_bits, seed)  # fail fast on a bad name or width
    enc = FrozenEncoder(FeatureConfig(encoder=encoder or DEFAULT_ENCODER, max_words=max_words))
    db, q = _eval_splits(database, queries, **data_kwargs)
    db_f = enc.features(db.texts, progress=progress, cache_dir=cache_dir)
    q_f = enc.features(q.texts, progress=progress, cache_dir=cache_dir)
    if len(db) == 0:
        raise DataError("database is empty")
    model.fit(db_f.mean)
    result = precision_at_k(model.hash(db_f.mean), db.labels, model.hash(q_f.mean), q.labels, k)
    return {"method": baseline, "n_bits": n_bits, **result.as_dict()}
