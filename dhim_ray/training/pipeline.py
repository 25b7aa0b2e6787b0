"""End-to-end library functions the CLI calls: train a corpus in this process,
evaluate a model or a baseline (no Ray, no Milvus)."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.config import AUTO_TARGET, DEFAULT_ENCODER, DHIMConfig, FeatureConfig
from dhim_ray.corpus.data import Split, align_labels
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.encoding.encoder import Features, FrozenEncoder
from dhim_ray.encoding.refine import RefineConfig, refine_encoder
from dhim_ray.encoding.transforms import fit_transform, transform
from dhim_ray.errors import CheckpointError, TrainingInterrupted
from dhim_ray.hasher import Hasher
from dhim_ray.model.checkpoint import (
    CONFIG_FILE,
    check_checkpoint_folder,
    check_writable,
    clear_training_state,
    has_training_state,
    read_checkpoint,
    save_checkpoint,
    save_training_state,
)
from dhim_ray.retrieval.baselines import FLOAT_BASELINES, check_baseline, make_baseline
from dhim_ray.retrieval.metrics import cosine_precision_at_k, cosine_topk, neighbour_recall_at_k, precision_at_k
from dhim_ray.retrieval.rerank import BY_BITS, check_rerank, rerank_topk
from dhim_ray.training import target_choice
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
    data = corpus.with_split(None).load()
    name = data_split_name(corpus.split, data) if corpus.split else "train"
    train = data.split(name)
    if name == "train" and "val" in data.splits:
        val, val_source = data.split("val"), "val split"
    else:
        tr_idx, val_idx = carve_validation(len(train), config.train)
        train, val = train.take(tr_idx), train.take(val_idx)
        val_source = f"{len(val)} documents carved from train (seed {config.train.seed})"
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
    config = config.replace(model={"hidden_size": encoder.hidden_size})
    on_disk = features_on_disk(len(train) + len(val), config.features, encoder.hidden_size, feature_memory_gb)
    store = cache_dir if cache_dir is not None else (scratch_dir if on_disk else None)
    if on_disk:
        if store is None:
            raise ConfigError(f"feature_memory_gb={feature_memory_gb}: the features of {len(train) + len(val)} "
                              "documents exceed it; give a cache_dir to keep them on disk")
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
                                 "best_epoch": best})


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
                              "corpus, or train into another --out")
    stored, asked = info.config.to_dict(), requested.to_dict()
    skip = set(RESUMABLE_CHANGES)
    if requested.model.target_transform == AUTO_TARGET:  # each candidate run holds the target it trains
        skip.add("model.target_transform")
    for section, fields in asked.items():
        for name, value in fields.items():
            key, before = f"{section}.{name}", stored.get(section, {}).get(name)
            if key not in skip and _comparable(before) != _comparable(value):
                raise CheckpointError(f"resume={out}: that run was started with {key}={before!r}, this command "
                                      f"asks for {value!r}; resume with the settings it was started with")
    return info.config.replace(train={"max_epochs": requested.train.max_epochs, "patience": requested.train.patience})


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value


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
) -> tuple[FitResult, dict[str, Any]]:
    """Train DHIM on a corpus in this process and save the best checkpoint to ``out``.

    ``out`` is checked for writing before any work, then holds the best weights so far
    after every epoch. ``resume=True`` continues an interrupted run in ``out``.
    Features larger than ``feature_memory_gb`` stay on disk (``cache_dir``, else a
    scratch folder in ``out`` removed when the run finishes).
    ``config.model.target_transform == "auto"`` trains once per candidate target on
    the same features and keeps the better one (dhim_ray.training.target_choice).
    Returns (fit result, the summary written into the checkpoint). Raises
    TrainingInterrupted on Ctrl-C, naming what was kept and how to resume.
    """
    out = Path(out)
    auto = target_choice.is_auto(config) or (resume and target_choice.unfinished(out))
    if auto:
        target_choice.check_auto(config)
        target_choice.check_resume(out, resume)
        started = [f for f in sorted(target_choice.candidates_folder(out).glob("*")) if (f / CONFIG_FILE).is_file()]
        if resume and started:  # the interrupted run's settings, as a plain resume takes them
            config = resume_config(started[0], config, corpus.display).replace(
                model={"target_transform": AUTO_TARGET})
    elif resume:
        if not has_training_state(out):
            raise CheckpointError(f"resume={out}: no unfinished run there (it finished, or never started)")
        config = resume_config(out, config, corpus.display)
    elif has_training_state(out):
        raise CheckpointError(
            f"out={out} holds an unfinished run; continue it with --resume or pick another --out"
        )
    check_checkpoint_folder(out)
    t0 = time.perf_counter()
    scratch = out / SCRATCH_FEATURES  # features too big for memory, without a cache_dir; kept for --resume
    data = prepare_training_data(corpus, config, cache_dir=cache_dir, progress=progress, device=device,
                                 feature_memory_gb=feature_memory_gb, scratch_dir=scratch)
    context = {"corpus": corpus.display, "n_train": data.n_train, "validation": data.val_source,
               "feature_seconds": round(time.perf_counter() - t0, 2),
               "features": "on disk" if data.train.on_disk else "in memory"}
    results: dict[Path, FitResult] = {}

    def train_one(run_config: DHIMConfig, folder: Path, resume_run: bool) -> dict[str, Any]:
        if resume_run:
            run_config = resume_config(folder, run_config)
        saver = CheckpointEachEpoch(folder, data.encoder.fingerprint, context)
        try:
            result = fit(data.train, data.val, run_config, data.train_labels, data.val_labels, progress=progress,
                         device=device, callbacks=(saver, *callbacks), resume_from=folder if resume_run else None)
        except KeyboardInterrupt:
            message = _interrupted_message(folder)
            if auto:
                message += f" (--target-transform auto: targets finished in {target_choice.candidates_folder(out)} are kept)"
            raise TrainingInterrupted(message) from None
        summary = result.summary(**context)
        save_checkpoint(folder, result.model, run_config, data.encoder.fingerprint, summary)
        clear_training_state(folder)
        results[folder] = result
        return summary

    if auto:
        model, chosen, summary = target_choice.train_each_target(data.config, out, train_one, resume)
        result = FitResult.from_summary(model, chosen, summary)
    else:
        summary = train_one(data.config, out, resume)
        result = results[out]
    data = None  # drop the features (and the memory maps of a scratch store) before removing it
    shutil.rmtree(scratch, ignore_errors=True)
    return result, summary


def _interrupted_message(out: Path) -> str:
    if not has_training_state(out):
        return f"interrupted before the first epoch finished; nothing was saved in {out}"
    info = read_checkpoint(out)
    return (f"interrupted after epoch {info.summary.get('epochs_run', 0) - 1}; {out} holds the best epoch so far "
            f"({info.summary.get('best_epoch')}); continue with the same command and --resume")


#: What eval scores without labels (see label_free_scores).
NEIGHBOUR_METRIC = "cosine-neighbour recall@k (tie-aware; no labels)"


def eval_splits(database: CorpusSpec, queries: CorpusSpec) -> tuple[Split, Split, np.ndarray | None]:
    """(database split, query split, query labels in the database's label numbering, or
    None where either split has no labels: eval then scores without them). The same
    corpus is read once, so both splits share its label vocabulary."""
    db_spec, q_spec = database.with_split(database.split or "train"), queries.with_split(queries.split or "val")
    if db_spec.with_split(None) == q_spec.with_split(None):
        corpus = db_spec.with_split(None).load()
        db, q = corpus.split(db_spec.split), corpus.split(q_spec.split)
    else:
        db, q = db_spec.load_split(), q_spec.load_split()
    if db.labels is None or q.labels is None:
        where = " and ".join(f"{role} {spec.display}" for role, spec, split in
                             (("database", db_spec, db), ("queries", q_spec, q)) if split.labels is None)
        logger.warning("%s: no labels (--label-column NAME names them); scoring by how many of each query's "
                       "nearest documents by cosine of the frozen encoder's sentence vectors the codes find", where)
        return db, q, None
    return db, q, align_labels(db, q)


def label_free_scores(db_vectors: np.ndarray, q_vectors: np.ndarray, found, k: int) -> dict[str, Any]:
    """Eval without labels: the share of each query's k nearest database documents by cosine
    of the frozen encoder's mean-pooled vectors that a method finds. ``found``: a callable
    (neighbours (n_q, k)) -> recall in [0, 1] (tie-aware for codes)."""
    neighbours = cosine_topk(db_vectors, q_vectors, k)
    return {"metric": NEIGHBOUR_METRIC, "k": neighbours.shape[1], "neighbour_recall_at_k": float(found(neighbours)),
            "n_queries": len(q_vectors), "n_database": len(db_vectors)}


def _codes_found(db_codes: np.ndarray, q_codes: np.ndarray):
    """label_free_scores' ``found`` for packed codes: tie-aware recall of the neighbours."""
    return lambda neighbours: neighbour_recall_at_k(db_codes, q_codes, neighbours, neighbours.shape[1]).recall_at_k


