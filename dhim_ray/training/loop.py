"""DHIM training on cached features (torch only; no Ray). ``fit`` is the one loop (Adam, clipping,
early stopping on validation precision@k, best weights kept), in-process and in every Ray Train
worker, which brings its ``Collective`` (rank, all-gather) and callbacks (checkpoint reports)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dhim_ray.config import DHIMConfig, TrainConfig
from dhim_ray.encoding.encoder import Features
from dhim_ray.encoding.transforms import fitting_sample
from dhim_ray.errors import ConfigError, DataError
from dhim_ray.model.dhim import DHIM
from dhim_ray.model.inference import hash_features, to_tensors
from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k, precision_at_k, precision_ceiling
from dhim_ray.training.distributed import Collective
from dhim_ray.training.schedule import EarlyStopping, selection_warmup

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def carve_validation(n: int, config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, val) index split of n documents when there is no val split."""
    n_val = min(config.max_val, max(1, int(round(n * config.val_fraction))))
    if n - n_val < 2:
        raise DataError(f"{n} documents are too few to carve a validation slice; give at least 3 or a val split")
    order = np.random.default_rng(config.seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def selection_database(n: int, config: TrainConfig) -> np.ndarray:
    """Indices of the training documents that model selection searches each epoch: all
    of them up to ``max_select_database``, else a fixed random sample. Selection only
    ranks epochs; hashing every training document each epoch would cost more than the
    epoch itself on long documents, and grows with the corpus."""
    m = config.max_select_database
    if not m or n <= m:
        return np.arange(n)
    return np.sort(np.random.default_rng(config.seed + 1).choice(n, m, replace=False))


ONE_LABEL_HINT = ("train on documents of several labels (limit=N keeps the first rows, and a split ordered by "
                  "label then holds one)")


def selection_criterion(select: str, has_val: bool, has_labels: bool, n_labels: int | None = None) -> str | None:
    """What picks the epoch: "labels" (tie-aware P@k), "neighbours" (cosine-neighbour recall@k), or
    None without a validation slice. With ``n_labels`` 1, P@k cannot rank epochs: "auto" selects by
    neighbours and "labels" is refused."""
    if not has_val:
        return None
    if select == "labels" and not has_labels:
        raise ConfigError("select=labels but the corpus has no labels: give label_column=NAME, "
                          "or select by neighbours (label-free)", field="select")
    one_label = has_labels and n_labels is not None and n_labels < 2
    if select == "labels" and one_label:
        raise ConfigError(f"select=labels but every training document has the same label: P@k cannot rank epochs; "
                          f"{ONE_LABEL_HINT}, or select by neighbours (label-free)", field="select")
    if select == "auto":
        return "labels" if has_labels and not one_label else "neighbours"
    return select


CRITERIA = {"labels": "val P@{k} (tie-aware)", "neighbours": "val cosine-neighbour recall@{k} (tie-aware)"}


@dataclass
class Selection:
    """What model selection searches each epoch: a fixed sample of the training
    documents (see selection_database), their labels when there are, and each val
    document's k nearest of them by cosine of the frozen encoder's sentence vectors
    (the label-free criterion's reference; computed once)."""

    database: Features
    labels: np.ndarray | None
    neighbours: np.ndarray
    k: int

    @classmethod
    def build(cls, database: Features, labels: np.ndarray | None, val: Features, config: DHIMConfig,
              val_labels: np.ndarray | None = None) -> Selection:
        idx = selection_database(len(database), config.train)
        db = database.take(idx)
        k = min(config.train.k, len(db))
        neighbours = cosine_topk(db.mean, val.mean[np.arange(len(val))], k)
        if labels is not None and val_labels is not None and (top := precision_ceiling(labels[idx], val_labels, k)) < 1:
            logger.info("val P@%d can reach at most %.4f here: the classes hold fewer than %d of the %s training "
                        "documents selection searches", k, top, k, f"{len(db):,}")
        return cls(db, None if labels is None else labels[idx], neighbours, k)

    def score(self, model: DHIM, val: Features, val_labels: np.ndarray | None, device: torch.device,
              collective: Collective) -> tuple[float | None, float]:
        """(tie-aware P@k or None without labels, tie-aware neighbour recall@k) of the model.
        The work is split across ranks: every rank hashes a share of the database sample (all
        ranks get every code), then searches and scores only its share of the val documents;
        one all-reduce of the sums gives every rank the whole figures."""
        db_codes = hash_shared(model, self.database, device, collective)
        a, b = collective.my_rows(len(val))
        labelled = self.labels is not None and val_labels is not None
        p_sum = recall_sum = 0.0
        if b > a:
            val_codes = hash_features(model, val.rows(a, b), device=device)
            if labelled:
                p_sum = precision_at_k(db_codes, self.labels, val_codes, np.asarray(val_labels)[a:b],
                                       self.k).precision_at_k_tie_aware * (b - a)
            recall_sum = neighbour_recall_at_k(db_codes, val_codes, self.neighbours[a:b], self.k).recall_at_k * (b - a)
        p_sum, recall_sum = collective.sum([p_sum, recall_sum])
        n = max(len(val), 1)
        return (p_sum / n if labelled else None), recall_sum / n


def token_mean(feats: Features, rows: np.ndarray | None = None, chunk: int = 1024) -> np.ndarray:
    """Mean of each document's word-position token features (what the linear path's readout
    and the identity bits see), of all documents or of sorted ``rows``: (n, H) float32."""
    rows = np.arange(len(feats)) if rows is None else rows
    out = np.empty((len(rows), feats.tokens.shape[-1]), dtype=np.float32)
    for start in range(0, len(rows), chunk):
        idx = rows[start : start + chunk]
        tok = feats.tokens[idx].astype(np.float32)
        w = feats.mask[idx].astype(np.float32)[:, :, None]
        out[start : start + chunk] = (tok * w).sum(1) / np.maximum(w.sum(1), 1)
    return out


def unit_spread(x: np.ndarray, w: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A linear code (x - mean) @ w as (weight (bits, H), bias (bits,)), scaled so every bit's
    logit has unit spread over x."""
    scale = ((x - mean) @ w).std(axis=0) + 1e-6
    return (w / scale).T, -(mean @ w) / scale


def identity_projection(feats: Features, n_bits: int, seed: int = 0,
                        rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The identity bits' projection, (weight (bits, H), bias (bits,)): ITQ of the mean token
    feature; on a corpus with fewer documents than bits (PCA finds fewer axes than that), a
    seeded random projection (LSH) of it instead, with a warning. Scaled so every bit's logit has
    unit spread over the documents (unit_spread)."""
    from dhim_ray.retrieval.baselines import ITQ, LSH

    x = token_mean(feats, rows)
    if n_bits <= min(x.shape):
        itq = ITQ(n_bits, seed).fit(x)
        w, mean = itq.w @ itq.rotation, itq.mean
    else:
        logger.warning("%d training documents are too few for %d ITQ identity bits: a random projection of "
                       "the mean word feature stands in (give more documents, or set model.identity_bits=0)",
                       len(x), n_bits)
        lsh = LSH(n_bits, seed).fit(x)
        w, mean = lsh.w, lsh.mean
    return unit_spread(x, w, mean)


def init_from_itq(model: DHIM, feats: Features, seed: int = 0) -> None:
    """Start the model's linear path as ITQ of the mean token feature (unit_spread)."""
    from dhim_ray.retrieval.baselines import ITQ

    x, n_bits = token_mean(feats), model.config.head_bits
    if n_bits > min(x.shape):
        raise ConfigError(f"model.init=itq: {len(x)} training documents are too few for an ITQ start of {n_bits} bits; "
                          "give more documents or model.init=random", field="model.init")
    itq = ITQ(n_bits, seed).fit(x)
    model.init_linear_path(*unit_spread(x, itq.w @ itq.rotation, itq.mean))


#: Transforms are fitted on at most this many database vectors (a fixed sample).
TRANSFORM_SAMPLE = 20_000


def fit_transforms(model: DHIM, database: Features, seed: int = 0) -> None:
    """Fit the model's fixed parts on a fixed sample of at most TRANSFORM_SAMPLE database
    documents: its identity bits (ITQ of the mean token feature) and its regulariser target's
    transform (ModelConfig.target_transform)."""
    rows = fitting_sample(len(database), TRANSFORM_SAMPLE, seed)
    if model.config.identity_bits:
        model.set_identity(*identity_projection(database, model.config.identity_bits, seed, rows))
    if model.target_transform is not None:
        model.target_transform.fit(np.asarray(database.target(model.config.regulariser)[rows], dtype=np.float64))


def neighbour_table(vectors: np.ndarray, m: int, chunk: int | None = None) -> np.ndarray:
    """Each row's m nearest other rows by cosine similarity: (n, m) int64. Rows are
    compared a chunk at a time, the (chunk, n) similarities bounded to ~256 MB."""
    x = torch.nn.functional.normalize(torch.from_numpy(np.asarray(vectors, dtype=np.float32)), dim=1)
    m = min(m, len(x) - 1)
    chunk = chunk or max(1, min(2048, (1 << 26) // max(1, len(x))))
    out = np.empty((len(x), m), dtype=np.int64)
    for start in range(0, len(x), chunk):
        sim = x[start : start + chunk] @ x.T
        sim[torch.arange(len(sim)), torch.arange(start, start + len(sim))] = -float("inf")
        out[start : start + chunk] = sim.topk(m, dim=1).indices.numpy()
    return out


def pair_batches(
    n: int, batch_size: int, table: np.ndarray, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of (anchor, random top-m neighbour) pairs: indices (b,) and the (b, b)
    bool matrix of extra positives (each anchor with its neighbour, and copies of the
    same document with each other)."""
    half = max(1, batch_size // 2)
    for anchors in batch_indices(n, half, rng):
        partners = table[anchors, rng.integers(0, table.shape[1], size=len(anchors))]
        idx = np.concatenate([anchors, partners])
        b = len(anchors)
        pairs = idx[:, None] == idx[None, :]
        pairs[np.arange(b), np.arange(b) + b] = True
        pairs[np.arange(b) + b, np.arange(b)] = True
        yield idx, pairs


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffled minibatches; a last batch of one document (no negatives) is dropped."""
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        if len(idx) >= 2:
            yield np.sort(idx)  # sorted: contiguous reads from the feature arrays


def epoch_batches(
    feats: Features,
    config: DHIMConfig,
    rng: np.random.Generator,
    device: torch.device,
    batch_size: int | None = None,
    neighbours: np.ndarray | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """One epoch of training batches as tensors: (tokens, mask, target, pairs).

    Shuffled batches of ``batch_size`` (default: the config's) documents, or, with a
    ``neighbours`` table (see neighbour_table), anchor/neighbour pairs whose ``pairs``
    matrix marks the extra positives. Crops and padding trims follow the config.
    """
    trim = config.model.pad_reach
    for idx, pairs in batch_plan(len(feats), batch_size or config.train.batch_size, rng, neighbours):
        tokens, mask, target = to_tensors(feats, idx, config.model.regulariser, device, trim,
                                          config.train.crop_tokens, rng)
        yield tokens, mask, target, None if pairs is None else torch.from_numpy(pairs).to(device)


def batch_plan(n: int, batch_size: int, rng: np.random.Generator,
               neighbours: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """An epoch's batches as (document indices, extra-positive pairs or None): shuffled
    batches, or anchor/neighbour pairs with a ``neighbours`` table (see pair_batches)."""
    if neighbours is None:
        return ((idx, None) for idx in batch_indices(n, batch_size, rng))
    return pair_batches(n, batch_size, neighbours, rng)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    target: torch.Tensor | None,
    config: TrainConfig,
    gather: Callable | None = None,
    pairs: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimiser step on one batch; returns the loss and both MI terms."""
    model.train()
    out = model(tokens, mask, target, config.beta, gather=gather, pairs=pairs)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return {"loss": out.loss.item(), "mi_local": out.mi_local.item(), "mi_regulariser": out.mi_regulariser.item()}


def hash_shared(model: DHIM, feats: Features, device: torch.device, collective: Collective) -> np.ndarray:
    """Codes of all of ``feats``, each rank hashing its share (all ranks get every code)."""
    a, b = collective.my_rows(len(feats))
    codes = hash_features(model, feats.rows(a, b), device=device)
    if collective.world_size == 1:
        return codes
    return collective.gather_rows(torch.from_numpy(codes)).cpu().numpy()


@dataclass
class EpochRecord:
    """One epoch of training, the same record in-process and under Ray Train."""

    epoch: int
    steps: int
    loss: float
    mi_local: float
    mi_regulariser: float
    seconds: float = 0.0
    val_precision: float | None = None  # tie-aware P@k of the selection search; None without labels
    val_neighbour_recall: float | None = None  # tie-aware recall of the val docs' cosine top-k (label-free)
    validate_seconds: float = 0.0  # of ``seconds``, the selection search (every rank hashes a share)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochRecord:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass
class LoopState:
    """What the loop hands its callbacks after each epoch; ``progress()`` is what a
    checkpoint saves so the loop can resume exactly there."""

    model: DHIM  # the bare model (not the DDP wrapper)
    optimizer: torch.optim.Optimizer
    config: DHIMConfig
    stopper: EarlyStopping
    rng: np.random.Generator
    rank: int = 0
    criterion: str | None = None  # what picks the epoch (selection_criterion); None: the last epoch
    history: list[EpochRecord] = field(default_factory=list)
    best_state: dict[str, torch.Tensor] | None = None
    train: Features | None = None  # what this rank trains on (its shard under Ray Train)

    @property
    def epoch(self) -> int:
        """The last finished epoch, -1 before the first."""
        return self.history[-1].epoch if self.history else -1

    def progress(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "criterion": self.criterion, "stopper": self.stopper.state(), "history": [h.as_dict() for h in self.history],
                "rng": self.rng.bit_generator.state,
                # the Bernoulli layer samples with torch's RNG: resumed == uninterrupted (on CPU)
                "torch_rng": torch.get_rng_state().tolist()}

    def restore(self, progress: dict[str, Any], best_state: dict[str, torch.Tensor] | None) -> None:
        self.stopper.load(progress["stopper"])
        self.history = [EpochRecord.from_dict(h) for h in progress["history"]]
        if progress.get("rng"):
            self.rng.bit_generator.state = progress["rng"]
        if progress.get("torch_rng"):
            torch.set_rng_state(torch.tensor(progress["torch_rng"], dtype=torch.uint8))
        self.best_state = best_state

    @property
    def selecting(self) -> bool:
        return self.criterion is not None

    @property
    def finished(self) -> bool:
        return self.epoch + 1 >= self.config.train.max_epochs or (self.selecting and self.stopper.should_stop)


class TrainCallback:
    """Hooks the loop calls on every rank: subclass and override what you need
    (checkpointing, progress reporting, tests' failure injection)."""

    def on_epoch_start(self, epoch: int, state: LoopState) -> None:
        """Before epoch ``epoch`` trains."""

    def on_epoch_end(self, state: LoopState) -> None:
        """After an epoch: ``state.history[-1]`` is its record."""


@dataclass
class FitResult:
    model: DHIM
    config: DHIMConfig
    history: list[EpochRecord] = field(default_factory=list)
    best_epoch: int = -1
    best_precision: float | None = None  # tie-aware val P@k of the chosen epoch (None without labels)
    best_neighbour_recall: float | None = None  # tie-aware val cosine-neighbour recall@k of the chosen epoch
    selected_by: str = "last epoch (no validation)"
    criterion: str | None = None  # "labels" or "neighbours"; None: the last epoch was kept
    seconds: float = 0.0
    stopped: str = ""  # why training ended, as the CLI says it

    @classmethod
    def from_progress(cls, model: DHIM, config: DHIMConfig, progress: dict[str, Any], has_best: bool,
                      seconds: float = 0.0) -> FitResult:
        """The result of a run from its saved progress (LoopState.progress); ``model``
        holds the chosen weights: the best epoch's when selection ran, else the last."""
        history = [EpochRecord.from_dict(h) for h in progress["history"]]
        result = cls(model, config, history, seconds=seconds)
        if has_best:
            result.best_epoch = progress["stopper"]["best_epoch"]
            result.criterion = progress.get("criterion") or "labels"
            result.selected_by = CRITERIA[result.criterion].format(k=config.train.k)
        else:
            result.best_epoch = progress["epoch"]
        chosen = [h for h in history if h.epoch == result.best_epoch]
        if chosen:
            result.best_precision, result.best_neighbour_recall = chosen[0].val_precision, chosen[0].val_neighbour_recall
        result.stopped = stop_reason(config, history, progress.get("stopper", {}), result if has_best else None)
        return result

    def summary(self, **context: Any) -> dict[str, Any]:
        """The run summary written into the checkpoint and printed by the CLI:
        ``context`` (corpus, n_train, workers, ...) first, then the run's figures."""
        epoch_seconds = [h.seconds for h in self.history]
        return {
            **context,
            "best_epoch": self.best_epoch + 1,  # counted from 1, as the log says "kept epoch N" (0: none chosen)
            "epochs_run": len(self.history),
            "selected_by": self.selected_by,
            "criterion": self.criterion,
            "best_val_precision_at_k_tie_aware": self.best_precision,
            "best_val_neighbour_recall_at_k": self.best_neighbour_recall,
            "stopped": self.stopped,
            "train_seconds": round(self.seconds, 2),
            "mean_epoch_seconds": round(float(np.mean(epoch_seconds)), 3) if epoch_seconds else None,
            "history": [h.as_dict() for h in self.history],
        }


def stop_reason(config: DHIMConfig, history: list[EpochRecord], stopper: dict[str, Any],
                result: FitResult | None) -> str:
    """One line on how a run ended: early (no gain for ``patience`` epochs), at its last epoch, or
    unselected; epochs counted from 1, as a person counts them."""
    ran, most = len(history), config.train.max_epochs
    if result is None:
        return f"after {ran} of {most} epochs; kept the last (no validation to choose by)"
    best = result.best_precision if result.criterion == "labels" else result.best_neighbour_recall
    kept = f"kept epoch {result.best_epoch + 1} ({result.selected_by} {_fmt(best)})"
    if ran < most and stopper.get("bad_epochs", 0) >= config.train.patience:
        return f"early, after epoch {ran} of {most}: no gain for {config.train.patience} epochs; {kept}"
    return f"after all {most} epochs; {kept}"


def build_model(config: DHIMConfig, device: torch.device = torch.device("cpu")) -> DHIM:
    seed_everything(config.train.seed)
    return DHIM(config.model).to(device)


def fit(
    train: Features,
    val: Features | None,
    config: DHIMConfig,
    train_labels: np.ndarray | None = None,
    val_labels: np.ndarray | None = None,
    *,
    database: Features | None = None,
    database_labels: np.ndarray | None = None,
    progress: bool = True,
    device: str | torch.device = "cpu",
    collective: Collective | None = None,
    resume_from: str | Path | None = None,
    callbacks: Sequence[TrainCallback] = (),
    wrap_model: Callable[[DHIM], torch.nn.Module] | None = None,
) -> FitResult:
    """Train DHIM on cached features: the one loop, in-process and in every Ray Train worker.
    Each epoch trains on ``train`` (this worker's shard), then the tie-aware P@k of ``val`` codes
    searched against ``database`` (default ``train``; label-free without labels) picks the epoch and
    stops after ``patience`` epochs without a better one; returns the best epoch's weights.
    ``collective``: the other workers; ``resume_from``: a checkpoint folder; ``callbacks``: hooks on
    every rank; ``wrap_model``: Ray Train's DDP. Raises ConfigError, DataError (too few documents)."""
    device = torch.device(device)
    collective = collective or Collective()
    if train.tokens.shape[-1] != config.model.hidden_size:
        raise ConfigError(
            f"features of width {train.tokens.shape[-1]} do not match hidden_size {config.model.hidden_size}"
        )
    start = time.perf_counter()
    model = build_model(config, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.train.lr)
    if database is None:
        database, database_labels = train, train_labels
    # Every rank takes part in selection (each hashes a share); rank 0's decision rules.
    has_labels = val_labels is not None and database_labels is not None
    criterion = selection_criterion(config.train.select, val is not None, has_labels,
                                    len(np.unique(database_labels)) if has_labels else None)
    state = LoopState(model, optimizer, config,
                      EarlyStopping(config.train.patience, selection_warmup(criterion, config.train)),
                      np.random.default_rng(config.train.seed), collective.rank, criterion, train=train)
    _start(state, resume_from, database, collective)
    trained = wrap_model(model) if wrap_model is not None else model
    selection = None
    if criterion is not None:
        selection = Selection.build(database, database_labels if val_labels is not None else None, val, config,
                                    val_labels)
    batch_size, table, n_batches = _batching(train, config, collective)
    # no total: early stopping ends most runs long before max_epochs, so an ETA over it would mislead
    bar = tqdm(initial=state.epoch + 1, desc=f"train {config.model.n_bits}b (at most {config.train.max_epochs})",
               unit="epoch", disable=not (progress and collective.is_chief))
    for epoch in range(state.epoch + 1, config.train.max_epochs):
        if state.finished:
            break
        for cb in callbacks:
            cb.on_epoch_start(epoch, state)
        t0 = time.perf_counter()
        batches = itertools.islice(epoch_batches(train, config, state.rng, device, batch_size, table), n_batches)
        record = _train_epoch(epoch, trained, optimizer, batches, config, collective, len(train))
        if selection is not None:
            t_val = time.perf_counter()
            record.val_precision, record.val_neighbour_recall = selection.score(model, val, val_labels, device,
                                                                                collective)
            record.validate_seconds = time.perf_counter() - t_val
            score = record.val_precision if criterion == "labels" else record.val_neighbour_recall
            if state.stopper.update(score, epoch):
                state.best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        record.seconds = time.perf_counter() - t0
        state.history.append(record)
        stop = collective.broadcast_flag(state.selecting and state.stopper.should_stop)
        if collective.is_chief:
            _log_epoch(record, state, config.train.k, bar)
        for cb in callbacks:
            cb.on_epoch_end(state)
        if stop:
            bar.set_description(f"train {config.model.n_bits}b (stopped early)")
            break
    bar.close()
    if state.best_state is not None:
        model.load_state_dict(state.best_state)
    model.eval()
    return FitResult.from_progress(model, config, state.progress(), state.best_state is not None,
                                   time.perf_counter() - start)


def _start(state: LoopState, resume_from: str | Path | None, database: Features, collective: Collective) -> None:
    """The state a run starts from: a checkpoint's (``resume_from``), else fitted transforms and init."""
    model, config = state.model, state.config
    if resume_from is not None:
        from dhim_ray.model.checkpoint import load_training_state

        state.restore(*load_training_state(resume_from, model, state.optimizer))
        logger.info("resuming after epoch %d from %s", state.epoch, resume_from)
    elif collective.is_chief:  # under DDP rank 0's weights and buffers reach every rank
        fit_transforms(model, database, config.train.seed)
        if config.model.init == "itq":
            init_from_itq(model, database, config.train.seed)


def _batching(train: Features, config: DHIMConfig, collective: Collective) -> tuple[int, Any, int | None]:
    """This worker's batch size, the neighbour table (None: off) and, across workers, batches per epoch."""
    table = neighbour_table(train.mean[:], config.train.neighbours) if config.train.neighbours else None
    batch_size = max(2, config.train.batch_size // collective.world_size)
    if collective.world_size == 1:
        return batch_size, table, None
    # Every worker runs the same number of equal batches, so the all-gathers pair up.
    per_batch = batch_size // 2 if table is not None else batch_size
    return batch_size, table, collective.agree_min(len(train) // max(1, per_batch))


def _train_epoch(epoch: int, trained: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable,
                 config: DHIMConfig, collective: Collective, n_train: int) -> EpochRecord:
    """One epoch's steps over ``batches``: its record (mean loss and MI terms); DataError if no batch."""
    sums, steps = {"loss": 0.0, "mi_local": 0.0, "mi_regulariser": 0.0}, 0
    for tokens, mask, target, pairs in batches:
        stats = train_step(trained, optimizer, tokens, mask, target, config.train, collective.gather, pairs)
        for key in sums:
            sums[key] += stats[key]
        steps += 1
    if steps == 0:
        raise DataError(f"{n_train} training documents make no batch of 2; give at least 2 documents")
    return EpochRecord(epoch, steps, *(sums[key] / steps for key in ("loss", "mi_local", "mi_regulariser")))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def epoch_message(record: dict[str, Any], k: int, best: float | None) -> str:
    """One epoch's log line, the same in-process and on the Ray driver (``record``: EpochRecord.as_dict())."""
    return (f"epoch {record['epoch']}: loss {record['loss']:.4f}, val P@{k} {_fmt(record.get('val_precision'))}, "
            f"neighbour recall@{k} {_fmt(record.get('val_neighbour_recall'))}, best {_fmt(best)} "
            f"({record['seconds']:.1f} s)")


def best_score(state: LoopState) -> float | None:
    """The criterion's best value so far; None before there is one (no selection, or still in
    the criterion's warm-up)."""
    if not state.selecting or state.stopper.best_epoch < 0:
        return None
    return state.stopper.best


def _log_epoch(record: EpochRecord, state: LoopState, k: int, bar) -> None:
    best = best_score(state)
    if bar.disable:
        logger.info("%s", epoch_message(record.as_dict(), k, best))
        return
    bar.update(1)
    bar.set_postfix(loss=f"{record.loss:.4f}", val_p=_fmt(record.val_precision), nbr=_fmt(record.val_neighbour_recall),
                    best=_fmt(best))
    logger.debug("%s", epoch_message(record.as_dict(), k, best))
