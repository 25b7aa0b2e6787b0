"""The quality protocol the quality benches share (bench.quality, bench.item_level): one place
for the features, the carving, the training and the row a run records.

database = train.csv, queries = val.csv, precision@100 by Hamming distance, both tie rules.
DHIM's model selection (early stopping, best epoch) uses a held-out slice of train.csv (10%,
at most 1,000 documents), never val.csv; it trains on the rest, then hashes all of train.csv
as the database. Short corpora keep 50 words, long ones (20ng, r8) 400. The quality table's
rows accumulate in bench/quality.jsonl (reruns skip what is there).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.harness import DATA, append_row, read_rows
from dhim_ray.config import FeatureConfig, TrainConfig
from dhim_ray.corpus.data import load_corpus
from dhim_ray.retrieval.metrics import precision_at_k

# torch-bound modules are imported where a run needs them: the report reads results without torch

RESULTS = Path(__file__).resolve().parent / "quality.jsonl"
LONG = {"20ng", "r8"}  # long-document corpora: 400 words, like the paper's NYT


def load_results() -> list[dict]:
    return read_rows(RESULTS)


def record(row: dict) -> None:
    append_row(RESULTS, row)


SHIPPED_EPOCHS = TrainConfig().max_epochs  # the shipped schedule: 100 epochs at most (patience 6)


def corpus_features(name: str, cache_dir: str, encoder_name: str | None = None):
    from dhim_ray.encoding.encoder import FrozenEncoder

    corpus = load_corpus(str(DATA / name))
    train, val = corpus.split("train"), corpus.split("val")
    extra = {"encoder": encoder_name} if encoder_name else {}
    encoder = FrozenEncoder(FeatureConfig(max_words=400 if name in LONG else 50, **extra))
    tr = encoder.features(train.texts, progress=True, cache_dir=cache_dir)
    va = encoder.features(val.texts, progress=True, cache_dir=cache_dir)
    return encoder, train, val, tr, va


def fit_carved(cfg, tr, train):
    """Train on train.csv less a carved slice, which picks the epoch (never val.csv)."""
    from dhim_ray.training.loop import carve_validation, fit

    fit_idx, sel_idx = carve_validation(len(tr), cfg.train)
    return fit(tr.take(fit_idx), tr.take(sel_idx), cfg, train.labels[fit_idx], train.labels[sel_idx], progress=False)


#: How a DHIM run's training went, as the quality table records it (see training_fields).
TRAINING_FIELDS = ("seconds", "best_epoch", "epochs_run", "epoch_seconds")


def training_fields(res) -> dict:
    """A FitResult's TRAINING_FIELDS: seconds, best epoch, epochs run, mean epoch seconds."""
    return {"seconds": round(res.seconds, 1), "best_epoch": res.best_epoch, "epochs_run": len(res.history),
            "epoch_seconds": round(float(np.mean([h.seconds for h in res.history])), 1)}


def run_row(res, p: float, p_tie: float) -> dict:
    """One DHIM run's quality-table fields: val P@100 (db order, tie-aware) and how training went."""
    return {"p": p, "p_tie": p_tie, **training_fields(res)}


def train_dhim(cfg, tr, va, train, val, k: int) -> dict:
    """Train with model selection on a slice of train, evaluate val queries against all of train."""
    from dhim_ray.model.inference import hash_features

    res = fit_carved(cfg, tr, train)
    r = precision_at_k(hash_features(res.model, tr), train.labels, hash_features(res.model, va), val.labels, k)
    return run_row(res, r.precision_at_k, r.precision_at_k_tie_aware)


def epoch_cap(name: str, bits: int, max_epochs: int, long_epochs: int | None = None,
              cell_epochs: dict[tuple[str, int], int] | None = None) -> int:
    """The epoch cap of one cell: --cell-epochs for it, else --long-epochs on a long corpus, else --max-epochs."""
    return (cell_epochs or {}).get((name, bits)) or (long_epochs if name in LONG and long_epochs else max_epochs)


def done(rows, **key) -> bool:
    return any(all(r.get(k) == v for k, v in key.items()) for r in rows)
