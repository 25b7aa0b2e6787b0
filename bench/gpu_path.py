"""The GPU path, and training memory at 100k documents.

    python -m bench.gpu_path encode --model M --data DIR    # docs/s: Hasher.encode, ingest's actor, sentence-transformers
    python -m bench.gpu_path train --data DIR               # epoch time: in-process CPU / GPU, Ray Train 1 GPU worker
    python -m bench.gpu_path memory --corpus GEN --data DIR # peak memory: features on disk vs in memory
    python -m bench.gpu_path ingest --model M --data DIR    # dhim-ray ingest --use-gpu end to end vs its actor alone
    python -m bench.gpu_path ingest --model M --server      # the same into the tests' Milvus server (a GPU machine)

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
import threading
import time
from pathlib import Path

from bench.harness import DATA
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec


def _device_names() -> dict:
    import platform

    import torch

    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu": platform.processor() or platform.machine(), "cpu_cores": os.cpu_count(),
            "torch": torch.__version__}


def _seconds(fn, device: str) -> float:
    """Seconds of one call, the GPU drained before and after it."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def _encode_calls(st, hasher, actor, texts: list[str], prepared: list[str], step: int) -> dict:
    """The timed calls of one (precision, batch size): each encodes every text once."""
    import numpy as np

    from dhim_ray.jobs.ingest import TokenIds

    batch = actor.batch_size
    tokeniser = TokenIds(actor.hasher.config.features)  # ingest's CPU stage, run here before the clock
    tokenised = [tokeniser({"text": np.array(texts[i : i + step], dtype=object)}) for i in range(0, len(texts), step)]
    return {
        "sentence_transformers": lambda: st.encode(texts, batch_size=batch),
        "sentence_transformers_cleaned_texts": lambda: st.encode(prepared, batch_size=batch),
        "hasher_encode": lambda: hasher.encode(texts, batch_size=batch),
        "ingest_actor": lambda: [actor({"text": np.array(texts[i : i + step], dtype=object)})
                                 for i in range(0, len(texts), step)],
        # the encoding actor of the GPU path, fed by TokenIds actors on other CPUs
        "ingest_actor_tokenised_apart": lambda: [actor(dict(b)) for b in tokenised],
    }


