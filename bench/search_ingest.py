"""Search and ingest speed.

    python -m bench.search_ingest --n-codes 100000 --bits 64 --ingest-docs 2000

Search: 100k synthetic packed codes, 1000 queries, top-100, exact: milvus-lite
(BIN_FLAT, HAMMING) vs dhim_ray.retrieval.metrics.hamming_topk (faiss, ties in database order) vs faiss
IndexBinaryFlat, same codes, same machine, same run; the numbers are q/s and ratios.
Ingest: Ray Data ingest of real dbpedia docs into milvus-lite (encoder actors +
single writer) vs the bare encoder forward pass over the same docs on the same cores.
The model's weights do not change speed, so a freshly initialised DHIM head is used.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA


def bench_search(n_codes: int, n_bits: int, n_queries: int, k: int) -> dict:
    import faiss

    from dhim_ray.connectors.milvus import CodeCollection, MilvusTarget, document_ids, make_rows, release
    from dhim_ray.retrieval.metrics import hamming_topk

    rng = np.random.default_rng(0)
    db = np.packbits(rng.integers(0, 2, (n_codes, n_bits)), axis=1)
    q = np.packbits(rng.integers(0, 2, (n_queries, n_bits)), axis=1)
    out = {"n_codes": n_codes, "bits": n_bits, "queries": n_queries, "k": k}
    t0 = time.perf_counter()
    idx_np, dist_np = hamming_topk(db, q, k)
    out["hamming_topk_qps"] = n_queries / (time.perf_counter() - t0)
    index = faiss.IndexBinaryFlat(n_bits)
    index.add(db)
    t0 = time.perf_counter()
    dist_f, _ = index.search(q, k)
    out["faiss_qps"] = n_queries / (time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        target = MilvusTarget(str(Path(tmp) / "b.db"), "bench")
        client = target.connect()
        CodeCollection(client, "bench").ensure(n_bits, "bench")
        ids = document_ids("bench:train", np.arange(n_codes))
        t0 = time.perf_counter()
        for s in range(0, n_codes, 10000):
            rows = make_rows(ids[s:s + 10000], db[s:s + 10000], n_bits, None, [""] * len(db[s:s + 10000]),
                             "bench:train", np.arange(s, s + len(db[s:s + 10000])))
            CodeCollection(client, "bench").upsert(rows)
        out["milvus_insert_rows_per_s"] = n_codes / (time.perf_counter() - t0)
        CodeCollection(client, "bench").search(q[:10], n_bits, k, output_fields=())  # warm-up
        t0 = time.perf_counter()
        hits = CodeCollection(client, "bench").search(q, n_bits, k, output_fields=())
        out["milvus_qps"] = n_queries / (time.perf_counter() - t0)
        client.close()
        release(target.uri)
    # Same distances from all three (exact search; tie order may differ).
    assert np.array_equal(np.sort(dist_np, 1), np.sort(dist_f.astype(np.int32), 1))
    assert np.array_equal(np.sort(dist_np, 1), np.sort(np.array([[h["distance"] for h in r] for r in hits]), 1))
    out["milvus_vs_hamming_topk"] = out["milvus_qps"] / out["hamming_topk_qps"]
    out["faiss_vs_hamming_topk"] = out["faiss_qps"] / out["hamming_topk_qps"]
    return out


def bench_ingest(n_docs: int, workers: int) -> dict:
    import torch

    from dhim_ray.config import config_for_bits
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.jobs.ingest import ingest
    from dhim_ray.model.checkpoint import save_checkpoint
    from dhim_ray.training.loop import build_model

    split = load_split(f"{DATA / 'dbpedia'}:train", limit=n_docs)
    enc = FrozenEncoder(config_for_bits(64).features)
    cfg = config_for_bits(64, model={"hidden_size": enc.hidden_size})
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_checkpoint(Path(tmp) / "m", build_model(cfg), cfg, enc.fingerprint)
        batch = enc.tokenizer(enc.prepare(split.texts), padding="max_length", truncation=True,
                              max_length=enc.config.n_tokens, return_tensors="pt")
        t0 = time.perf_counter()
        with torch.inference_mode():
            for s in range(0, n_docs, 64):
                enc.model(**{k: v[s:s + 64] for k, v in batch.items()})
        bare = n_docs / (time.perf_counter() - t0)
        del enc
        # Cold: this process starts Ray. Warm: Ray is already up, as on a cluster taking
        # `ray job submit`; encoder actors still start (and load the model) inside the timing.
        corpus = CorpusSpec(str(DATA / "dbpedia"), "train", limit=n_docs)
        cold = ingest(corpus, model_dir, MilvusTarget(str(Path(tmp) / "i.db"), "cold"), workers=workers,
                      progress=False)
        warm = ingest(corpus, model_dir, MilvusTarget(str(Path(tmp) / "i.db"), "warm"), workers=workers,
                      progress=False)
    return {"docs": n_docs, "workers": workers, "bare_encoder_docs_per_s": bare,
            "ingest_docs_per_s": cold.docs_per_second, "ratio": cold.docs_per_second / bare,
            "warm_ingest_docs_per_s": warm.docs_per_second, "warm_ratio": warm.docs_per_second / bare,
            "rows_verified": cold.rows_in_collection == n_docs and warm.rows_in_collection == n_docs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-codes", type=int, default=100_000)
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ingest-docs", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/search_ingest.json")
    args = ap.parse_args()
    result = {"search": bench_search(args.n_codes, args.bits, args.queries, args.k)}
    print(json.dumps(result), flush=True)
    if args.ingest_docs:
        result["ingest"] = bench_ingest(args.ingest_docs, args.workers)
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
