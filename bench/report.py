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
                      f"| ingest, Ray already running (as under `ray job submit`): actor start, clean, tokenise, "
                      f"encode, hash, upsert, verify | {i['warm_ingest_docs_per_s']:.1f} | {i['warm_ratio']:.2f} |",
                      f"| ingest, cold: the same plus starting Ray | {i['ingest_docs_per_s']:.1f} | {i['ratio']:.2f} |",
                      "", f"Rows verified: {i['rows_verified']}.", ""]
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
    parts += ["## Reading (2026-11-21 runs)", "",
              "- DHIM as shipped beats ITQ by 5 to 19 points of tie-aware P@100 on dbpedia and agnews at every "
              "code length, and float cosine kNN on the 384-float mean-pooled vectors too (dbpedia 64 bits: "
              "0.737 ± 0.007 over 3 seeds vs ITQ 0.575 and cosine 0.655). On r8 it leads ITQ by +1.1 (16 bits), "
              "+3.6, +5.7, +7.1 points and passes cosine kNN from 64 bits (0.847 vs 0.826).",
              "- 20ng is where it does not win yet: 0.457 / 0.513 / 0.550 / 0.569 at 16 / 32 / 64 / 128 bits vs "
              "ITQ 0.473 / 0.532 / 0.550 / 0.551 and cosine kNN 0.571 (one seed, 5 epochs of 64-word crops, best epochs at the cap). "
              "Its 20 classes and long, noisy posts want more steps than this session's CPU allowed; "
              "uncapped training, longer crops and the no-ITQ-init variant are the next things to measure there.",
              "- The lever that matters is the neighbour positives: each document's batch partner is one of its 10 "
              "nearest neighbours by cosine of the mean-pooled vector, and counts as a positive in both MI terms. "
              "Without it, dbpedia falls from 0.697 to 0.556 at 32 bits and from 0.728 to 0.601 at 64 (seed 0). "
              "At 16 bits the regulariser weight decides: beta 0.4 gave 0.56, 2.0 0.59, 5.0 0.69 on dbpedia "
              "(ITQ 0.59), hence beta 5 at 16 bits.",
              "- The [CLS] vs mean-pooled regulariser target makes no difference once neighbours are in "
              "(0.695 vs 0.697 at 32 bits, 0.729 vs 0.728 at 64).",
              "- The ITQ-initialised linear path did not earn its place: without it (CNN only, random init) "
              "dbpedia seed 0 scored 0.763 at 32 bits and 0.762 at 64, above all three seeds of the shipped "
              "configuration. It stays the default this round only because every table row was already run with "
              "it; turning it off is the next change to confirm on agnews/r8/20ng with seeds.",
              "- DHIM as published (the reference code's formulation and hyperparameters, 5 epochs) collapses on "
              "these corpora as the issue warned (dbpedia 0.12-0.27), except agnews at 16 bits (0.730).",
              "- Spread over seeds is 0.2-2 points; the margins over ITQ are 5 to 19 points, so they are not noise.",
              "- Ray Train, dbpedia 64 bits, 5 epochs, same global batch 512 (issue 3's configuration): 2 workers "
              "reached 0.372 vs 0.355 for 1 worker; epoch time 0.61x, wall 0.73x. No GPU was lent to these "
              "sessions: the `--use-gpu` path (NCCL) is untested on hardware.", ""]
    (HERE.parent / "BENCHMARKS.md").write_text("\n".join(parts))
    print("wrote BENCHMARKS.md")


if __name__ == "__main__":
    main()
