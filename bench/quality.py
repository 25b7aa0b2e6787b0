"""Quality and speed benchmark: DHIM vs classic hashing on the same frozen features.

    python -m bench.quality --corpora dbpedia agnews --bits 16 32 64 128 --max-epochs 5

Protocol (../shared/data/README.md): database = train.csv, queries = val.csv,
precision@100 by Hamming distance, both tie rules; cosine kNN on the float
mean-pooled features is the unhashed reference. Also: encode throughput of the
pipeline (clean + tokenise + encoder + hash) beside the bare encoder forward pass
on the same batch. Writes a markdown report (default BENCHMARKS.md section).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from dhim_ray.baselines import make_baseline
from dhim_ray.config import FeatureConfig, config_for_bits
from dhim_ray.data import load_corpus
from dhim_ray.encoder import FrozenEncoder
from dhim_ray.metrics import cosine_precision_at_k, precision_at_k
from dhim_ray.training import fit, hash_features

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def encode_throughput(encoder: FrozenEncoder, model, texts: list[str], batch: int = 64, reps: int = 2) -> dict:
    """docs/s of the full pipeline vs the bare encoder forward on the same pre-tokenised batch."""
    texts = texts[: batch * 4]
    enc = encoder.tokenizer(encoder.prepare(texts), padding="max_length", truncation=True,
                            max_length=encoder.config.n_tokens, return_tensors="pt")
    with torch.inference_mode():
        encoder.model(**{k: v[:batch] for k, v in enc.items()})  # warm-up
        t0 = time.perf_counter()
        for _ in range(reps):
            for s in range(0, len(texts), batch):
                encoder.model(**{k: v[s : s + batch] for k, v in enc.items()})
        bare = reps * len(texts) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(reps):
            for s in range(0, len(texts), batch):
                hash_features(model, encoder.encode_batch(texts[s : s + batch]))
        full = reps * len(texts) / (time.perf_counter() - t0)
    return {"bare_encoder_docs_per_s": round(bare, 1), "pipeline_docs_per_s": round(full, 1),
            "ratio": round(full / bare, 3)}


def run(corpora, bits_list, max_epochs, k, cache_dir, seed) -> list[dict]:
    rows = []
    for name in corpora:
        corpus = load_corpus(str(DATA / name))
        train, val = corpus.split("train"), corpus.split("val")
        encoder = FrozenEncoder(FeatureConfig(max_words=50))
        t0 = time.perf_counter()
        tr = encoder.features(train.texts, progress=True, cache_dir=cache_dir)
        va = encoder.features(val.texts, progress=True, cache_dir=cache_dir)
        feat_s = time.perf_counter() - t0
        cos = cosine_precision_at_k(tr.mean, train.labels, va.mean, val.labels, k)
        rows.append({"corpus": name, "bits": "float", "method": "cosine kNN (mean-pooled, 384 floats)",
                     "p": cos, "p_tie": cos, "seconds": 0.0})
        print(json.dumps(rows[-1]), flush=True)
        for bits in bits_list:
            for method in ("lsh", "pca-sign", "pca-median", "itq"):
                t0 = time.perf_counter()
                b = make_baseline(method, bits, seed).fit(tr.mean)
                r = precision_at_k(b.hash(tr.mean), train.labels, b.hash(va.mean), val.labels, k)
                rows.append({"corpus": name, "bits": bits, "method": method, "p": r.precision_at_k,
                             "p_tie": r.precision_at_k_tie_aware, "seconds": time.perf_counter() - t0})
                print(json.dumps(rows[-1]), flush=True)
            cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size},
                                  train={"max_epochs": max_epochs, "seed": seed})
            res = fit(tr, va, cfg, train.labels, val.labels, progress=True)
            r = precision_at_k(hash_features(res.model, tr), train.labels, hash_features(res.model, va),
                               val.labels, k)
            rows.append({"corpus": name, "bits": bits, "method": f"dhim (shipped defaults, <= {max_epochs} epochs)",
                         "p": r.precision_at_k, "p_tie": r.precision_at_k_tie_aware, "seconds": res.seconds,
                         "best_epoch": res.best_epoch,
                         "epoch_seconds": float(np.mean([h["seconds"] for h in res.history]))})
            print(json.dumps(rows[-1]), flush=True)
            if bits == bits_list[-1]:
                tp = encode_throughput(encoder, res.model, val.texts)
                rows.append({"corpus": name, "bits": bits, "method": "throughput", **tp,
                             "feature_seconds": round(feat_s, 1)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def to_markdown(rows, command) -> str:
    lines = [f"Command: `{command}`", "",
             f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
             f"torch {torch.__version__}.", "",
             "| corpus | bits | method | P@100 (db order) | P@100 (tie-aware) | fit/train s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] == "throughput":
            continue
        lines.append(f"| {r['corpus']} | {r['bits']} | {r['method']} | {r['p']:.4f} | {r['p_tie']:.4f} | "
                     f"{r['seconds']:.1f} |")
    lines += ["", "Encode throughput (docs/s, batch 64, 50 words):", "",
              "| corpus | bare encoder forward | full pipeline (clean + tokenise + encoder + hash) | ratio |",
              "|---|---|---|---|"]
    for r in rows:
        if r["method"] == "throughput":
            lines.append(f"| {r['corpus']} | {r['bare_encoder_docs_per_s']} | {r['pipeline_docs_per_s']} | "
                         f"{r['ratio']} |")
    epochs = [r for r in rows if "epoch_seconds" in r]
    if epochs:
        lines += ["", "DHIM seconds per epoch (cached features, incl. validation): " + ", ".join(
            f"{r['corpus']}/{r['bits']}b {r['epoch_seconds']:.1f}" for r in epochs)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpora", nargs="+", default=["dbpedia", "agnews"])
    ap.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64, 128])
    ap.add_argument("--max-epochs", type=int, default=5)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=".cache/features")
    ap.add_argument("--out", default="bench/quality.md")
    args = ap.parse_args()
    command = "python -m bench.quality " + " ".join(
        [f"--corpora {' '.join(args.corpora)}", f"--bits {' '.join(map(str, args.bits))}",
         f"--max-epochs {args.max_epochs}"])
    rows = run(args.corpora, args.bits, args.max_epochs, args.k, args.cache_dir, args.seed)
    Path(args.out).write_text(to_markdown(rows, command))
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
