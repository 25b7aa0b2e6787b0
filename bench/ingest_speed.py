"""Ingest at the encoder's speed? ``dhim-ray ingest`` of a generated corpus into milvus-lite,
end to end (scan, encode, write, verify), against ``Hasher.encode`` over the same documents
on the same cores, with Ray already running (as on a cluster taking ``ray job submit``).

    python -m bench.ingest_speed --docs 100000        # writes bench/ingest_speed.json

The corpus: dbpedia's training abstracts (50 words kept) cycled to ``--docs`` rows, each made
unique by its row number, in 8 Parquet files. The model is a freshly initialised 64-bit head
(weights do not change speed). ``Hasher.encode`` runs in this process with 2 threads on a
sample of ``--sample`` documents; the ingest runs 2 encoding actors of 1 thread each.
Then the same ingest twice more: after its last tenth of rows is deleted (an ingest that died
at 90%), and with every row stored; each row's digest lets a rerun pass over what it stored.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench.harness import DATA, device_name, read_texts, write_result


def make_corpus(folder: Path, n_docs: int, files: int = 8) -> Path:
    texts = read_texts(DATA / "dbpedia" / "train.csv")
    out = folder / "corpus"
    (out / "train").mkdir(parents=True)
    per = -(-n_docs // files)
    for f in range(files):
        rows = range(f * per, min(n_docs, (f + 1) * per))
        pq.write_table(pa.table({"text": [f"{texts[i % len(texts)]} ({i})" for i in rows]}),
                       out / "train" / f"part-{f:03d}.parquet", row_group_size=4096)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    from dhim_ray.config import config_for_bits
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.jobs.ray_env import init_ray
    from dhim_ray.model.checkpoint import save_checkpoint
    from dhim_ray.training.loop import build_model

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = make_corpus(tmp, args.docs)
        enc = FrozenEncoder(config_for_bits(64).features)
        cfg = config_for_bits(64, model={"hidden_size": enc.hidden_size})
        model_dir = save_checkpoint(tmp / "m", build_model(cfg), cfg, enc.fingerprint)
        del enc
        hasher = Hasher.load(model_dir)
        sample = [f"{t} ({i})" for i, t in enumerate(read_texts(DATA / "dbpedia" / "train.csv", args.sample))]
        hasher.encode(sample[:256])  # warm-up
        t0 = time.perf_counter()
        hasher.encode(sample)
        hasher_rate = len(sample) / (time.perf_counter() - t0)
        print({"hasher_docs_per_s": round(hasher_rate, 1)}, flush=True)
        del hasher
        init_ray(num_cpus=2)  # Ray already up: its start is not the ingest's
        spec, target = CorpusSpec(str(corpus), "train"), MilvusTarget(str(tmp / "i.db"), "bench")
        result = run_ingest(IngestRequest(spec, model_dir, target, workers=args.workers), progress=False)
        row = {"device": device_name("cpu"), "docs": args.docs, "workers": args.workers,
               "hasher_encode_docs_per_s": round(hasher_rate, 1),
               "ingest_docs_per_s": round(result.docs_per_second, 1),
               "ratio": round(result.docs_per_second / hasher_rate, 3),
               "ingest_seconds": round(result.seconds, 1), "verified": result.verified}
        print(row, flush=True)
        # Reruns: after an ingest that died at 90% (its last tenth of rows deleted), then of a whole one.
        with target.open() as collection:
            collection.delete_stale_rows(result.source, args.docs * 9 // 10 - 1)
        for name in ("rerun_after_90", "rerun_complete"):
            t0 = time.perf_counter()
            again = run_ingest(IngestRequest(spec, model_dir, target, workers=args.workers), progress=False)
            row[name] = {"seconds": round(time.perf_counter() - t0, 1), "rows_written": again.rows_written,
                         "rows_unchanged": again.rows_unchanged, "verified": again.verified}
            print(name, row[name], flush=True)
        write_result("ingest_speed", row)


if __name__ == "__main__":
    main()
