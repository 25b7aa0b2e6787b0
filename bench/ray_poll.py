"""Ray Train's poll interval against epochs shorter than it: the same `dhim-ray train --workers 2`
with the controller polling its workers every 2 s (Ray's default) and every 0.25 s (dhim-ray's).
A worker's report of an epoch waits until the controller has taken the one before, so with Ray's
default no two epochs end less than 2 s apart, however short they are.

    python -m bench ray_poll [--corpus bbc --bits 64 --epochs 12]   # the whole corpus: epochs of about 2 s here
    python -m bench ray_poll --limit 400                            # its first 400 documents: shorter epochs
                                                                    # (each run adds its entry to bench/ray_poll.json)

Each run is the whole command in a fresh process, the interval set by RAY_TRAIN_HEALTH_CHECK_INTERVAL_S;
the features come from one shared --cache-dir (written by a first, untimed run); the two settings
alternate, best of ``--repeats``. 'Training s' is the run's wall time less Ray's start and the
features: the epochs, their reports and checkpoints, and the worker group's start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import device_name, record_key

SETTINGS = {"ray_default": 2.0, "dhim_ray": 0.25}


def _train(corpus: str, limit: int | None, bits: int, epochs: int, cache: Path, out: Path, poll: float) -> dict:
    cmd = ["dhim-ray", "train", corpus, *(["--limit", str(limit)] if limit else []), "--bits", str(bits),
           "--epochs", str(epochs), "--set",
           f"train.patience={epochs}", "--workers", "2", "--cache-dir", str(cache), "--out", str(out / "m"),
           "--storage-path", str(out / "runs"), "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True,
                          env=dict(os.environ, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=str(poll)))
    wall = time.perf_counter() - t0
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "training_s": wall - summary["ray_start_seconds"] - summary["feature_seconds"],
            "mean_epoch_s": summary["mean_epoch_seconds"], "epochs_run": summary["epochs_run"],
            "best_epoch": summary["best_epoch"], "best_val_p": summary["best_val_precision_at_k_tie_aware"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="bbc")
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--limit", type=int, help="only the first N documents of each split [all]")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "features"
        _train(args.corpus, args.limit, args.bits, 1, cache, Path(tmp) / "warm", SETTINGS["dhim_ray"])  # the features
        for i in range(args.repeats):
            for name, poll in SETTINGS.items():
                runs[name].append(_train(args.corpus, args.limit, args.bits, args.epochs, cache,
                                         Path(tmp) / f"{name}-{i}", poll))
                print(name, json.dumps(runs[name][-1]), flush=True)
    best = {name: min(r, key=lambda x: x["training_s"]) for name, r in runs.items()}
    result = {"corpus": args.corpus, "limit": args.limit, "bits": args.bits, "epochs": args.epochs, "workers": 2, "repeats": args.repeats,
              "poll_s": SETTINGS, **best,
              "training_ratio": best["ray_default"]["training_s"] / best["dhim_ray"]["training_s"],
              "same_training": all(best["ray_default"][k] == best["dhim_ray"][k] for k in ("best_epoch", "best_val_p")),
              "device": device_name("cpu")}
    print(json.dumps(result, indent=1))
    record_key("ray_poll", f"{args.corpus}_{args.limit or 'all'}", result)


if __name__ == "__main__":
    main()
