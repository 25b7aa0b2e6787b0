"""The hot path against the library a user would otherwise call: ``Hasher.encode`` (clean,
tokenise, frozen encoder, DHIM head, pack) against ``SentenceTransformer.encode`` of the same
encoder (the packaged all-MiniLM-L6-v2), on the same texts, with the same token budget and
threads, in one process, alternated round by round, on the torch backend (the ONNX Runtime
and int8 paths: bench.onnx_speed). The old path (every document padded to
max_words in input order) runs beside them, and so does bf16 autocast with its share of
flipped bits.

    OMP_NUM_THREADS=2 python -m bench.encode_speed            # writes bench/encode_speed.json

Short documents: dbpedia val (50 words); long: 20ng val (400 words). Then one query at a
time: p50/p99 latency over single-text calls of each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.harness import DATA, device_name, read_texts, write_result
from dhim_ray import Hasher
from dhim_ray.codes import unpack_codes
from dhim_ray.config import DHIMConfig, FeatureConfig, ModelConfig
from dhim_ray.encoding.encoder import FrozenEncoder, resolve_encoder
from dhim_ray.model.dhim import DHIM


def hasher_for(max_words: int, device: str, reach: int | None, precision: str = "fp32",
               encoder: FrozenEncoder | None = None, backend: str = "torch") -> Hasher:
    feats = FeatureConfig(max_words=max_words, backend=backend, precision=precision)
    enc = FrozenEncoder(feats, device=device, reach=reach, precision=precision,
                        model=encoder.model if encoder else None, tokenizer=encoder.tokenizer if encoder else None)
    torch.manual_seed(0)
    model = DHIM(ModelConfig(n_bits=64, hidden_size=enc.hidden_size)).to(device)
    return Hasher(model, DHIMConfig(features=feats, model=model.config), enc)


def text_sets(short: int, long_: int) -> list[tuple[str, list[str], int]]:
    """(name, texts, words kept) of the two document lengths the encode benches time: ``short``
    dbpedia val documents at 50 words, ``long_`` 20ng val documents at 400."""
    return [("dbpedia val", read_texts(DATA / "dbpedia" / "val.csv", short), 50),
            ("20ng val", read_texts(DATA / "20ng" / "val.csv", long_), 400)]


def timed(fn, texts) -> float:
    t0 = time.perf_counter()
    fn(texts)
    return time.perf_counter() - t0


def throughput(name: str, texts: list[str], max_words: int, rounds: int, batch_size: int, device: str) -> dict:
    from sentence_transformers import SentenceTransformer

    fast = hasher_for(max_words, device, reach=2)
    padded = hasher_for(max_words, device, reach=None, encoder=fast.encoder)
    st = SentenceTransformer(resolve_encoder("all-MiniLM-L6-v2"), device=device)
    st.max_seq_length = fast.config.features.n_tokens  # the same token budget
    methods = {
        "hasher": lambda t: fast.encode(t, batch_size=batch_size),
        "hasher_padded": lambda t: padded.encode(t, batch_size=batch_size),
        "sentence_transformers": lambda t: st.encode(t, batch_size=batch_size, convert_to_numpy=True),
    }
    for fn in methods.values():  # warm-up
        fn(texts[:batch_size])
    seconds = {m: [] for m in methods}
    for r in range(rounds):  # alternated, the order rotated each round
        order = list(methods)[r % len(methods):] + list(methods)[: r % len(methods)]
        for m in order:
            seconds[m].append(timed(methods[m], texts))
    docs_s = {m: len(texts) / float(np.median(s)) for m, s in seconds.items()}
    # codes: fast path vs padded path, and bf16 autocast vs fp32
    same = fast.encode(texts, batch_size=batch_size)
    old = padded.encode(texts, batch_size=batch_size)
    bf16 = hasher_for(max_words, device, reach=2, precision="bf16", encoder=fast.encoder)
    bits = same.shape[1] * 8
    row = {
        "corpus": name, "documents": len(texts), "max_words": max_words, "batch_size": batch_size,
        "docs_per_s": {m: round(v, 1) for m, v in docs_s.items()},
        "ratio_vs_sentence_transformers": round(docs_s["hasher"] / docs_s["sentence_transformers"], 3),
        "ratio_vs_padded": round(docs_s["hasher"] / docs_s["hasher_padded"], 3),
        "bits_differing_vs_padded": float((unpack_codes(same, bits) != unpack_codes(old, bits)).mean()),
        "bits_differing_bf16": float((unpack_codes(same, bits) != unpack_codes(bf16.encode(texts), bits)).mean()),
    }
    print(row, flush=True)
    return row


def latency(texts: list[str], n: int, device: str) -> dict:
    """One text per call, alternated call by call: p50/p99 in ms."""
    from sentence_transformers import SentenceTransformer

    fast = hasher_for(50, device, reach=2)
    st = SentenceTransformer(resolve_encoder("all-MiniLM-L6-v2"), device=device)
    st.max_seq_length = fast.config.features.n_tokens
    calls = {"hasher": lambda t: fast.encode([t]), "sentence_transformers": lambda t: st.encode([t])}
    ms = {m: [] for m in calls}
    for i in range(n + 20):
        for m in (list(calls) if i % 2 else list(calls)[::-1]):
            t0 = time.perf_counter()
            calls[m](texts[i % len(texts)])
            if i >= 20:  # the first calls warm up
                ms[m].append((time.perf_counter() - t0) * 1e3)
    row = {m: {"p50_ms": round(float(np.percentile(v, 50)), 2), "p99_ms": round(float(np.percentile(v, 99)), 2)}
           for m, v in ms.items()}
    row["p50_ratio"] = round(row["hasher"]["p50_ms"] / row["sentence_transformers"]["p50_ms"], 3)
    row["calls"] = n
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=1000, help="dbpedia val documents")
    ap.add_argument("--long", type=int, default=300, help="20ng val documents")
    ap.add_argument("--queries", type=int, default=1000, help="single-text calls for the latency")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    rows = [throughput(name, texts, words, args.rounds, args.batch_size, args.device)
            for name, texts, words in text_sets(args.short, args.long)]
    queries = read_texts(DATA / "agnews" / "val.csv", 200)
    result = {"device": device_name(args.device), "threads": torch.get_num_threads(), "throughput": rows,
              "query_latency": latency(queries, args.queries, args.device)}
    write_result("encode_speed", result)


if __name__ == "__main__":
    main()
