"""Assemble BENCHMARKS.md from the result files the bench scripts write.

    python -m bench.quality table ... && python -m bench.search_ingest && python -m bench.ray_train
    python -m bench.report
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parts = ["# Benchmarks", "",
             "Every figure below comes from a script in `bench/` that anyone can rerun; each section gives its "
             "command. Machine: 2 CPU cores (AVX2, no bf16), 24 GiB, no GPU; torch 2.13.0+cpu, ray 2.60, "
             "milvus-lite 2.5.1, encoder all-MiniLM-L6-v2 (packaged), corpora from ../shared/data "
             "(database = train.csv, queries = val.csv, P@100 by Hamming distance).", ""]
    q = HERE / "quality.md"
    if q.exists():
        parts += ["## Retrieval quality (issues 2 and 5)", "",
                  "Commands (results accumulate in `bench/quality.jsonl`; a rerun skips what is there):", "",
                  "```bash",
                  "python -m bench.quality table --corpora dbpedia agnews r8 20ng --max-epochs 8 --long-epochs 5 \\",
                  "    --one-seed-corpora r8 20ng --cache-dir .cache/features",
                  "python -m bench.quality ablation --corpora dbpedia --bits 32 --max-epochs 8 \\",
                  "    --levers 'no neighbour positives' 'no ITQ-initialised linear path' '[CLS] regulariser target'",
                  "```", "",
                  "Protocol: DHIM trains on 90% of train.csv and picks its epoch on the other 10% (never on val.csv); "
                  "database = all of train.csv, queries = val.csv. Epochs are capped (8 short corpora, 5 long, 5 for "
                  "the as-published runs) to fit a 2-core session: most best epochs sit near the cap, so these are "
                  "lower bounds for DHIM. 'as published' = `--formulation paper` (256 filters, [CLS] target, the "
                  "reference run's batch/lr/alpha, its quirks); it is run on the short corpora only (256 filters over "
                  "400 unmasked positions is ~40x the shipped cost).", "",
                  q.read_text()]
    si = HERE / "search_ingest.json"
    if si.exists():
        r = json.loads(si.read_text())
        s = r["search"]
        parts += ["## Search and ingest speed (issue 4)", "",
                  "Command: `python -m bench.search_ingest --n-codes 100000 --bits 64 --ingest-docs 4000`", "",
                  f"Search, {s['n_codes']:,} synthetic {s['bits']}-bit codes, {s['queries']} queries, top-{s['k']}, "
                  "exact (all three return the same distances; checked in the script):", "",
                  "| engine | queries/s | vs numpy |", "|---|---|---|",
                  f"| dhim_ray.metrics.hamming_topk (numpy popcount) | {s['numpy_qps']:.0f} | 1.00 |",
                  f"| faiss IndexBinaryFlat | {s['faiss_qps']:.0f} | {s['faiss_vs_numpy']:.2f} |",
                  f"| milvus-lite BIN_FLAT HAMMING | {s['milvus_qps']:.0f} | {s['milvus_vs_numpy']:.2f} |", "",
                  f"milvus-lite upsert: {s['milvus_insert_rows_per_s']:.0f} rows/s (10k-row batches).", ""]
        if "ingest" in r:
            i = r["ingest"]
            parts += [f"Ingest of {i['docs']} dbpedia docs with {i['workers']} encoder actors into milvus-lite, "
                      f"beside the bare encoder forward pass over the same docs (2 threads, same cores):", "",
                      "| | docs/s | vs bare encoder |", "|---|---|---|",
                      f"| bare encoder forward (pre-tokenised, batch 64) | {i['bare_encoder_docs_per_s']:.1f} | 1.00 |",
                      f"| ingest once rows flow (clean, tokenise, encode, hash, upsert) | "
                      f"{i['streaming_docs_per_s']:.1f} | {i['streaming_ratio']:.2f} |",
                      f"| ingest end to end (+ Ray start, actor start, first batch: {i['startup_seconds']:.1f} s; "
                      f"verify) | {i['ingest_docs_per_s']:.1f} | {i['ratio']:.2f} |", "",
                      f"Rows verified: {i['rows_verified']}. The goal (>= 0.8 of the bare encoder) holds for the "
                      "streaming rate, which a long ingest converges to; the fixed start-up is what the end-to-end "
                      "figure on a few thousand docs still pays.", ""]
    rt = HERE / "ray_train.json"
    if rt.exists():
        r = json.loads(rt.read_text())
        one, two, ratio = r["1"], r["2"], r["ratio_2_vs_1"]
        parts += ["## Ray Train: 1 vs 2 workers (issue 3)", "",
                  "Command: `python -m bench.ray_train --corpus dbpedia --bits 64 --epochs 5`", "",
                  "| workers | best val P@100 (tie-aware) | wall s | Ray start s | features s | mean epoch s |",
                  "|---|---|---|---|---|---|"]
        for w, x in (("1", one), ("2", two)):
            parts.append(f"| {w} | {x['best_val_precision_at_k_tie_aware']:.4f} | {x['wall_seconds']:.1f} | "
                         f"{x['ray_start_seconds']:.1f} | {x['feature_seconds']:.1f} | {x['mean_epoch_seconds']:.1f} |")
        parts += ["", f"2 vs 1 worker: val P@100 difference {ratio['val_precision_diff']:+.4f}; wall time ratio "
                      f"{ratio['wall_time']:.2f}; epoch time ratio {ratio['epoch_time']:.2f}.", ""]
    parts += ["## Reading (2026-11-21 run)", "",
              "- DHIM as shipped today uses the paper's reference hyperparameters (DBpedia row) with the reference "
              "code's accidents fixed (real beta, own [CLS] projection, padding masked, no sigmoid before softplus), "
              "capped at 5 epochs in this run. It beats every baseline on agnews at 16 bits and at 128 bits, where "
              "it also passes float cosine kNN (0.781 vs 0.725), but trails ITQ on dbpedia at every width and on "
              "agnews at 32/64 bits. Making it win everywhere is issue 5's work; this table is its baseline.",
              "- Ray Train, dbpedia 64 bits, 5 epochs, same global batch 512: 2 workers reached 0.372 vs 0.355 "
              "for 1 worker (+1.7 points; both still rising at epoch 5, so part of the gap is trajectory noise "
              "from different shuffles, not a systematic effect of all-gathered negatives). 2 workers cut the "
              "epoch time to 0.61x and the wall time to 0.73x. A 1-worker Ray epoch (39 s) is slower than the "
              "in-process loop (~20 s) because the worker gets one CPU and so one torch thread; Ray start-up is "
              "1-7 s, feature extraction by Ray Data 77-88 s, i.e. start-up and features dominate short runs.",
              "- No GPU was lent to this session: the `--use-gpu` path (NCCL) is untested on hardware.",
              "- ITQ is the strong baseline (0.57-0.70); PCA-sign gets worse as bits grow, as expected.",
              "- The two tie rules differ by < 0.01 except at 16 bits, where ties are many.",
              "- Training seconds in the quality table were measured while Ray integration tests ran on the same "
              "2 cores: read them as upper bounds (an uncontended dbpedia epoch at batch 512 takes ~20 s, "
              "conv-bound: ~90 GFLOP per 512-doc step).", ""]
    (HERE.parent / "BENCHMARKS.md").write_text("\n".join(parts))
    print("wrote BENCHMARKS.md")


if __name__ == "__main__":
    main()
