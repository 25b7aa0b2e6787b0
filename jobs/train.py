"""Distributed DHIM training with Ray Train (TorchTrainer, DDP; gloo on CPU, NCCL on GPU).

Ray Data encoder actors write the frozen features to FeatureStores on disk; each worker
reads its shard and runs the library's one loop (``dhim_ray.training.loop.fit``) over a
``ProcessGroup``; rank 0 checkpoints every epoch, and a lost worker restarts the group from
it (``FailureConfig``). How it divides the work: docs/training.md."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.config import DHIMConfig, FeatureConfig
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.encoding.encoder import Features, FrozenEncoder
from dhim_ray.encoding.feature_store import FeatureStore, StoreWriter, check_cache_dir
from dhim_ray.errors import CheckpointError, ConfigError, TrainingFailed, TrainingInterrupted, first_line
from dhim_ray.model.checkpoint import (
    STATE_META,
    load_checkpoint,
    save_training_state,
)
from dhim_ray.training.loop import FitResult, LoopState, TrainCallback, best_score, epoch_message, fit
from dhim_ray.training.pipeline import DEFAULT_FEATURE_MEMORY_GB, Prepared, load_train_val, pick_device, train

from .ray_env import (
    actor_resources,
    check_capacity,
    check_shared_paths,
    cluster_address,
    cluster_cpus,
    init_ray,
    split_table,
    task_errors,
)

logger = logging.getLogger(__name__)


# ---- features with Ray Data, into a FeatureStore ------------------------------------------
#: Documents per encoder forward pass inside a feature-writing actor.
ENCODER_BATCH = 64

class FeatureWriter:
    """Ray Data callable class: one frozen encoder per actor; encodes a batch of texts and
    writes each row straight into its FeatureStore (column ``store``: which of ``writers``).
    Only row counts travel back to the driver, so neither the driver nor Ray's object store
    holds features."""

    def __init__(self, features: dict, writers: list[StoreWriter], threads: int = 1, device: str = "cpu",
                 reach: int | None = None):
        import torch

        torch.set_num_threads(max(1, threads))
        self.encoder = FrozenEncoder(FeatureConfig(**features), device=device, reach=reach)
        self.writers = writers

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A Ray batch is many encoder batches: sorted by length inside it, padded per encoder batch.
        f = self.encoder.features([str(t) for t in batch["text"]], batch_size=ENCODER_BATCH)
        stores, rows = np.unique(batch["store"], return_counts=True)
        for store in stores:
            at = batch["store"] == store
            self.writers[store].write_rows(batch["idx"][at], f.tokens[at], f.mask[at], f.cls[at], f.mean[at])
        return {"store": stores, "rows": rows}


def build_feature_stores(parts: list[tuple[list[str], Path]], features: FeatureConfig, hidden: int,
                         fingerprint: str, workers: int, use_gpu: bool = False, progress: bool = False,
                         reach: int | None = None) -> list[Path]:
    """Frozen features of each (texts, folder) of ``parts`` in a FeatureStore at its folder,
    computed by one pool of Ray Data encoder actors (one per worker) that write their rows
    themselves: train and val take one actor start-up, not two. An existing complete store is
    reused. On a multi-node cluster the folders must be on a file system every node mounts (as
    Ray Train's storage path)."""
    import pyarrow as pa
    import ray
    from tqdm.auto import tqdm

    todo: dict[Path, list[str]] = {}  # the stores to build, each once
    for texts, folder in parts:
        if folder not in todo and not FeatureStore.is_complete(folder):
            todo[folder] = texts
    if not todo:
        return [folder for _, folder in parts]
    folders = list(todo)
    check_cache_dir(folders[0].parent, sum(FeatureStore.nbytes_for(len(todo[f]), features.n_tokens - 1, hidden)
                                           for f in folders))  # all of them, before any is written
    stores = [FeatureStore.create(folder, len(todo[folder]), features.n_tokens - 1, hidden) for folder in folders]
    table = pa.table({"store": np.repeat(np.arange(len(folders)), [len(todo[f]) for f in folders]),
                      "idx": np.concatenate([np.arange(len(todo[f]), dtype=np.int64) for f in folders]),
                      "text": pa.array([t for f in folders for t in todo[f]], pa.string())})
    actor_cpus, threads = actor_resources(workers)
    ds = ray.data.from_arrow(split_table(table, workers * 4)).map_batches(
        FeatureWriter,
        fn_constructor_kwargs={"features": dataclasses.asdict(features), "writers": [s.writer() for s in stores],
                               "threads": threads, "device": "cuda" if use_gpu else "cpu", "reach": reach},
        batch_size=ENCODER_BATCH * 8,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=actor_cpus,
        num_gpus=1 if use_gpu else 0,
        batch_format="numpy",
    )
    done = np.zeros(len(folders), dtype=np.int64)
    with tqdm(total=table.num_rows, desc="encoding", unit="doc", disable=not progress, leave=False) as bar, \
            task_errors():
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            np.add.at(done, batch["store"], batch["rows"])
            bar.update(int(batch["rows"].sum()))
    for folder, store, n in zip(folders, stores, done):
        if n != len(todo[folder]):
            raise TrainingFailed(f"feature encoding wrote {n} of {len(todo[folder])} documents into {folder}; rerun")
        store.finish(fingerprint=fingerprint, cleaning=features.cleaning)
    return [folder for _, folder in parts]


def open_features(folder: str | Path, memory_gb: float | None, rows: tuple[int, int] | None = None) -> Features:
    """A store's features (rows [a, b) only, when given): read into memory when they fit
    in ``memory_gb``, else left on disk and read batch by batch."""
    store = FeatureStore.open(folder)
    a, b = rows or (0, len(store))
    in_memory = memory_gb is None or (b - a) / max(1, len(store)) * store.nbytes <= memory_gb * 2**30
    return Features(**store.columns(in_memory, (a, b)))


# ---- the worker ---------------------------------------------------------------------------
class ReportEachEpoch(TrainCallback):
    """Every rank reports each epoch to Ray Train; rank 0 attaches a resumable checkpoint
    and tells the driver (``events``, a Ray queue) so it can log the epoch."""

    def __init__(self, fingerprint: str, events=None):
        self.fingerprint, self.events = fingerprint, events

    def on_epoch_end(self, state: LoopState) -> None:
        import ray.train

        record = state.history[-1]
        metrics = {k: v for k, v in record.as_dict().items() if v is not None}
        if state.rank != 0:
            ray.train.report(metrics)
            return
        if self.events is not None:
            self.events.put({**record.as_dict(), "best": best_score(state)},
                            block=False)
        # Not a TemporaryDirectory: report() may move the folder into storage.
        tmp = tempfile.mkdtemp(prefix="dhim-ckpt-")
        save_training_state(tmp, state.model, state.config, state.optimizer, state.best_state, state.progress(),
                            self.fingerprint)
        try:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train's per-worker function: open this worker's shard of the feature store,
    then run the library's loop."""
    import ray.train
    import ray.train.torch
    import torch

    from dhim_ray.training.distributed import ProcessGroup

    if loop_config.get("threads"):
        torch.set_num_threads(loop_config["threads"])
    config = DHIMConfig.from_dict(loop_config["config"])
    device = ray.train.torch.get_device()
    collective = ProcessGroup(device)
    memory = loop_config.get("feature_memory_gb")
    per_worker = None if memory is None else memory / collective.world_size
    n_train = FeatureStore.open(loop_config["train_store"]).meta["n"]
    # This worker reads only its own rows of the training features (in memory when they
    # fit its share of the budget, else batch by batch from disk).
    local = open_features(loop_config["train_store"], per_worker, collective.my_rows(n_train))
    # Every rank takes its share of the validation search each epoch: it hashes part of a
    # fixed sample of the training documents (read once) and scores part of the val split.
    # Only rank 0 fits the ITQ start (one chunked pass over the split). Both stay on disk
    # until read.
    database = local if collective.world_size == 1 else open_features(loop_config["train_store"], 0.0)
    val = open_features(loop_config["val_store"], per_worker)
    database_labels, val_labels = loop_config["train_labels"], loop_config["val_labels"]
    # A restart after a worker failure gets this run's latest checkpoint; --resume of a
    # stopped run starts from the one the driver found (it travels in the loop config).
    checkpoint = ray.train.get_checkpoint()
    resume_from = None
    if checkpoint is not None:
        resume_from = checkpoint.to_directory(tempfile.mkdtemp(prefix="dhim-resume-"))
    elif loop_config.get("resume_path"):
        resume_from = loop_config["resume_path"]
    unused = config.model.regulariser == "none" or config.train.beta == 0

    def wrap(model):
        return ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": unused})

    callbacks = [ReportEachEpoch(loop_config["fingerprint"], loop_config.get("events")),
                 *loop_config.get("callbacks", ())]
    fit(local, val, config, None, val_labels, database=database, database_labels=database_labels, progress=False,
        device=device, collective=collective, resume_from=resume_from, callbacks=callbacks, wrap_model=wrap)


# ---- the driver ----------------------------------------------------------------------------
def find_resume_checkpoint(run_dir: Path) -> str:
    """The checkpoint of the latest finished epoch under a Ray Train run folder."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise CheckpointError(f"resume={run_dir}: no such folder; pass the run folder a distributed train printed", field="resume")
    found = []
    for meta in run_dir.rglob(STATE_META):
        try:
            found.append((int(json.loads(meta.read_text())["progress"]["epoch"]), str(meta.parent)))
        except (OSError, ValueError, KeyError, TypeError):
            logger.warning("skipping an unreadable checkpoint in %s", meta.parent)
    if not found:
        raise CheckpointError(
            f"resume={run_dir}: not a dhim-ray training run (no checkpoint with {STATE_META}); "
            "pass the run folder a distributed train printed", field="resume"
        )
    return max(found)[1]


END_OF_RUN = "end of run"


def _log_events(events, k: int) -> None:
    """One log line per finished epoch from rank 0's reports, until END_OF_RUN (long waits: each is a call)."""
    from ray.util.queue import Empty

    while True:
        try:
            e = events.get(timeout=60)
        except Empty:
            continue
        except Exception:  # the queue actor is gone: the run is over
            return
        if e == END_OF_RUN:
            return
        logger.info("%s", epoch_message(e, k, e.get("best")))


def _fit_off_the_main_thread(trainer):
    """``trainer.fit()`` off the main thread, so Ctrl-C is ours: Ray Train's SIGINT handler says nothing kept."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # handed to the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.5)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@dataclass
class RayTrain:
    """The training backend (dhim_ray.training.pipeline.TrainBackend) that runs the epochs
    on Ray Train workers: features computed once by Ray Data encoder actors into stores
    (``cache_dir``, kept and reused; else in the run folder, removed at the end), one
    TorchTrainer run per model trained, its checkpoints in a Ray run folder that
    ``--resume RUN_DIR`` continues."""

    request: TrainRequest
    callbacks: tuple[TrainCallback, ...] = ()
    progress: bool = False
    name: str | None = None
    started: int = field(default_factory=lambda: int(time.time()), init=False)

    def storage(self, out: Path) -> Path:
        return Path(self.request.storage_path or out.parent / "ray_runs").resolve()

    def resume_point(self, out: Path) -> Path:
        return Path(find_resume_checkpoint(self.request.resume))

    def prepare(self, corpus: CorpusSpec, config: DHIMConfig, out: Path) -> Prepared:
        t_start = time.perf_counter()
        train, val, val_source = load_train_val(corpus, config)
        # width, fingerprint and store keys; fails fast on a bad encoder
        encoder = FrozenEncoder(config.features, reach=config.model.pad_reach)
        config = config.for_encoder(encoder.hidden_size)
        init_ray(self.request.address)
        check_capacity(self.request.workers, self.request.use_gpu)
        # Features are computed once into stores that every worker opens: a shared --cache-dir
        # is reused by later runs, in-process ones too.
        if self.request.cache_dir is not None:
            stores = Path(self.request.cache_dir).resolve()
        else:
            stores = self.storage(out) / self._run_name(out) / "features"
        # Encoder actors write the stores and every worker reads them and writes checkpoints:
        # on a cluster a folder only this machine sees fails here, not at the first epoch.
        shared = {"--storage-path": (self.storage(out), True)}
        if self.request.cache_dir is not None:
            shared["--cache-dir"] = (stores, True)
        check_shared_paths(shared)
        t_ray = time.perf_counter()
        train_store, val_store = build_feature_stores(
            [(split.texts, encoder.store_path(split.texts, stores)) for split in (train, val)], config.features,
            encoder.hidden_size, encoder.fingerprint, self.request.workers, self.request.use_gpu, self.progress,
            reach=encoder.reach)
        context = {"corpus": corpus.display, "n_train": len(train), "validation": val_source,
                   "workers": self.request.workers, "use_gpu": self.request.use_gpu,
                   "ray_start_seconds": round(t_ray - t_start, 2),
                   "feature_seconds": round(time.perf_counter() - t_ray, 2)}
        features = {"train_store": str(train_store), "val_store": str(val_store), "train_labels": train.labels,
                    "val_labels": val.labels}
        features["stores"] = stores
        return Prepared(config, encoder.fingerprint, context, features)

    def _run_name(self, out: Path) -> str:
        if self.name:
            return self.name
        return Path(self.request.resume).resolve().name if self.request.resume else f"{out.name}-{self.started}"

    def fit(self, prepared: Prepared, out: Path, resume_from: Path | None) -> tuple[FitResult, dict[str, Any]]:
        import ray
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        config = prepared.config
        storage, name = self.storage(out), self._run_name(out)
        run_dir = storage / name
        run_dir.mkdir(parents=True, exist_ok=True)
        logger.info("Ray Train run folder: %s", run_dir)
        opts = self.request  # one training run's options
        cpus = cluster_cpus()
        per_worker_cpu = 1.0 if opts.use_gpu else max(0.1, min(1.0, (cpus - 0.5) / opts.workers))
        # A local Ray shares this machine's cores among the workers; on a cluster Ray's default stands.
        threads = max(1, int(cpus // opts.workers)) if cluster_address(opts.address) is None else None
        # On the driver's node: a worker node that dies must not take the epoch log with it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        events = Queue(maxsize=10_000, actor_options={"num_cpus": 0, "scheduling_strategy": here})
        features = {k: v for k, v in prepared.features.items() if k != "stores"}
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"config": config.to_dict(), "fingerprint": prepared.fingerprint,
                               "resume_path": str(resume_from) if resume_from else None,
                               "callbacks": list(self.callbacks), "events": events, "threads": threads,
                               "feature_memory_gb": self.request.feature_memory_gb, **features},
            scaling_config=ScalingConfig(num_workers=opts.workers, use_gpu=opts.use_gpu,
                                         resources_per_worker={"CPU": per_worker_cpu}),
            run_config=RunConfig(name=name, storage_path=str(storage),
                                 failure_config=FailureConfig(max_failures=opts.max_failures),
                                 checkpoint_config=CheckpointConfig(num_to_keep=2)),
        )
        printer = threading.Thread(target=_log_events, args=(events, config.train.k), daemon=True)
        printer.start()
        t0 = time.perf_counter()
        try:
            result = _fit_off_the_main_thread(trainer)
        except KeyboardInterrupt:
            raise TrainingInterrupted(
                f"interrupted; finished epochs are checkpointed in {run_dir}; continue with the same command and "
                f"resume={run_dir}"
            ) from None
        except Exception as exc:
            first = first_line(exc, 300)
            raise TrainingFailed(f"Ray Train failed ({first}); finished epochs are in {run_dir}: fix the cause and "
                                 f"rerun with resume={run_dir} (-v shows Ray's logs)") from exc
        finally:
            try:
                events.put(END_OF_RUN, timeout=5)  # after every epoch's record: the queue keeps order
            except Exception as exc:  # the queue actor is gone with the run
                logger.debug("ending the epoch log: %s", exc)
            printer.join(timeout=5)
        if result.checkpoint is None:
            raise TrainingFailed(f"Ray Train finished without a checkpoint; see the logs in {run_dir} (-v)")
        with result.checkpoint.as_directory() as saved_dir:
            model, _, _ = load_checkpoint(saved_dir)  # the best epoch's weights (or the last without labels)
            saved = json.loads((Path(saved_dir) / STATE_META).read_text())
        fitted = FitResult.from_progress(model, config, saved["progress"], saved["has_best"], time.perf_counter() - t0)
        return fitted, {"run_dir": str(run_dir)}

    def finish(self, prepared: Prepared) -> None:
        if self.request.cache_dir is None:
            shutil.rmtree(prepared.features["stores"], ignore_errors=True)


@dataclass(frozen=True)
class TrainRequest:
    """One training run, checked once when made: ``workers`` > 1, ``use_gpu`` or an ``address``
    train with Ray Train, else in this process on ``device``; ``resume``: an interrupted run's
    ``out_dir`` (in-process) or Ray run folder; ``out_dir`` defaults to runs/CORPUS-BITS. The
    fields are ``dhim-ray train``'s options (docs/training.md)."""

    corpus: CorpusSpec
    config: DHIMConfig
    out_dir: Path | None = None
    workers: int = 1
    use_gpu: bool = False
    address: str | None = None
    storage_path: Path | None = None
    resume: Path | None = None
    max_failures: int = 2
    cache_dir: Path | None = None
    feature_memory_gb: float = DEFAULT_FEATURE_MEMORY_GB
    device: str = "auto"

    def __post_init__(self):
        if isinstance(self.workers, bool) or self.workers < 1:
            raise ConfigError(f"workers={self.workers}: must be >= 1, e.g. workers=2", field="workers")
        if self.max_failures < 0:
            raise ConfigError(f"max_failures={self.max_failures}: must be >= 0", field="max_failures")
        if not 0 <= self.feature_memory_gb < float("inf"):  # NaN and infinity too
            raise ConfigError(f"feature_memory={self.feature_memory_gb}: must be a finite number >= 0 GiB (0 keeps "
                              "every feature on disk)", field="feature_memory")
        check_cache_dir(self.cache_dir)
        if not self.distributed:  # Ray Train places its workers itself (use_gpu)
            object.__setattr__(self, "device", pick_device(self.device))
        out = None if self.out_dir is None else Path(self.out_dir)
        if self.resume is not None and not self.distributed:  # an in-process run resumes where it writes
            if out is not None and out.resolve() != Path(self.resume).resolve():
                raise ConfigError(f"resume={self.resume} with out={out}: an in-process run resumes in its own out "
                                  f"folder; give resume={self.resume} alone (or the same folder to both)", field="resume")
            out = Path(self.resume)
        if out is None:
            name = self.corpus.name
            name = Path(name).name if Path(name).exists() else name.replace("/", "_")
            out = Path("runs") / f"{name}-{self.config.model.n_bits}"
        object.__setattr__(self, "out_dir", out)

    @property
    def distributed(self) -> bool:
        """Whether Ray Train runs it (several workers, GPUs or a cluster)."""
        return self.workers > 1 or self.use_gpu or cluster_address(self.address) is not None


def run_training(request: TrainRequest, progress: bool = True) -> dict[str, Any]:
    """``request`` trained, its best checkpoint saved in ``request.out_dir`` with its curve
    (training.png): the run summary, ``curve`` its path."""
    r = request
    if r.distributed:
        summary = train_distributed(r, progress=progress)
    else:
        from dhim_ray.training.pipeline import train_corpus

        summary = train_corpus(r.corpus, r.config, r.out_dir, progress=progress, cache_dir=r.cache_dir,
                               resume=r.resume is not None, device=r.device, feature_memory_gb=r.feature_memory_gb)
    prepare_searches(Path(r.out_dir))
    return {**summary, "curve": draw_training_curve(Path(r.out_dir), summary)}


def prepare_searches(out_dir: Path) -> None:
    """The model's query graph made (and cached) now, at training's end, so its first search is as
    fast as the next instead of paying for it (once per model and machine)."""
    from dhim_ray.graph_hasher import load_query_hasher

    t0 = time.perf_counter()
    load_query_hasher(out_dir)
    logger.info("prepared %s for searches (%.0f s)", out_dir, time.perf_counter() - t0)


def draw_training_curve(out_dir: Path, summary: dict[str, Any]) -> str | None:
    """training.png beside the checkpoint (the selection score and the loss per epoch): its path,
    or None where matplotlib is missing (said in the log)."""
    from dhim_ray.plots import INSTALL, plotting_available, training_curve

    if not plotting_available():
        logger.info("no training curve: %s draws %s", INSTALL, out_dir / "training.png")
        return None
    drawn = training_curve(summary, out_dir / "training.png")
    return None if drawn is None else str(drawn)


def train_distributed(request: TrainRequest, callbacks: tuple[TrainCallback, ...] = (), progress: bool = False,
                      name: str | None = None) -> dict[str, Any]:
    """``request`` trained with Ray Train (one worker too), its best checkpoint saved in
    ``request.out_dir``: the run summary. ``callbacks`` run in every worker (they must pickle);
    ``name``: the Ray run folder's (default OUT-TIME). Raises TrainingInterrupted (Ctrl-C) or
    TrainingFailed, both naming the run folder to resume."""
    out_dir = Path(request.out_dir).resolve()  # checked (and removed again if the run is refused) by train()
    backend = RayTrain(request, tuple(callbacks), progress, name)
    return train(request.corpus, request.config, out_dir, backend, resume=request.resume is not None)[1]
