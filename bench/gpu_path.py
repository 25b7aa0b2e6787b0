"""The GPU path, and training memory at 100k documents.

    python -m bench.gpu_path features --data DIR            # encoder docs/s: CPU vs GPU, same documents
    python -m bench.gpu_path train --data DIR               # epoch time: in-process CPU / GPU, Ray Train 1 GPU worker
    python -m bench.gpu_path memory --corpus GEN --data DIR # peak memory: features on disk vs in memory

DIR holds the dev corpora (default ../shared/data); GEN is a generated corpus folder
(``python -m bench.million corpus --docs 100000``). Every figure names the device.
Each subcommand writes bench/gpu_<subcommand>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import DATA


def _device_names() -> dict:
    import platform

    import torch

    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu": platform.processor() or platform.machine(), "cpu_cores": os.cpu_count(),
            "torch": torch.__version__}


def features(args) -> dict:
    """Docs/s of the frozen encoder over the same documents on the CPU and on the GPU."""
    import torch

    from dhim_ray.config import FeatureConfig
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.encoding.encoder import FrozenEncoder

    texts = CorpusSpec(str(Path(args.data) / args.corpus), "train").load_split().texts
    out = {"documents": len(texts), "max_words": 50}
    for device, batch in (("cuda", 512), ("cpu", 64)):
        if device == "cuda" and not torch.cuda.is_available():
            continue
        enc = FrozenEncoder(FeatureConfig(max_words=50), device=device)
        enc.features(texts[:batch], batch_size=batch)  # warm-up (kernels, allocator)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        enc.features(texts, batch_size=batch)
        if device == "cuda":
            torch.cuda.synchronize()
        out[device] = {"docs_per_s": len(texts) / (time.perf_counter() - t0), "batch_size": batch,
                       "threads": torch.get_num_threads()}
    if "cuda" in out:
        out["gpu_over_cpu"] = out["cuda"]["docs_per_s"] / out["cpu"]["docs_per_s"]
    return out


def _train(corpus: str, extra: list[str], out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "dhim_ray.cli", "train", corpus, "--out", str(out_dir), "--json", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    summary = json.loads(stdout)
    return {"cmd": " ".join(cmd[2:]), "wall_seconds": wall, "peak_rss_gib": usage.ru_maxrss / 2**20,
            **{k: summary.get(k) for k in ("features", "feature_seconds", "best_epoch", "epochs_run",
                                           "best_val_precision_at_k_tie_aware", "mean_epoch_seconds",
                                           "train_seconds", "n_train", "workers", "use_gpu")}}


def train(args) -> dict:
    """In-process on the CPU (capped epochs) and on the GPU, and Ray Train with one GPU worker."""
    corpus = str(Path(args.data) / args.corpus)
    base = ["--bits", str(args.bits), "--epochs", str(args.epochs)]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs["in_process_gpu"] = _train(corpus, [*base, "--device", "cuda"], Path(tmp) / "g")
        runs["ray_1_gpu_worker"] = _train(corpus, [*base, "--workers", "1", "--use-gpu",
                                                   "--storage-path", str(Path(tmp) / "runs")], Path(tmp) / "r")
        runs["in_process_cpu"] = _train(corpus, ["--bits", str(args.bits), "--epochs", str(args.cpu_epochs),
                                                 "--device", "cpu"], Path(tmp) / "c")
    for name, run in runs.items():
        print(name, json.dumps(run), flush=True)
    cpu = runs["in_process_cpu"]["mean_epoch_seconds"]
    return {"corpus": args.corpus, "bits": args.bits, "runs": runs,
            "epoch_time_cpu_over_gpu": cpu / runs["in_process_gpu"]["mean_epoch_seconds"],
            "epoch_time_ray_gpu_over_in_process_gpu": runs["ray_1_gpu_worker"]["mean_epoch_seconds"]
            / runs["in_process_gpu"]["mean_epoch_seconds"]}


def memory(args) -> dict:
    """Peak memory of the same training run with features on disk and in memory."""
    base = ["--bits", str(args.bits), "--epochs", str(args.epochs), "--device", args.device]
    runs = {}
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        for name, budget in (("on_disk", "2"), ("in_memory", "1000")):
            runs[name] = _train(args.corpus, [*base, "--feature-memory", budget], Path(tmp) / name)
            print(name, json.dumps(runs[name]), flush=True)
    return {"corpus": args.corpus, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["features", "train", "memory"])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--corpus", default="dbpedia")
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--cpu-epochs", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scratch", default=None, help="Where the memory runs write (default: the system's temp)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result = {"what": args.what, "device": _device_names(), **globals()[args.what](args)}
    print(json.dumps(result, indent=1))
    Path(args.out or f"bench/gpu_{args.what}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