def _overlap(found: np.ndarray, neighbours: np.ndarray) -> float:
    """Mean share of each row of ``neighbours`` among the same row of ``found`` (index sets)."""
    return float(np.mean([len(np.intersect1d(a, b)) / neighbours.shape[1] for a, b in zip(found, neighbours)]))


def evaluate_checkpoint(
    model_dir: str | Path,
    database: CorpusSpec,
    queries: CorpusSpec,
    k: int = 100,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    rerank: int = 1,
) -> dict[str, Any]:
    """Precision@k of a trained model: hash database and queries, search exactly.
    ``rerank`` m > 1 also reports the precision of the k x m Hamming candidates
    re-ranked by agreement with the queries' pre-threshold scores."""
    rerank = check_rerank(rerank)
    hasher = Hasher.load(model_dir, device=device)
    db, q, q_labels = eval_splits(database, queries)
    t0 = time.perf_counter()
    db_f = hasher.encoder.features(db.texts, progress=progress, cache_dir=cache_dir)
    q_f = hasher.encoder.features(q.texts, progress=progress, cache_dir=cache_dir)
    db_codes = hasher.hash_features(db_f)
    q_codes, q_scores = hasher.score_features(q_f)
    if q_labels is None:
        out = {"method": "dhim", "model": str(model_dir), "n_bits": hasher.n_bits,
               **label_free_scores(db_f.mean, q_f.mean, _codes_found(db_codes, q_codes), k)}
        if rerank > 1:
            neighbours = cosine_topk(db_f.mean, q_f.mean, out["k"])
            idx, _ = rerank_topk(db_codes, q_codes, q_scores, out["k"], rerank)
            out.update(rerank=rerank, rerank_by=BY_BITS, neighbour_recall_at_k_reranked=_overlap(idx, neighbours))
        return {**out, "seconds": round(time.perf_counter() - t0, 2)}
    result = precision_at_k(db_codes, db.labels, q_codes, q_labels, k)
    out = {"method": "dhim", "model": str(model_dir), "n_bits": hasher.n_bits, **result.as_dict()}
    if rerank > 1:
        idx, _ = rerank_topk(db_codes, q_codes, q_scores, result.k, rerank)
        out.update(rerank=rerank, rerank_by=BY_BITS,
                   precision_at_k_reranked=float((db.labels[idx] == q_labels[:, None]).mean()))
    return {**out, "seconds": round(time.perf_counter() - t0, 2)}


