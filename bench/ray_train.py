"""Ray Train: in-process vs 1 and 2 workers on the same corpus and settings.

    python -m bench.ray_train --corpus dbpedia --bits 64            # the shipped schedule: 100 epochs, patience 6

All three run the library's one training loop with the same global batch, learning
rate and seed (in-process: features by the encoder in this process; Ray: by Ray Data
actors). Reports best val P@100 (tie-aware), total wall time, Ray start-up, feature
time, mean epoch time, wall time to the best epoch, and the ratios to in-process.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.harness import DATA


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
                    help="Which runs, comma-separated: in-process, on-disk (in-process, features read from disk), 1, 2")
    args = ap.parse_args()
    from dhim_ray.config import config_for_bits
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.jobs.ray_env import init_ray
    from dhim_ray.jobs.train import TrainRequest, train_distributed
    from dhim_ray.training.pipeline import train_corpus

    init_ray(num_cpus=2)
    cfg = config_for_bits(args.bits, train={"max_epochs": args.epochs, "patience": args.patience})
    corpus = CorpusSpec(str(DATA / args.corpus))
    results = {}
    cache = args.cache_dir or None
    runs = args.runs.split(",")
    for kind in runs:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            if kind in ("in-process", "on-disk"):  # on-disk: the same run reading its features batch by batch
                s = train_corpus(corpus, cfg, Path(tmp) / "m", progress=False, cache_dir=cache,
                                    feature_memory_gb=0 if kind == "on-disk" else 2.0)
            else:
                s = train_distributed(TrainRequest(corpus, cfg, Path(tmp) / "m", workers=int(kind),
                                                   storage_path=Path(tmp) / "runs", cache_dir=cache))
            wall = time.perf_counter() - t0
        epochs = [h["seconds"] for h in s["history"]]
        to_best = wall - sum(epochs[s["best_epoch"]:])  # what stopping at the best epoch (counted from 1) would have cost
        validate = [h.get("validate_seconds") or 0.0 for h in s["history"]]
        results[kind] = ({k: v for k, v in s.items() if k not in ("history", "run_dir")}
                         | {"wall_seconds": wall, "wall_to_best_epoch_seconds": to_best,
                            "mean_validate_seconds": sum(validate) / max(1, len(validate))})
        print(json.dumps(results[kind]), flush=True)
    results["ratios_to_in_process"] = {}
    base = results.get("in-process")
    for run in runs:  # each Ray run against the in-process run
        if base is None or run in ("in-process", "on-disk"):
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
