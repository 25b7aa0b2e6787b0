"""The ingest on a device machine in one command: what bounds it, and how near the ingest comes.

    python -m bench device_ingest --model runs/bbc-64            # on a GPU machine: 6-8 minutes
    python -m bench device_ingest --model M --dry-run            # any machine, on CPU: every step, small

What the device image lacks (Ray, pymilvus, milvus-lite, tantivy, the packaged encoder) travels
first, in calls of at most 64 MiB: bench/device_carry.py.

Each step in the same run, on the same corpus (the packaged BBC corpus cycled to --docs
documents: a device machine has no ../shared): the encoder alone (ingest's encoding actor fed
token ids, at each precision), the store's own rate (the connector's column write of rows built
first, words included, into a new milvus-lite file), the pipeline with the encoder bypassed
(bench.million's StoredCodes), and ``dhim-ray ingest`` end to end (``--use-gpu`` on a GPU) with
the GPU's busy share sampled; last, 500 documents' codes on the device against the CPU's.
The ratios are the issue's: the ingest over the slower of the encoder alone and the store.
Results go to bench/device_ingest.json (--out).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.gpu_path import _device_names, _seconds, _timed_ingest
from bench.million import child_json
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec


def cycled_bbc(n_docs: int, out: Path) -> tuple[Path, list[str]]:
    """``n_docs`` documents: the packaged BBC corpus' training texts, cycled, as Parquet parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    split = load_split(CorpusSpec("bbc", "train"))
    (out / "train").mkdir(parents=True, exist_ok=True)
    for part, start in enumerate(range(0, n_docs, 100_000)):
        rows = [i % len(split.texts) for i in range(start, min(n_docs, start + 100_000))]
        pq.write_table(pa.table({"text": [split.texts[i] for i in rows], "label": [int(split.labels[i]) for i in rows]}),
                       out / "train" / f"part-{part:05d}.parquet")
    return out, [split.texts[i % len(split.texts)] for i in range(n_docs)]


def encoder_alone(model: str, texts: list[str], device: str, precision: str, batch: int) -> float:
    """Docs/s of ingest's encoding actor, at ``precision``, fed the token ids its tokenising actors send."""
    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import SORTED_BATCHES, CodeEncoder, TokenIds

    base = Hasher.load(model, device=device, backend="torch")
    encoder = FrozenEncoder(base.config.features, device=device, model=base.encoder.model,
                            tokenizer=base.encoder.tokenizer, reach=base.encoder.reach, precision=precision,
                            backend="torch")
    actor = CodeEncoder.__new__(CodeEncoder)  # what the ingest's actor holds, at this precision
    actor.hasher, actor.batch_size = Hasher.load(model, device=device, encoder=encoder), batch
    step = batch * SORTED_BATCHES
    fed = [TokenIds(base.config.features)({"text": np.array(texts[i : i + step], dtype=object)})
           for i in range(0, len(texts), step)]
    best = min(_seconds(lambda: [actor(dict(b)) for b in fed], device) for _ in range(2))  # the first warms up
    return len(texts) / best


def store_alone(model: str, texts: list[str], db: Path, write_batch: int) -> float:
    """Rows/s of the connector's column write (words, then row) into a new file, the rows built first."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.hasher import Hasher

    n_bits = Hasher.check(model).n_bits
    codes = np.random.default_rng(0).integers(0, 256, (len(texts), n_bits // 8), dtype=np.uint8)
    rows = np.arange(len(texts))
    batches = [code_rows({"id": document_ids("bench:device", rows[i : i + write_batch]), "row": rows[i : i + write_batch],
                          "code": codes[i : i + write_batch], "text": texts[i : i + write_batch],
                          "label": np.zeros(len(rows[i : i + write_batch]), np.int64)}, n_bits, "bench:device")
               for i in range(0, len(texts), write_batch)]
    with MilvusTarget(str(db), "store", timeout=3600).open() as collection:
        collection.ensure(n_bits, "bench:device", text_index=True)
        t0 = time.perf_counter()
        for batch in batches:
            collection.upsert(batch, new=True)
        seconds = time.perf_counter() - t0
    return len(texts) / seconds


def run(args) -> dict:
    from dhim_ray.hasher import Hasher

    out: dict = {"model": str(args.model), "docs": args.docs, "device": _device_names(), "dry_run": args.dry_run}
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        corpus, texts = cycled_bbc(args.docs, Path(tmp) / "corpus")
        sample = texts[: min(len(texts), args.encoder_docs)]
        out["encoder_alone_docs_per_s"] = {p: encoder_alone(args.model, sample, args.device, p, args.batch_size)
                                           for p in args.precisions}
        out["store_alone_rows_per_s"] = store_alone(args.model, texts, Path(tmp) / "store.db", 500)
        out["pipeline_without_encoder"] = child_json(
            "import json, bench.million as m; from pathlib import Path; print(json.dumps(m.run_ingest("
            f"{args.docs}, Path({str(args.model)!r}), {str(Path(tmp) / 'pre.db')!r}, 'pre', {args.workers}, "
            f"precomputed=True, corpus=Path({str(corpus)!r}), write_batch=500)))")
        cmd = [sys.executable, "-m", "dhim_ray.cli", "ingest", str(corpus), "--model", str(args.model),
               "--uri", str(Path(tmp) / "ingest.db"), "--collection", "ingest", "--workers", str(args.workers),
               "--batch-size", str(args.batch_size), "--json", *(["--use-gpu"] if args.device == "cuda" else [])]
        out["ingest"] = _timed_ingest(cmd, sample_gpu=args.device == "cuda")
    slower = min(out["encoder_alone_docs_per_s"]["fp32"], out["store_alone_rows_per_s"])
    out["ingest_over_slower"] = out["ingest"]["docs_per_second"] / slower
    out["pipeline_over_store"] = out["pipeline_without_encoder"]["docs_per_s"] / out["store_alone_rows_per_s"]
    check = texts[:500]
    cpu = Hasher.load(args.model, device="cpu", backend="torch").encode(check)
    here = Hasher.load(args.model, device=args.device, backend="torch").encode(check)
    out["bits_changed_vs_cpu"] = float(np.unpackbits(cpu ^ here).mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a checkpoint folder (dhim-ray train's --out)")
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--encoder-docs", type=int, default=20_000, help="documents the encoder alone is timed on")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=1, help="encoding actors (one a GPU)")
    ap.add_argument("--dry-run", action="store_true", help="on CPU, 2,000 documents, fp32, batch 64: every step, small")
    ap.add_argument("--scratch", default=None, help="where the corpus and files go (default: the system's temp)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "device_ingest.json"))
    args = ap.parse_args()
    if args.dry_run:
        args.docs, args.encoder_docs, args.device, args.precisions, args.batch_size = 2000, 500, "cpu", ["fp32"], 64
    result = run(args)
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