def evaluate_baseline(
    baseline: str,
    n_bits: int | None,
    database: CorpusSpec,
    queries: CorpusSpec,
    k: int = 100,
    features: FeatureConfig | None = None,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Precision@k of a classic hashing baseline on the frozen mean-pooled features, or of a
    float baseline (``FLOAT_BASELINES``: exact cosine kNN, ``n_bits`` unused)."""
    check_baseline(baseline)
    model = None if baseline in FLOAT_BASELINES else make_baseline(baseline, n_bits, seed)  # fail fast on a width
    enc = FrozenEncoder(features or FeatureConfig(encoder=DEFAULT_ENCODER))
    db, q, q_labels = eval_splits(database, queries)
    db_f = enc.features(db.texts, progress=progress, cache_dir=cache_dir)
    q_f = enc.features(q.texts, progress=progress, cache_dir=cache_dir)
    if model is None:
        return _float_baseline(baseline, db_f.mean, db.labels, q_f.mean, q_labels, k, seed)
    model.fit(db_f.mean)
    n_bits = model.n_bits
    if q_labels is None:
        found = _codes_found(model.hash(db_f.mean), model.hash(q_f.mean))
        return {"method": baseline, "n_bits": n_bits, "bytes_per_doc": n_bits // 8,
                **label_free_scores(db_f.mean, q_f.mean, found, k)}
    result = precision_at_k(model.hash(db_f.mean), db.labels, model.hash(q_f.mean), q_labels, k)
    return {"method": baseline, "n_bits": n_bits, "bytes_per_doc": n_bits // 8, **result.as_dict()}


def _float_baseline(name: str, database, database_labels, queries, query_labels, k: int, seed: int) -> dict[str, Any]:
    """Cosine kNN precision@k on float vectors, after the baseline's transform fitted on the database."""
    plain_x, plain_q = x, qv = np.asarray(database, np.float32), np.asarray(queries, np.float32)
    if FLOAT_BASELINES[name] is not None:
        fitted = fit_transform(FLOAT_BASELINES[name], x, seed)
        x, qv = transform(fitted, x), transform(fitted, qv)
    if query_labels is None:  # without labels: the plain vectors' neighbours the transformed ones find
        return {"method": name, "dims": x.shape[1], "bytes_per_doc": 4 * x.shape[1],
                **label_free_scores(plain_x, plain_q, lambda nb: _overlap(cosine_topk(x, qv, nb.shape[1]), nb), k)}
    p = cosine_precision_at_k(x, database_labels, qv, query_labels, k)
    # distances are continuous: no ties to break, so both tie rules give the same figure
    return {"method": name, "dims": x.shape[1], "bytes_per_doc": 4 * x.shape[1], "k": k, "precision_at_k": p,
            "precision_at_k_tie_aware": p, "n_queries": len(qv), "n_database": len(x)}


def refine_corpus(corpus: CorpusSpec, config: RefineConfig, out: str | Path, device: str = "cpu",
                  resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Refine an encoder (SG-OPT) on a corpus' training texts, no labels used, into a
    Hugging Face folder at ``out`` that ``FeatureConfig(encoder=out)`` loads."""
    out = Path(out)
    if not resume:
        check_writable(out.parent)
    texts = corpus.with_split(None).load().split("train").texts
    return refine_encoder(texts, out, config, device=device, resume=resume, progress=progress,
                          context={"corpus": corpus.display, "method": config.method})