def encode(args) -> dict:
    """Docs/s on one GPU of ``Hasher.encode``, of ingest's encoding actor (``CodeEncoder``, fed
    Ray-sized batches as Ray Data feeds it: texts, or token ids from the ``TokenIds`` actors
    of the GPU path) and of ``SentenceTransformer.encode`` of the same
    encoder (same weights, same tokens: max_seq_length = the model's token limit), for each
    precision and batch size, rounds alternated; codes of fp16/bf16 against fp32 (bits changed)."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.ingest import SORTED_BATCHES, CodeEncoder

    device = args.device
    base = Hasher.load(args.model, device=device, backend="torch")
    features = base.config.features
    out = {"model": str(args.model), "n_bits": base.n_bits, "max_words": features.max_words,
           "n_tokens": features.n_tokens, "rounds": args.rounds, "corpora": {}}
    for name, limit in (("dbpedia", args.docs), ("20ng", args.docs // 2)):
        texts = load_split(CorpusSpec(str(Path(args.data) / name), "train", limit=limit)).texts
        prepared = base.encoder.prepare(texts)
        t0 = time.perf_counter()
        base.encoder.token_ids(texts)
        rows = {"documents": len(texts), "clean_and_tokenise_docs_per_s": len(texts) / (time.perf_counter() - t0),
                "runs": []}
        reference = None
        for precision in args.precisions:
            dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
            st = SentenceTransformer(base.encoder.source, device=device).to(dtype)  # rounded once, from fp32
            st.max_seq_length = features.n_tokens
            enc = FrozenEncoder(features, device=device, model=base.encoder.model, tokenizer=base.encoder.tokenizer,
                                reach=base.encoder.reach, precision=precision, backend="torch")
            hasher = Hasher.load(args.model, device=device, encoder=enc)
            for batch in args.batch_sizes:
                actor = CodeEncoder.__new__(CodeEncoder)  # what ingest's actor holds, with this precision
                actor.hasher, actor.vectors, actor.signs, actor.batch_size = hasher, False, False, batch
                calls = _encode_calls(st, hasher, actor, texts, prepared, batch * SORTED_BATCHES)
                for fn in calls.values():  # warm-up: kernels and the allocator for these shapes
                    fn()
                seconds = {key: float("inf") for key in calls}
                for _ in range(args.rounds):  # alternated, so drift hits every path alike
                    for key, fn in calls.items():
                        seconds[key] = min(seconds[key], _seconds(fn, device))
                run = {"precision": precision, "batch_size": batch,
                       **{f"{key}_docs_per_s": len(texts) / sec for key, sec in seconds.items()}}
                run["hasher_over_st"] = run["hasher_encode_docs_per_s"] / run["sentence_transformers_docs_per_s"]
                for key in ("ingest_actor", "ingest_actor_tokenised_apart"):
                    run[f"{key}_over_st"] = run[f"{key}_docs_per_s"] / run["sentence_transformers_docs_per_s"]
                codes = hasher.encode(texts, batch_size=batch)
                if reference is None:
                    reference = codes
                run["bits_changed_vs_fp32"] = float(np.unpackbits(codes ^ reference).mean())
                rows["runs"].append(run)
                print(name, json.dumps(run), flush=True)
        cpu = Hasher.load(args.model, device="cpu", backend="torch").encode(texts[:500])
        rows["bits_changed_gpu_fp32_vs_cpu"] = float(np.unpackbits(cpu ^ reference[:500]).mean())
        out["corpora"][name] = rows
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


def _gpu_busy(stop: threading.Event, samples: list[float]) -> None:
    """nvidia-smi's GPU utilisation (%), sampled every half second until ``stop``."""
    while not stop.wait(0.5):
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            samples.append(float(out.stdout.split()[0]))


def _repeated_corpus(data: Path, n_docs: int, out: Path) -> Path:
    """``n_docs`` documents: dbpedia's training texts, cycled, as Parquet parts of 100,000 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    split = load_split(CorpusSpec(str(data / "dbpedia"), "train"))
    (out / "train").mkdir(parents=True, exist_ok=True)
    for part, start in enumerate(range(0, n_docs, 100_000)):
        rows = [i % len(split.texts) for i in range(start, min(n_docs, start + 100_000))]
        pq.write_table(pa.table({"text": [split.texts[i] for i in rows], "label": [split.labels[i] for i in rows]}),
                       out / "train" / f"part-{part:05d}.parquet")
    return out


def _timed_ingest(cmd: list[str], sample_gpu: bool) -> dict:
    """One ``dhim-ray ingest ... --json`` in its own process: its summary, wall time and the
    GPU's mean utilisation through it."""
    stop, busy = threading.Event(), []
    sampler = threading.Thread(target=_gpu_busy, args=(stop, busy), daemon=True)
    if sample_gpu:
        sampler.start()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    stop.set()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    return {"wall_seconds": wall, "gpu_busy_mean_pct": sum(busy) / len(busy) if busy else None,
            **{k: result[k] for k in ("docs_per_second", "seconds", "n_documents", "rows_in_collection", "verified",
                                      "writers")}}


