"""Ray worker priority: an ingest beside other busy processes, workers at nice 15 vs 0.

    python -m bench.worker_priority            # 120 packaged BBC documents, one busy loop per core

Ray's default starts its workers 15 nice levels below the driver (``RAY_worker_niceness``);
this stack's local runs start them at the user's own priority (0). The bench trains a
small model once, then times the same ``dhim-ray ingest`` (a fresh Ray and milvus-lite
file each run, as a user's command) three ways: a quiet machine, and beside one busy
loop per core (at the user's priority) with the workers at nice 15 and at 0. Ratios are
to the quiet run; results in bench/worker_priority.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _spin() -> None:
    while True:
        pass


def ingest_seconds(model: Path, docs: int, niceness: int, folder: Path) -> dict:
    """Wall time of one ``dhim-ray ingest`` subprocess, and the seconds it reports itself."""
    db = folder / f"nice{niceness}-{time.monotonic_ns()}.db"
    env = dict(os.environ, RAY_worker_niceness=str(niceness), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "ingest", "bbc", "--split", "train", "--limit",
                          str(docs), "--model", str(model), "--uri", str(db), "--collection", "bench", "--json"],
                         capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    if run.returncode:
        raise SystemExit(f"ingest failed: {run.stderr[-2000:]}")
    result = json.loads(run.stdout)
    return {"wall_seconds": round(wall, 1), "ingest_seconds": round(result["seconds"], 1),
            "documents": result["n_documents"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy loops beside the ingest")
    ap.add_argument("--out", default=str(HERE / "worker_priority.json"))
    args = ap.parse_args()
    from dhim_ray.config import config_for_bits
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.training.pipeline import train_corpus

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = folder / "model"
        train_corpus(CorpusSpec("bbc"), config_for_bits(16, train={"max_epochs": 1}), model, progress=False)
        rows = {"quiet, workers at nice 0": {"niceness": 0, "busy_loops": 0,
                                             **ingest_seconds(model, args.docs, 0, folder)}}
        spinners = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
        for p in spinners:
            p.start()
        try:
            for niceness in (15, 0):
                rows[f"busy, workers at nice {niceness}"] = {"niceness": niceness, "busy_loops": args.busy,
                                                             **ingest_seconds(model, args.docs, niceness, folder)}
        finally:
            for p in spinners:
                p.terminate()
    quiet = rows["quiet, workers at nice 0"]["wall_seconds"]
    for row in rows.values():
        row["wall_ratio_to_quiet"] = round(row["wall_seconds"] / quiet, 2)
    out = {"command": "python -m bench.worker_priority" + (f" --docs {args.docs}" if args.docs != 120 else ""),
           "cpus": os.cpu_count(), "runs": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
