"""Ray Train: in-process vs 1 and 2 workers on the same corpus and settings.

    python -m bench.ray_train --corpus dbpedia --bits 64            # the shipped schedule: 100 epochs, patience 6
    python -m bench.ray_train --runs in-process,in-process:frozen,2,2:frozen --epochs 8 --patience 100 --out bench/ray_train_gc.json

Every run records each rank's garbage-collection pauses per epoch. A run named NAME:frozen
is run NAME with the heap that stands when its first epoch starts hidden from the garbage
collector (gc.collect, then gc.freeze, what Ray Serve does after a replica starts): the A/B
for whether full collections, which walk every tracked object, stall the ranks.

All three run the library's one training loop with the same global batch, learning
rate and seed (in-process: features by the encoder in this process; Ray: by Ray Data
actors). Reports best val P@100 (tie-aware), total wall time, Ray start-up, feature
time, mean epoch time, wall time to the best epoch, and the ratios to in-process.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

from bench.harness import DATA
from dhim_ray.training.schedule import TrainCallback


class GcPauses(TrainCallback):
    """Each rank's garbage-collection pauses, per epoch, appended to ``folder``/rank-R.jsonl:
    full (generation 2) collections and their milliseconds, the young generations', and the
    objects the collector tracks. ``freeze``: at the first epoch's start, collect once and
    freeze what is alive out of the collector's sight (given back by ``close``). Defined in
    the bench's ``__main__``, so Ray pickles it by value into the workers."""

    def __init__(self, folder: str, freeze: bool = False):
        self.folder, self.freeze = folder, freeze
        self.pauses: dict[int, list[float]] | None = None
        self._started = 0.0

    def _timer(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.pauses is not None:
            self.pauses[info["generation"]].append((time.perf_counter() - self._started) * 1000)

    def on_epoch_start(self, epoch: int, state) -> None:
        if self.freeze and self.pauses is None:
            gc.collect()
            gc.freeze()
        if self._timer not in gc.callbacks:
            gc.callbacks.append(self._timer)
        self.pauses = {0: [], 1: [], 2: []}

    def on_epoch_end(self, state) -> None:
        p = self.pauses  # set by on_epoch_start, which the loop calls first
        row = {"rank": state.rank, "epoch": state.epoch, "full_collections": len(p[2]), "full_ms": sum(p[2]),
               "young_ms": sum(p[0]) + sum(p[1]), "tracked_objects": len(gc.get_objects())}
        with open(Path(self.folder) / f"rank-{state.rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self._timer in gc.callbacks:
            gc.callbacks.remove(self._timer)
        if self.freeze:
            gc.unfreeze()


def gc_summary(folder: Path) -> dict:
    """Per-epoch means over ranks and epochs of what GcPauses recorded."""
    rows = [json.loads(line) for f in sorted(folder.glob("rank-*.jsonl")) for line in f.read_text().splitlines()]
    if not rows:
        return {}
    n = len(rows)
    return {"gc_full_collections_per_epoch": sum(r["full_collections"] for r in rows) / n,
            "gc_full_ms_per_epoch": sum(r["full_ms"] for r in rows) / n,
            "gc_young_ms_per_epoch": sum(r["young_ms"] for r in rows) / n,
            "gc_tracked_objects": max(r["tracked_objects"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default="dbpedia")
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--patience", type=int, default=6)
    ap.add_argument("--out", default="bench/ray_train.json")
    ap.add_argument("--cache-dir", default="bench/.cache/features",
                    help="Frozen features shared by the three runs (computed by the first; '' recomputes each time)")
    ap.add_argument("--runs", default="in-process,1,2",
                    help="Which runs, comma-separated: in-process, on-disk (in-process, features read from disk), 1, 2; "
                         "NAME:frozen runs NAME with the heap at its first epoch hidden from the garbage collector "
                         "(gc.freeze)")
    args = ap.parse_args()
    from dhim_ray.config import config_for_bits
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.jobs.ray_env import init_ray
    from dhim_ray.jobs.train import RayTrainOptions, train_distributed
    from dhim_ray.training.pipeline import train_corpus

    init_ray(num_cpus=2)
    cfg = config_for_bits(args.bits, train={"max_epochs": args.epochs, "patience": args.patience})
    corpus = CorpusSpec(str(DATA / args.corpus))
    results = {}
    cache = args.cache_dir or None
    runs = args.runs.split(",")
    for run in runs:
        kind, _, variant = run.partition(":")
        with tempfile.TemporaryDirectory() as tmp:
            pauses = GcPauses(tmp, freeze=variant == "frozen")
            t0 = time.perf_counter()
            if kind in ("in-process", "on-disk"):  # on-disk: the same run reading its features batch by batch
                _, s = train_corpus(corpus, cfg, Path(tmp) / "m", progress=False, cache_dir=cache,
                                    feature_memory_gb=0 if kind == "on-disk" else 2.0, callbacks=(pauses,))
            else:
                s = train_distributed(corpus, cfg, Path(tmp) / "m", RayTrainOptions(
                    workers=int(kind), storage_path=Path(tmp) / "runs"), callbacks=(pauses,), cache_dir=cache)
            wall = time.perf_counter() - t0
            pauses.close()
            gc_figures = gc_summary(Path(tmp))
        epochs = [h["seconds"] for h in s["history"]]
        to_best = wall - sum(epochs[s["best_epoch"] + 1:])  # what stopping at the best epoch would have cost
        validate = [h.get("validate_seconds") or 0.0 for h in s["history"]]
        results[run] = ({k: v for k, v in s.items() if k not in ("history", "run_dir")}
                             | {"wall_seconds": wall, "wall_to_best_epoch_seconds": to_best,
                                "mean_validate_seconds": sum(validate) / max(1, len(validate))} | gc_figures)
        print(json.dumps(results[run]), flush=True)
    results["ratios_to_in_process"] = {}
    for run in runs:  # each Ray run against the in-process run of the same variant
        kind, _, variant = run.partition(":")
        base = results.get("in-process" + (f":{variant}" if variant else ""))
        if base is None or kind in ("in-process", "on-disk"):
            continue
        results["ratios_to_in_process"][run] = {
            "val_precision_diff": results[run]["best_val_precision_at_k_tie_aware"]
            - base["best_val_precision_at_k_tie_aware"],
            "wall_time": results[run]["wall_seconds"] / base["wall_seconds"],
            "epoch_time": results[run]["mean_epoch_seconds"] / base["mean_epoch_seconds"]}
    results["command"] = "python -m bench.ray_train " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in ("corpus", "bits", "epochs", "patience")
        or (k in ("runs", "out") and v != ap.get_default(k)))
    print(json.dumps(results, indent=1))
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