def ingest(args) -> dict:
    """``dhim-ray ingest --use-gpu --workers 1`` end to end on one GPU (Ray Data scans the Parquet
    parts, CPU actors tokenise, the GPU actor encodes, the rows are written and verified) into
    milvus-lite (the driver writes) or, with ``--server``, the tests' Milvus 2.3 server (write
    tasks), against ingest's encoding actor alone fed the same token ids in one process (what
    BENCHMARKS' encoding table calls 'fed token ids'), at each batch size without the text
    index, and on milvus-lite at the largest with it too. GPU utilisation is sampled through
    each ingest. Last, the same pipeline without the encoder: the ceiling of everything else."""
    import contextlib

    import numpy as np

    from bench.million import run_ingest
    from bench.store import tests_server
    from dhim_ray.jobs.ingest import SORTED_BATCHES, CodeEncoder, TokenIds

    device = args.device
    out = {"model": str(args.model), "docs": args.ingest_docs, "store": "server" if args.server else "milvus-lite",
           "runs": []}
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp, \
            (tests_server(Path(tmp) / "milvus") if args.server else contextlib.nullcontext()) as server:
        corpus = _repeated_corpus(Path(args.data), args.ingest_docs, Path(tmp) / "corpus")
        texts = load_split(CorpusSpec(str(Path(args.data) / "dbpedia"), "train")).texts
        for batch in args.batch_sizes:
            actor = CodeEncoder(str(args.model), device=device, batch_size=batch)
            step = batch * SORTED_BATCHES
            tokeniser = TokenIds(actor.hasher.config.features)
            fed = [tokeniser({"text": np.array(texts[i : i + step], dtype=object)}) for i in range(0, len(texts), step)]

            def alone(actor=actor, fed=fed):
                return [actor(dict(b)) for b in fed]

            best = min(_seconds(alone, device) for _ in range(1 + args.rounds))  # the first warms kernels up
            del actor, alone
            text_indexes = (False, True) if batch == max(args.batch_sizes) and not args.server else (False,)
            for text_index in text_indexes:
                cmd = [sys.executable, "-m", "dhim_ray.cli", "ingest", str(corpus), "--model", str(args.model),
                       "--uri", server or str(Path(tmp) / f"b{batch}-{int(text_index)}.db"),
                       "--collection", f"gpu_{batch}_{int(text_index)}", "--workers", "1", "--batch-size", str(batch),
                       "--text-index" if text_index else "--no-text-index", "--json"]
                if device == "cuda":
                    cmd.append("--use-gpu")
                run = {"batch_size": batch, "text_index": text_index, "actor_alone_docs_per_s": len(texts) / best,
                       **_timed_ingest(cmd, sample_gpu=device == "cuda")}
                run["ingest_over_actor"] = run["docs_per_second"] / run["actor_alone_docs_per_s"]
                out["runs"].append(run)
                print(json.dumps(run), flush=True)
        # The same pipeline with the encoder bypassed (bench.million's StoredCodes, 2,000 rows per
        # write): what scanning, Ray Data and the writes allow on this machine.
        out["without_encoder"] = run_ingest(args.ingest_docs, Path(args.model), server or str(Path(tmp) / "pre.db"),
                                            "pre", workers=1, text_index=False, precomputed=True, corpus=corpus)
        print(json.dumps(out["without_encoder"]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["encode", "train", "memory", "ingest"])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--corpus", default="dbpedia")
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--cpu-epochs", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="encode: a checkpoint folder (e.g. dhim-ray train dbpedia's)")
    ap.add_argument("--docs", type=int, default=4000, help="encode: dbpedia documents (20ng: half as many)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ingest-docs", type=int, default=200_000, help="ingest: documents (dbpedia's, cycled)")
    ap.add_argument("--server", action="store_true", help="ingest: into the tests' Milvus 2.3 server (loopback)")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16", "bf16"])
    ap.add_argument("--scratch", default=None, help="Where the memory runs write (default: the system's temp)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.server:  # the server listens on every interface
        from bench.store import ensure_own_network

        ensure_own_network("gpu_path")
    result = {"what": args.what, "device": _device_names(), **globals()[args.what](args)}
    print(json.dumps(result, indent=1))
    default = f"bench/gpu_{args.what}{'_server' if args.server else ''}.json"
    Path(args.out or default).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
