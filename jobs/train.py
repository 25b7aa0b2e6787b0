"""Distributed DHIM training with Ray Train (TorchTrainer, DDP; gloo on CPU, NCCL on GPU).

Pipeline:
1. The driver loads the corpus; frozen features are computed once with Ray Data
   (``map_batches`` with ``FeatureEncoder``, one encoder per actor).
2. Each worker streams its shard of the training features (``get_dataset_shard``)
   and runs the same ``train_step`` as single-process training.
3. Global batch semantics: ``--batch-size`` is the *global* batch. Each of N
   workers takes batch/N documents per step and all-gathers the global codes
   (with gradients), so the MI loss sees exactly the same negatives, batch - 1
   per document, with 1 or N workers.
4. Rank 0 validates each epoch (val codes against training codes, P@k), decides
   early stopping and broadcasts it, so every worker stops together, and reports
   a resumable checkpoint (weights, best weights, Adam state, loop progress).
5. A worker failure restarts the group from the latest checkpoint
   (``FailureConfig(max_failures)``); ``--resume RUN_DIR`` continues a stopped run.

Ray job entrypoint:
    ray job submit --working-dir . -- python -m jobs.train dbpedia --bits 64 --workers 4 --use-gpu
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dhim_ray.checkpoint import (
    STATE_FILE,
    load_training_state,
    save_checkpoint,
    save_training_state,
)
from dhim_ray.config import DHIMConfig, FeatureConfig
from dhim_ray.encoder import Features, FrozenEncoder
from dhim_ray.errors import CheckpointError, ClusterError
from dhim_ray.model import DHIM
from dhim_ray.pipeline import load_train_val
from dhim_ray.training import (
    EarlyStopping,
    epoch_batches,
    init_from_itq,
    neighbour_table,
    seed_everything,
    selection_sample,
    train_step,
    validate,
)

from .ingest import actor_resources, split_table
from .ray_env import init_ray


@dataclass(frozen=True)
class RayTrainOptions:
    workers: int = 2
    use_gpu: bool = False
    address: str | None = None
    storage_path: Path | None = None
    resume: Path | None = None
    max_failures: int = 2
    name: str | None = None
    # Testing aid: raise in rank 0 at this epoch, once (marker file in the run dir).
    fail_at_epoch: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ClusterError(f"--workers {self.workers}: must be >= 1, e.g. --workers 2")
        if self.max_failures < 0:
            raise ClusterError(f"--max-failures {self.max_failures}: must be >= 0")


# ---- features with Ray Data -------------------------------------------------------------
class FeatureEncoder:
    """Ray Data callable class: one frozen encoder per actor, texts -> token features."""

    def __init__(self, features: dict, threads: int = 1, device: str = "cpu"):
        torch.set_num_threads(max(1, threads))
        self.encoder = FrozenEncoder(FeatureConfig(**features), device=device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        f = self.encoder.encode_batch([str(t) for t in batch["text"]])
        return {"idx": batch["idx"], "label": batch["label"], "tokens": f.tokens, "mask": f.mask,
                "cls": f.cls, "mean": f.mean}


def feature_dataset(texts: list[str], labels: np.ndarray | None, features: FeatureConfig, workers: int,
                    use_gpu: bool = False):
    """A materialised Ray Dataset of frozen features, one row per document."""
    import pyarrow as pa
    import ray

    table = pa.table({
        "idx": np.arange(len(texts), dtype=np.int64),
        "text": pa.array(texts, pa.string()),
        "label": labels if labels is not None else np.full(len(texts), -1, np.int64),
    })
    actor_cpus, threads = actor_resources(workers)
    ds = ray.data.from_arrow(split_table(table, workers * 4)).map_batches(
        FeatureEncoder,
        fn_constructor_kwargs={"features": dataclasses.asdict(features), "threads": threads,
                               "device": "cuda" if use_gpu else "cpu"},
        batch_size=64,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=actor_cpus,
        num_gpus=1 if use_gpu else 0,
        batch_format="numpy",
    )
    return ds.materialize()


def collect_features(dataset) -> tuple[Features, np.ndarray]:
    """A whole (unsplit) feature dataset -> Features and labels, in document order."""
    parts = list(dataset.iter_batches(batch_size=1024, batch_format="numpy"))
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cat["idx"])
    feats = Features(cat["tokens"][order].astype(np.float16), cat["mask"][order].astype(bool),
                     cat["cls"][order].astype(np.float32), cat["mean"][order].astype(np.float32))
    return feats, cat["label"][order]


# ---- the worker loop ---------------------------------------------------------------------
class _AllGather(torch.autograd.Function):
    """all_gather with gradients. Backward sums the gradient over ranks (all_reduce,
    which gloo and NCCL both have) and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        ctx.rank, ctx.n = dist.get_rank(), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def gather_global_codes(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, bits) on each rank -> ((N, bits) for the whole global batch, own rows' indices)."""
    import torch.distributed as dist

    all_codes = _AllGather.apply(codes)
    own = dist.get_rank() * codes.shape[0] + torch.arange(codes.shape[0], device=codes.device)
    return all_codes, own


def train_loop_per_worker(loop_config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    config = DHIMConfig.from_dict(loop_config["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    seed_everything(config.train.seed)
    model = DHIM(config.model).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.train.lr)
    stopper = EarlyStopping(config.train.patience)
    best_state, history, start_epoch = None, [], 0
    # A restart after a worker failure gets this run's latest checkpoint; --resume of an
    # earlier run starts from the checkpoint the driver found (Train v2 refuses
    # resume_from_checkpoint, so it travels in the loop config).
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and loop_config.get("resume_path"):
        checkpoint = ray.train.Checkpoint.from_directory(loop_config["resume_path"])
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            progress, best_state = load_training_state(folder, model, optimizer)
        start_epoch = progress["epoch"] + 1
        stopper.load(progress["stopper"])
        history = progress["history"]
    # This worker's shard of the cached features, read once through Ray Data and kept
    # in memory: epochs are cheap passes over it (re-streaming the split each epoch
    # would re-run Ray Data's split barrier for no gain).
    local, _ = collect_features(ray.train.get_dataset_shard("train"))
    if rank == 0:
        db, db_labels = collect_features(ray.train.get_dataset_shard("database"))
        val, val_labels = collect_features(ray.train.get_dataset_shard("val"))
        selecting = bool((db_labels >= 0).all() and (val_labels >= 0).all())
        select_db, select_labels = selection_sample(db, db_labels, config.train)
    if config.model.init == "itq" and checkpoint is None:
        # Rank 0 fits ITQ on the whole training split; DDP then broadcasts rank 0's weights.
        init_from_itq(model, db if rank == 0 else local, config.train.seed)
    unused = config.model.regulariser == "none" or config.train.beta == 0
    ddp = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={"find_unused_parameters": unused})
    gather = gather_global_codes if world > 1 else None
    per_worker = max(2, config.train.batch_size // world)
    # Neighbour positives come from this worker's shard (its nearest documents there).
    table = neighbour_table(local.mean, config.train.neighbours) if config.train.neighbours else None
    anchors_per_batch = per_worker // 2 if table is not None else per_worker
    n_batches = len(local) // max(1, anchors_per_batch)
    if world > 1:
        counts = torch.tensor([n_batches])
        dist.all_reduce(counts, op=dist.ReduceOp.MIN)
        n_batches = int(counts.item())
    trace = loop_config.get("trace_file")
    # A resumed run that had already stopped early has nothing left to do.
    if bool(history) and stopper.should_stop:
        return
    for epoch in range(start_epoch, config.train.max_epochs):
        t0 = time.perf_counter()
        if rank == 0 and trace:
            with open(trace, "a") as f:
                f.write(f"{epoch}\n")
        fail_at, marker = loop_config.get("fail_at_epoch"), loop_config.get("fail_marker")
        if rank == 0 and fail_at is not None and epoch == fail_at and not os.path.exists(marker):
            Path(marker).touch()
            raise RuntimeError(f"injected failure at epoch {epoch}")
        sums: dict[str, float] = {}
        steps = 0
        # Every worker takes the same number of equal batches (shards are equal), so the
        # all-gather of global codes always pairs up.
        rng = np.random.default_rng(config.train.seed * 10_000 + epoch)
        batches = epoch_batches(local, config, rng, device, per_worker, table)
        for tokens, mask, target, pairs in itertools.islice(batches, n_batches):
            stats = train_step(ddp, optimizer, tokens, mask, target, config.train, gather, pairs)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
        record = {"epoch": epoch, "steps": steps, **{k: v / max(steps, 1) for k, v in sums.items()}}
        stop = torch.zeros(1)
        if rank == 0:
            if selecting:
                p = validate(model, select_db, select_labels, val, val_labels, config.train.k, device)
                record["val_precision"] = p.precision_at_k_tie_aware
                if stopper.update(p.precision_at_k_tie_aware, epoch):
                    best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                stop[0] = float(stopper.should_stop)
            record["epoch_seconds"] = time.perf_counter() - t0
            history.append(record)
            print(f"[dhim-ray] epoch {epoch}: loss {record.get('loss', float('nan')):.4f} "
                  f"val P@{config.train.k} {record.get('val_precision', float('nan')):.4f} "
                  f"best {stopper.best:.4f} ({record['epoch_seconds']:.1f} s)", flush=True)
        if world > 1:
            dist.broadcast(stop, src=0)
        metrics = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        if rank == 0:
            # Not a TemporaryDirectory: report() may move the folder into storage, and a
            # cleanup that raises would kill this rank's thread while the others wait.
            tmp = tempfile.mkdtemp(prefix="dhim-ckpt-")
            progress = {"epoch": epoch, "stopper": stopper.state(), "history": history}
            save_training_state(tmp, model, config, optimizer, best_state, progress,
                                loop_config.get("fingerprint", ""))
            try:
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            ray.train.report(metrics)
        if stop.item():
            break


# ---- the driver ----------------------------------------------------------------------------
def find_resume_checkpoint(run_dir: Path):
    """The newest resumable checkpoint folder under a Ray Train run folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"--resume {run_dir}: no such folder; pass the run folder under --storage-path")
    found = sorted((p.parent for p in run_dir.rglob(STATE_FILE)), key=lambda p: p.stat().st_mtime)
    if not found:
        raise CheckpointError(
            f"--resume {run_dir}: not a dhim-ray training run (no checkpoint with {STATE_FILE}); "
            "pass the folder that 'dhim-ray train --workers N' printed as its run folder"
        )
    return str(found[-1])


def _check_gpus(opts: RayTrainOptions) -> None:
    import ray

    if not opts.use_gpu:
        return
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if gpus < opts.workers:
        raise ClusterError(
            f"--use-gpu --workers {opts.workers}: the cluster has {gpus:g} GPUs; lower --workers to {int(gpus)} "
            "or add GPU nodes (cluster.yaml)" if gpus else
            "--use-gpu: the cluster has no GPUs; drop --use-gpu or start GPU workers (cluster.yaml)"
        )


def train_distributed(
    corpus: str,
    config: DHIMConfig,
    out_dir: str | Path,
    opts: RayTrainOptions,
    text_column: str | None = None,
    label_column: str | None = None,
    drop_empty: bool = False,
    limit: int | None = None,
    cache_dir: str | Path | None = None,
    trace_file: str | None = None,
) -> dict[str, Any]:
    """Train with Ray Train and save the best checkpoint to ``out_dir`` (core format).

    Returns the summary written into the checkpoint.
    """
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    resume = find_resume_checkpoint(opts.resume) if opts.resume else None
    t_start = time.perf_counter()
    train, val, val_source = load_train_val(corpus, config, text_column, label_column, drop_empty, limit)
    encoder = FrozenEncoder(config.features)  # width and fingerprint; fails fast on a bad encoder
    config = config.replace(model={"hidden_size": encoder.hidden_size})
    fingerprint = encoder.fingerprint
    del encoder  # the actors load their own copies

    init_ray(opts.address)
    _check_gpus(opts)
    t_ray = time.perf_counter()
    train_ds = feature_dataset(train.texts, train.labels, config.features, opts.workers, opts.use_gpu)
    val_ds = feature_dataset(val.texts, val.labels, config.features, opts.workers, opts.use_gpu)
    t_features = time.perf_counter()

    storage = Path(opts.storage_path or Path(out_dir).resolve().parent / "ray_runs").resolve()
    name = opts.name or (Path(opts.resume).name if opts.resume else f"{Path(out_dir).name}-{int(time.time())}")
    run_dir = storage / name
    run_dir.mkdir(parents=True, exist_ok=True)
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1))
    per_worker_cpu = 1.0 if opts.use_gpu else max(0.1, min(1.0, (cpus - 0.5) / opts.workers))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "config": config.to_dict(),
            "fingerprint": fingerprint,
            "trace_file": trace_file,
            "fail_at_epoch": opts.fail_at_epoch,
            "fail_marker": str(run_dir / ".injected_failure"),
            "resume_path": resume,
        },
        scaling_config=ScalingConfig(num_workers=opts.workers, use_gpu=opts.use_gpu,
                                     resources_per_worker={"CPU": per_worker_cpu}),
        run_config=RunConfig(name=name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=opts.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
        datasets={"train": train_ds, "database": train_ds, "val": val_ds},
        dataset_config=DataConfig(datasets_to_split=["train"]),
    )
    try:
        result = trainer.fit()
    except Exception as exc:
        raise ClusterError(f"Ray Train failed: {str(exc).splitlines()[0][:300]}; run folder {run_dir}") from exc
    if result.checkpoint is None:
        raise ClusterError(f"Ray Train finished without a checkpoint; see the logs in {run_dir}")
    model = DHIM(config.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.train.lr)
    with result.checkpoint.as_directory() as folder:
        progress, best = load_training_state(folder, model, optimizer)
    if best is not None:
        model.load_state_dict(best)
    history = progress["history"]
    stopper = progress["stopper"]
    t_end = time.perf_counter()
    epoch_times = [h["epoch_seconds"] for h in history if "epoch_seconds" in h]
    summary = {
        "corpus": corpus,
        "n_train": len(train),
        "validation": val_source,
        "workers": opts.workers,
        "use_gpu": opts.use_gpu,
        "run_dir": str(run_dir),
        "best_epoch": stopper["best_epoch"] if best is not None else len(history) - 1,
        "epochs_run": len(history),
        "best_val_precision_at_k_tie_aware": stopper["best"] if best is not None else None,
        "ray_start_seconds": round(t_ray - t_start, 2),
        "feature_seconds": round(t_features - t_ray, 2),
        "train_seconds": round(t_end - t_features, 2),
        "mean_epoch_seconds": round(float(np.mean(epoch_times)), 2) if epoch_times else None,
        "history": history,
    }
    save_checkpoint(out_dir, model, config, fingerprint, summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``ray job submit ... -- python -m jobs.train``: the CLI's train command.

    Inside a Ray job the cluster is already up, so the address defaults to 'auto'.
    """
    from dhim_ray.cli import app

    args = list(sys.argv[1:] if argv is None else argv)
    if "--address" not in args and os.environ.get("RAY_ADDRESS"):
        args += ["--address", "auto"]
    app(["train", *args])


if __name__ == "__main__":
    main()
