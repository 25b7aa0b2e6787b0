"""Ray Train: 1 vs 2 workers on the same corpus and settings (quality and wall time).

    python -m bench.ray_train --corpus dbpedia --bits 64 --epochs 5

Same global batch, learning rate and seed; features computed by Ray Data in both
runs. Reports best val P@100 (tie-aware), total wall time, Ray start-up, feature
time and mean epoch time, and the 2-worker/1-worker ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default="dbpedia")
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--out", default="bench/ray_train.json")
    args = ap.parse_args()
    from dhim_ray.config import config_for_bits
    from dhim_ray.data import CorpusSpec
    from dhim_ray.jobs.ray_env import init_ray
    from dhim_ray.jobs.train import RayTrainOptions, train_distributed

    init_ray(num_cpus=2)
    cfg = config_for_bits(args.bits, train={"max_epochs": args.epochs, "patience": args.epochs})
    results = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            s = train_distributed(CorpusSpec(str(DATA / args.corpus)), cfg, Path(tmp) / "m",
                                  RayTrainOptions(workers=workers, storage_path=Path(tmp) / "runs"))
            wall = time.perf_counter() - t0
        results[workers] = {k: v for k, v in s.items() if k not in ("history", "run_dir")} | {"wall_seconds": wall}
        print(json.dumps(results[workers]), flush=True)
    results["ratio_2_vs_1"] = {
        "val_precision_diff": results[2]["best_val_precision_at_k_tie_aware"]
        - results[1]["best_val_precision_at_k_tie_aware"],
        "wall_time": results[2]["wall_seconds"] / results[1]["wall_seconds"],
        "epoch_time": results[2]["mean_epoch_seconds"] / results[1]["mean_epoch_seconds"],
    }
    print(json.dumps(results, indent=1))
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
