"""Refresh the generated tables of BENCHMARKS.md from the result files the benches write.

BENCHMARKS.md is written by hand: what each bench measures, its command and what its
figures mean. Each table in it stands between ``<!-- table: NAME -->`` and
``<!-- /table -->``; this script rewrites those blocks, and only those, from bench/*.json
(a table whose results are missing is left as it is).

    python -m bench.report            # rewrite the tables
    python -m bench.report --check    # exit 1 when a table is out of date (BENCHMARKS.md, README.md)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from dhim_ray.config import defaults_for_bits

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "BENCHMARKS.md"
#: Every file with generated tables: BENCHMARKS.md, and the README's results.
DOCS = (DOC, HERE.parent / "README.md", HERE.parent / "docs" / "experiments.md")
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def gib(x: float) -> str:
    return f"{x:.2f} GiB"


def seconds(x: float | None) -> str:
    """Seconds to two decimals; blank for a figure a run did not record."""
    return "" if x is None else f"{x:.2f}"


def _table(header: list[str], rows) -> list[str]:
    """A markdown table: a header row, its rule, one line per row of cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _json(name: str):
    path = HERE / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def has_shipped_identity(row: dict, bits: int) -> bool:
    """A DHIM row trained with the identity bits shipped at its width (rows from before they
    shipped have none recorded: 0)."""
    return row.get("identity_bits", 0) == defaults_for_bits(bits)["identity_bits"]


def headline() -> list[str] | None:
    """DHIM at 16 and 64 bits against what a user of the same encoder would pick instead."""
    found = _json("headline")
    if found is None:
        return None
    ref = {(r["corpus"], r["method"]): r for r in found}
    rows = [json.loads(line) for line in (HERE / "quality.jsonl").read_text().splitlines() if line.strip()]

    def dhim(corpus: str, bits: int) -> str:
        got = [r["p_tie"] for r in rows if r["corpus"] == corpus and r["bits"] == bits
               and r["method"] == "dhim shipped" and r.get("shipped_schedule", r.get("max_epochs") == 100)
               and has_shipped_identity(r, bits)]
        return f"{sum(got) / len(got):.3f}" if got else ""

    def itq(corpus: str) -> str:
        got = [r["p_tie"] for r in rows if r["corpus"] == corpus and r["bits"] == 64 and r["method"] == "itq"]
        return f"{got[-1]:.3f}" if got else ""

    out = ["| corpus | DHIM 16 bits (2 B) | DHIM 64 bits (8 B) | ITQ 64 bits (8 B) | ubinary 384 bits (48 B) "
           "| float cosine kNN (1,536 B) |", "|---|---|---|---|---|---|"]
    for corpus in ("dbpedia", "agnews", "r8", "20ng"):
        u, c = ref.get((corpus, "ubinary")), ref.get((corpus, "cosine"))
        out.append(f"| {corpus} | {dhim(corpus, 16)} | {dhim(corpus, 64)} | {itq(corpus)} | "
                   f"{u['p_tie']:.3f} | {c['p_tie']:.3f} |" if u and c else f"| {corpus} | | | | | |")
    return out


def encode_speed() -> list[str] | None:
    r = _json("encode_speed")
    if r is None:
        return None
    out = ["| documents | words kept | Hasher.encode docs/s | old padded path docs/s | "
           "SentenceTransformer.encode docs/s | vs sentence-transformers | vs padded | bits changed vs padded "
           "| bits changed by bf16 |", "|---|---|---|---|---|---|---|---|---|"]
    for x in r["throughput"]:
        d = x["docs_per_s"]
        out.append(f"| {x['corpus']} ({x['documents']}) | {x['max_words']} | {d['hasher']:.1f} | "
                   f"{d['hasher_padded']:.1f} | {d['sentence_transformers']:.1f} | "
                   f"{x['ratio_vs_sentence_transformers']:.2f} | {x['ratio_vs_padded']:.2f} | "
                   f"{100 * x['bits_differing_vs_padded']:.3f}% | {100 * x['bits_differing_bf16']:.3f}% |")
    q = r["query_latency"]
    out += ["", "| one query at a time | p50 ms | p99 ms |", "|---|---|---|",
            f"| `Hasher.encode` | {q['hasher']['p50_ms']:.1f} | {q['hasher']['p99_ms']:.1f} |",
            f"| `SentenceTransformer.encode` | {q['sentence_transformers']['p50_ms']:.1f} | "
            f"{q['sentence_transformers']['p99_ms']:.1f} |",
            f"| ratio | {q['p50_ratio']:.2f} | |"]
    return out


def onnx_speed() -> list[str] | None:
    r = _json("onnx_speed")
    if r is None:
        return None
    names = [("hasher_torch", "`Hasher.encode`, torch"), ("hasher_onnx", "`Hasher.encode`, ONNX Runtime fp32 (default)"),
             ("hasher_onnx_int8", "`Hasher.encode`, ONNX Runtime int8 (`features.precision=int8`)"),
             ("st_torch", "sentence-transformers, torch backend"), ("st_onnx", "sentence-transformers, ONNX backend"),
             ("st_onnx_int8", "sentence-transformers, ONNX int8 (avx512_vnni)")]
    short, long_ = r["throughput"]
    changed = {"hasher_torch": "0 (the reference)", "hasher_onnx": short["code_bits_changed_vs_torch"]["onnx"],
               "hasher_onnx_int8": short["code_bits_changed_vs_torch"]["int8"],
               "st_torch": "0 (the reference)", "st_onnx": short["st_sign_bits_changed_vs_torch"]["st_onnx"],
               "st_onnx_int8": short["st_sign_bits_changed_vs_torch"]["st_onnx_int8"]}

    def pct(v) -> str:
        return v if isinstance(v, str) else f"{100 * v:.2f}%"

    rows = [[label, f"{short['docs_per_s'][k]:.1f}", f"{long_['docs_per_s'][k]:.1f}", pct(changed[k])]
            for k, label in names]
    rows.append(["ours / theirs, fp32", f"{short['onnx_vs_st_onnx']:.2f}", f"{long_['onnx_vs_st_onnx']:.2f}", ""])
    rows.append(["ours / theirs, int8", f"{short['int8_vs_st_int8']:.2f}", f"{long_['int8_vs_st_int8']:.2f}", ""])
    return _table([f"backend ({r['threads']} threads)", f"{short['corpus']} ({short['documents']}) docs/s",
                   f"{long_['corpus']} ({long_['documents']}) docs/s",
                   "bits changed vs torch (codes; theirs: sign bits)"], rows)




def ingest_speed() -> list[str] | None:
    i, m = _json("ingest_speed"), _json("million") or {}
    if i is None:
        return None
    out = ["| path | docs/s | vs `Hasher.encode` |", "|---|---|---|",
           f"| `Hasher.encode`, the same documents and cores | {i['hasher_encode_docs_per_s']:.1f} | 1.00 |",
           f"| ingest end to end ({i['docs']:,} documents: scan, encode, write, verify; rows verified: "
           f"{i['verified']}) | {i['ingest_docs_per_s']:.1f} | {i['ratio']:.2f} |"]
    if "ingest_tiny_1000000" in m:
        out.append(f"| ingest of 1,000,000 documents with a 2-layer 32-wide encoder (the pipeline's own ceiling) | "
                   f"{m['ingest_tiny_1000000']['docs_per_s']:.0f} | |")
    return out


def ingest_rerun() -> list[str] | None:
    i = _json("ingest_speed")
    if i is None or "rerun_after_90" not in i:
        return None
    first = i["ingest_seconds"]
    rows = [["the first ingest, into a new collection", f"{i['docs']:,}", "0", f"{first:.1f}", "1.00"]]
    for key, what in (("rerun_after_90", "a rerun after an ingest that died at 90% (its last tenth deleted)"),
                      ("rerun_complete", "a rerun with every row stored")):
        x = i[key]
        rows.append([what, f"{x['rows_written']:,}", f"{x['rows_unchanged']:,}", f"{x['seconds']:.1f}",
                     f"{x['seconds'] / first:.2f}"])
    return _table(["run", "rows encoded and written", "rows passed over", "s", "vs the first"], rows)


def startup() -> list[str] | None:
    r = _json("startup")
    if r is None:
        return None
    lib, search = r["library"], r["search"]
    rows = [["`Hasher.load` and one `encode`, a fresh process", "the torch encoder loaded only when asked",
             f"{lib['shipped']:.2f}", "the torch encoder always loaded", f"{lib['eager']:.2f}", f"{lib['ratio']:.2f}x"],
            ["`dhim-ray search` on a milvus-lite collection, end to end", "the query hashed by the model's graph, "
             "no torch imported", f"{search['shipped']:.2f}", "the query hashed by the torch `Hasher`",
             f"{search['torch']:.2f}", f"{search['ratio']:.2f}x"]]
    return _table(["start-up", "shipped", "s", "before", "s", "speed-up"], rows) + \
        ["", f"{r['device']}, Python {r['python']}, best of {r['repeats']}."]


def new_collection() -> list[str] | None:
    r = _json("startup")
    if r is None or "ingest" not in r:
        return None
    b = r["ingest"]
    return _table(["run", "s, indexes created, not waited on", "s, as pymilvus' create_collection waits", "speed-up"],
                  [["`dhim-ray ingest` of 100 BBC documents into a new milvus-lite file, end to end",
                    f"{b['shipped']:.2f}", f"{b['waited']:.2f}", f"{b['ratio']:.2f}x"]]) + \
        ["", f"{r['device']}, Python {r['python']}, best of {r['repeats']}."]


def ray_start() -> list[str] | None:
    r = _json("ray_start")
    if r is None:
        return None
    rows = [[label, f"{r[key]['children_killed']} of {r['children']}", f"{r[key]['over_20_s']} of {r['starts']}",
             f"{r[key]['median_s']:.1f}", f"{r[key]['mean_s']:.1f}", f"{r[key]['max_s']:.1f}"]
            for key, label in (("fork_support_on", "on (grpcio's default, as before)"),
                               ("fork_support_off", "off (set when dhim_ray is imported)"))]
    return _table(["grpcio fork support", "children dead before exec", "Ray starts over 20 s", "median start s",
                   "mean start s", "slowest start s"], rows) + [
        "", f"mean start, before / now: {r['mean_ratio']:.2f}x; {r['device']}."]


def eval_methods() -> list[str] | None:
    e = _json("eval_methods")
    if e is None:
        return None
    methods = ", ".join(e["methods"])
    return _table(["run", "seconds", "vs one at a time"], [
        [f"`dhim-ray eval` of {methods} in one run (the corpus encoded once)", seconds(e["together_s"]),
         f"{e['ratio']:.2f}x"],
        [f"the same {len(e['methods'])} methods one at a time (each encodes it)", seconds(e["apart_s"]), "1.00x"],
    ]) + ["", f"Figures the same both ways: {e['same_figures']}; {e['device']}, best of {e['repeats']}."]


def service() -> list[str] | None:
    r = _json("serve_load")
    if r is None:
        return None
    ip = r["in_process"]
    out = ["| in process, one query at a time | p50 ms | p99 ms |", "|---|---|---|",
           f"| `Searcher.run` ({ip['searcher_search']['queries_per_s']:.0f} q/s) | "
           f"{ip['searcher_search']['p50_ms']:.1f} | {ip['searcher_search']['p99_ms']:.1f} |",
           f"| of which hashing | {ip['hash']['p50_ms']:.1f} | |",
           f"| of which Milvus | {ip['milvus']['p50_ms']:.1f} | |",
           f"| `dhim-ray search` as a command (process start and model load) | {r['cli_search']['p50_ms']:.0f} | |",
           "", "| encoder batching | clients | queries/s | p50 ms | p99 ms | requests per encoder pass |",
           "|---|---|---|---|---|---|"]
    for x in r["http"]:
        out.append(f"| {'on (32)' if x['max_batch_size'] > 1 else 'off'} | {x['clients']} | {x['queries_per_s']:.1f} | "
                   f"{x['p50_ms']:.1f} | {x['p99_ms']:.1f} | {x['requests_per_encoder_pass']:.2f} |")
    return out


def service_mixed() -> list[str] | None:
    m = (_json("serve_load") or {}).get("mixed")
    if m is None:
        return None
    a, b = m["honest_alone"], m["honest_beside_8_hostile"]
    return ["| 8 honest clients, one-text searches | queries/s | p50 ms | p99 ms |", "|---|---|---|---|",
            f"| alone | {a['queries_per_s']:.1f} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} |",
            f"| beside 8 hostile clients (the largest request, in a loop) | {b['queries_per_s']:.1f} | "
            f"{b['p50_ms']:.1f} | {b['p99_ms']:.1f} |",
            f"| loaded over alone | | {m['p50_loaded_over_alone']:.2f}x | {m['p99_loaded_over_alone']:.2f}x |",
            "", f"Hostile requests answered meanwhile: {m['hostile_answered']}; 5xx: {m['hostile_5xx']}."]


def quality() -> list[str] | None:
    path = HERE / "quality.md"
    return path.read_text().rstrip("\n").split("\n") if path.exists() else None



def _million_runs(prefix: str, key: str) -> tuple[dict, list[dict]]:
    """bench/million.json, and its runs whose names start with ``prefix`` sorted by ``key``."""
    r = _json("million") or {}
    return r, sorted((r[k] for k in r if k.startswith(prefix)), key=lambda x: x[key])


def million_search() -> list[str] | None:
    r, searches = _million_runs("search_", "bits")
    if not searches:
        return None
    out = _table(["bits", "faiss q/s", "hamming_topk q/s", "ratio", "same distances", "same neighbours (ties sorted)",
                  "= brute force (50 queries)"],
                 ([str(x["bits"]), f"{x['faiss_qps']:.0f}", f"{x['hamming_topk_qps']:.0f}", f"{x['ratio']:.2f}",
                   str(x["same_distances"]), str(x["same_neighbours_as_faiss_tie_sorted"]),
                   str(x["equal_to_brute_force_50_queries"])] for x in searches))
    if "eval_10k_x_1m" in r:
        e = r["eval_10k_x_1m"]
        out += ["", *_table(["eval: queries x codes", "seconds", "peak RSS before", "peak RSS during", "inputs"],
                            [[f"{e['queries']:,} x {e['n_codes']:,} ({e['bits']} bits, tie-aware P@{e['k']})",
                              f"{e['seconds']:.1f}", gib(e["peak_rss_before_gib"]), gib(e["peak_rss_after_gib"]),
                              gib(e["inputs_gib"])]])]
    return out


def million_columns() -> list[str] | None:
    r = _json("million")
    keys = sorted((k for k in r or {} if k.startswith("columns_")), key=lambda k: int(k.split("_")[1]))
    if not keys:
        return None
    out = ["| documents | rows sent | docs/s | seconds | rows verified |", "|---|---|---|---|---|"]
    for key in keys:
        x = r[key]
        for mode, label in (("by_row", "by row (pymilvus' row dicts)"), ("by_column", "by column (the connector)")):
            y = x[mode]
            out.append(f"| {x['docs']:,} | {label} | {y['docs_per_s']:,.0f} | {y['seconds']:.1f} | "
                       f"{y['rows_in_collection']:,} |")
        out.append(f"| | by column over by row | {x['column_over_row']:.2f}x | | |")
    return out


def million_ingest() -> list[str] | None:
    r, ingests = _million_runs("ingest_tiny_", "docs")
    if not ingests:
        return None
    out = ["| documents | docs/s | seconds | rows counted | distinct ids | driver peak | driver peak, own | worker peak |",
           "|---|---|---|---|---|---|---|---|"]
    for x in ingests:
        own = gib(x["driver_own_peak_gib"]) if "driver_own_peak_gib" in x else "-"
        out.append(f"| {x['docs']:,} | {x['docs_per_s']:.0f} | {x['seconds']:.0f} | {x['count']:,} | "
                   f"{x['distinct_ids']:,} | {gib(x['driver_peak_gib'])} | {own} | {gib(x['worker_peak_gib'])} |")
    out += ["", "| interrupted, then rerun | documents | Ctrl-C after s | rows left | rerun verified | rows after | "
            "distinct ids | rerun docs/s | rows the rerun left alone | rerun driver peak | rerun worker peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in r if k.startswith("interrupt_rerun_") and "_codes_" not in k):
        x, rerun = r[key], r[key]["rerun"] or {}
        left = f"{x['rows_after_interrupt']['count']:,}" + (" (finished first)" if x["first_completed"] else "")
        alone = f"{rerun['rows_unchanged']:,}" if "rows_unchanged" in rerun else "none (upserted all)"
        out.append(f"| into milvus-lite | {int(key.rsplit('_', 1)[1]):,} | {x['interrupted_after_s']:.0f} | {left} | "
                   f"{bool(rerun) and rerun['verified']} | {x['final']['count']:,} | {x['final']['distinct_ids']:,} | "
                   f"{rerun.get('docs_per_s', 0):.0f} | {alone} | {gib(rerun.get('driver_peak_gib', 0))} | "
                   f"{gib(rerun.get('worker_peak_gib', 0))} |")
    return out



def million_hybrid() -> list[str] | None:
    """1M generated documents with and without the text index: ingest, file size, query latency."""
    r, runs = _million_runs("hybrid_", "docs")
    if not runs:
        return None
    out = ["| documents | text index | ingest docs/s | file B/doc | search | p50 ms | p99 ms |",
           "|---|---|---|---|---|---|---|"]
    for x in runs:
        for key, label, mode in (("codes_only", "no", "codes"), ("with_text_index", "yes", "hybrid")):
            run = x[key]
            out.append(f"| {x['docs']:,} | {label} | {run['docs_per_s']:.0f} | {run['bytes_per_doc']:,.0f} | {mode} | "
                       f"{x[f'{mode}_p50_ms']:.1f} | {x[f'{mode}_p99_ms']:.1f} |")
    return out


def store() -> list[str] | None:
    """The store alone at 1M-10M+ generated 64-bit codes: milvus-lite against faiss in one process."""
    r = _json("store") or {}
    runs = sorted((v for k, v in r.items() if k.startswith("lite_vs_faiss_")), key=lambda v: v["n_codes"])
    if not runs:
        return None
    rows = []
    for x in runs:
        f, lite = x["faiss_flat"], x["milvus_lite"]
        for name, s, load, mem, disk in (
                ("faiss IndexBinaryFlat", f, f"{f['load_s']:.1f}", "8", "-"),
                ("milvus-lite BIN_FLAT", lite, f"{lite['load_s']:.0f}", f"{lite['server_rss_bytes_per_code']:.0f}"
                 if (lite.get("server_rss_bytes_per_code") or 0) > 0 else "not measured",
                 f"{lite['disk_bytes_per_code']:.0f}")):
            rows.append([f"{x['n_codes']:,}", name, load, mem, disk,
                         *(f"{s[f'top{k}_{c}c']['p50_ms']:.1f} / {s[f'top{k}_{c}c']['p99_ms']:.1f}"
                           for k in (10, 100) for c in (1, 8)),
                         f"{s['top10_8c']['qps']:.0f}", "1.000" if s is f else f"{lite['recall_at_100']:.3f}"])
    out = _table(["codes", "store", "load s", "memory B/code", "disk B/code", "top-10 p50/p99 ms, 1 client",
                  "8 clients", "top-100 1 client", "8 clients", "top-10 q/s (8 clients)", "recall@100"], rows)
    ivf = ["", *_table(["codes", "faiss IVF", "build s", *(f"nprobe {p}: recall@100 / p50 ms" for p in (8, 32, 128))],
                       ([f"{x['n_codes']:,}", f"nlist {n}", f"{x[f'faiss_ivf{n}']['build_s']:.0f}",
                         *(f"{x[f'faiss_ivf{n}'][f'nprobe{p}']['recall_at_100']:.3f} / "
                           f"{x[f'faiss_ivf{n}'][f'nprobe{p}']['p50_ms']:.2f}" for p in (8, 32, 128))]
                        for x in runs for n in (1024, 4096)))]
    return out + ivf


def store_server() -> list[str] | None:
    """The tests' Milvus 2.3 server at 1M-10M generated 64-bit codes: BIN_FLAT, BIN_IVF_FLAT swept."""
    r = _json("store") or {}
    runs = sorted((v for k, v in r.items() if k.startswith("server_vs_faiss_")), key=lambda v: v["n_codes"])
    if not runs:
        return None

    def lat(x: dict) -> str:
        return f"{x['p50_ms']:.1f} / {x['p99_ms']:.1f}"

    flat = _table(["codes", "BIN_FLAT load s", "memory B/code", "top-10 p50/p99 ms, 1 client", "8 clients",
                   "top-100 1 client", "8 clients", "q/s (8 clients)", "recall@100", "radius complete",
                   "faiss flat top-10 p50 ms", "ratio"],
                  ([f"{x['n_codes']:,}", f"{f['build_and_load_s']:.0f}", f"{f['server_rss_bytes_per_code']:.0f}",
                    lat(f["top10_1c"]), lat(f["top10_8c"]), lat(f["top100_1c"]), lat(f["top100_8c"]),
                    f"{f['top100_8c']['qps']:.0f}", f"{f['recall_at_100']:.3f}", f"{f['radius_completeness']:.3f}",
                    f"{x['faiss_flat_top10_1c']['p50_ms']:.1f}",
                    f"{f['top10_1c']['p50_ms'] / x['faiss_flat_top10_1c']['p50_ms']:.1f}x"]
                   for x in runs for f in [x["bin_flat"]]))
    probes = sorted({int(k[len("nprobe"):]) for x in runs for key, e in x.items() if key.startswith("bin_ivf_flat")
                     for k in e if k.startswith("nprobe")})
    ivf = _table(["codes", "BIN_IVF_FLAT", "build and load s",
                  *(f"nprobe {p}: recall@100 / p50 ms / q/s (8 clients)" for p in probes),
                  "radius complete (nprobe = nlist)"],
                 ([f"{x['n_codes']:,}", f"nlist {key[len('bin_ivf_flat'):]}", f"{e['build_and_load_s']:.0f}",
                   *(f"{e[f'nprobe{p}']['recall_at_100']:.3f} / {e[f'nprobe{p}']['p50_ms']:.1f} / "
                     f"{e[f'nprobe{p}']['top100_8c']['qps']:.0f}" if f"nprobe{p}" in e else "-" for p in probes),
                   f"{e['radius_completeness_nprobe_nlist']:.3f}"]
                  for x in runs for key, e in sorted(((k, v) for k, v in x.items() if k.startswith("bin_ivf_flat")),
                                                     key=lambda kv: int(kv[0][len("bin_ivf_flat"):]))))
    def growth(x: dict) -> str:
        steps = x.get("insert_rows_per_s_as_it_grows") or {}
        return ", ".join(f"{int(held) / 1e6:g}M: {rate / 1e3:.0f}k" for held, rate in steps.items()) or "-"

    writes = _table(["codes", "inserts rows/s, whole load", "as the collection grows (codes held: rows/s)",
                     "disk B/code", "server memory B/code, loaded (BIN_FLAT)"],
                    ([f"{x['n_codes']:,}", f"{x['insert_rows_per_s']:,}" if "insert_rows_per_s" in x else "-",
                      growth(x), f"{x['disk_bytes_per_code']:.0f}" if "disk_bytes_per_code" in x else "-",
                      f"{x['bin_flat']['server_rss_bytes_per_code']:.0f}"] for x in runs))
    return flat + [""] + ivf + [""] + writes


def million_write() -> list[str] | None:
    """The write path alone (codes precomputed) into milvus-lite: rates, peaks, verification, reopen."""
    r, runs = _million_runs("write_", "docs")
    if not runs:
        return None
    rows = []
    for x in runs:
        i, cut = x["ingest"], x.get("interrupt")
        rerun = (cut or {}).get("rerun") or {}
        rows.append([f"{x['docs']:,}", "yes" if x["text_index"] else "no", f"{i['docs_per_s']:.0f}",
                     f"{i['seconds']:.0f}", f"{i['verify_s']:.0f}", gib(i["driver_peak_gib"]),
                     gib(i["worker_peak_gib"]), gib(i["store_peak_gib"]), f"{i['bytes_per_doc']:,.0f}",
                     f"{i['open_to_count_s']:.0f}", f"{i['count']:,} / {i['distinct_ids']:,}",
                     f"{cut['interrupted_after_s']:.0f} s: {cut['rows_after_interrupt']['count']:,}" if cut else "not run",
                     f"{bool(rerun) and rerun['verified']}, {cut['final']['count']:,} / {cut['final']['distinct_ids']:,}"
                     if cut else "-",
                     f"{x['codes_p50_ms']:.0f} / {x['codes_p99_ms']:.0f}",
                     f"{x['hybrid_p50_ms']:.0f} / {x['hybrid_p99_ms']:.0f}" if "hybrid_p50_ms" in x else "-"])
    return _table(["documents", "text index", "rows/s", "write s", "verify s", "driver peak", "worker peak",
                   "milvus-lite peak", "file B/doc", "reopen to first answer s", "rows / distinct ids",
                   "Ctrl-C after: rows left", "rerun verified, rows / distinct ids", "codes search p50/p99 ms",
                   "hybrid p50/p99 ms"], rows)


def million_rerun() -> list[str] | None:
    """The write path alone, Ctrl-C'd and rerun (bench million interrupt --precomputed [--server])."""
    r = _json("million") or {}
    keys = [(k, store) for prefix, store in (("interrupt_rerun_codes_", "milvus-lite"),
                                             ("server_interrupt_rerun_codes_", "Milvus 2.3 server"))
            for k in sorted((k for k in r if k.startswith(prefix)), key=lambda k: int(k.rsplit("_", 1)[1]))]
    if not keys:
        return None
    rows = []
    for key, store in keys:
        x, rerun = r[key], r[key]["rerun"] or {}
        rows.append([store, f"{int(key.rsplit('_', 1)[1]):,}", f"{x['interrupted_after_s']:.0f} s: "
                     f"{x['rows_after_interrupt']['count']:,}", f"{rerun.get('rows_unchanged', 0):,}",
                     f"{rerun.get('rows_written', 0):,}", f"{rerun.get('docs_per_s', 0):.0f}",
                     f"{rerun.get('seconds', 0):.0f}", gib(rerun.get("driver_own_peak_gib", 0)),
                     gib(rerun.get("driver_peak_gib", 0)),
                     f"{bool(rerun) and rerun['verified']}, {x['final']['count']:,} / {x['final']['distinct_ids']:,}"])
    return _table(["store", "documents", "Ctrl-C after: rows left", "rerun: rows read back and left alone",
                   "rows written", "docs/s", "s", "driver peak, own", "driver peak, with the store's pages",
                   "verified, rows / distinct ids"], rows)


def million_reopen() -> list[str] | None:
    """Seconds from opening a milvus-lite file in a fresh process to its first answer."""
    r, runs = _million_runs("reopen_", "docs")
    if not runs:
        return None
    return _table(["documents", "codes only: open to first answer s", "with the text index s", "ratio"],
                  ([f"{x['docs']:,}", f"{x['codes_open_to_count_s']:.0f}", f"{x['text_open_to_count_s']:.0f}",
                    f"{x['text_open_to_count_s'] / x['codes_open_to_count_s']:.1f}x"] for x in runs))


def million_upsert() -> list[str] | None:
    """The store's upsert and insert rates on an empty collection and on a full one, and the
    insert rate as the collection grows."""
    r, runs = _million_runs("upsert_", "rows")
    if not runs:
        return None
    rows = []
    for x in sorted(runs, key=lambda x: (x.get("store", "milvus-lite"), x.get("text_index", False),
                                         x.get("text_store", ""), x["rows"])):
        every = x.get("every", 1_000_000)
        steps = x["insert_rows_per_s_by_million"]
        by_step = ", ".join(f"{min((i + 1) * every, x['rows']) / 1e6:g}M: {v / 1000:.1f}k" for i, v in enumerate(steps))
        held = f"{x['rows']:,}" + (" (a step took over its time: stopped)" if x.get("stopped_at") else "")
        text = ({"sqlite": "FTS5 beside the file", "file": "tantivy beside the file", "milvus": "Milvus' BM25"}[x.get("text_store", "milvus")]
                if x.get("text_index") else "no")
        reopen = x.get("reopen", {})
        opened = (f"{reopen['open_to_code_search_s']:.0f}" + (f" / {reopen['open_to_text_search_s']:.0f}"
                                                               if "open_to_text_search_s" in reopen else "")
                  if reopen else "")
        query = (f"{reopen['text_search_s']:.2f}" + (f" / {reopen['next_text_search_s']:.2f}"
                                                      if "next_text_search_s" in reopen else "")
                 if "text_search_s" in reopen else "")
        rows.append([x.get("store", "milvus-lite"), text, held,
                     f"{x['at_0']['upsert']:,.0f}", f"{x['at_0']['insert']:,.0f}", f"{x['at_n']['upsert']:,.0f}",
                     f"{x['at_n']['insert']:,.0f}", f"{x['insert_over_upsert_at_n']:.0f}x", by_step, opened, query])
    return _table(["store", "text index", "rows held", "upsert at 0 rows/s", "insert at 0 rows/s",
                   "upsert when full rows/s", "insert when full rows/s", "insert / upsert when full",
                   "insert rows/s as the collection grows (rows held: rate)",
                   "reopened: s to the first code / text answer", "a text query when full: first / next s"], rows)


def ray_train_run_label(run: str) -> str:
    """A bench.ray_train run's name (in-process, on-disk, a worker count) as the tables print it."""
    return {"in-process": "in-process", "on-disk": "in-process, features read from disk (`--feature-memory 0`)"}.get(
        run, f"Ray Train, {run} worker{'' if run == '1' else 's'}")


def _ratios(ratios: dict) -> list[str]:
    return ["", "| against in-process | wall time ratio | epoch time ratio "
            "| val P@100 difference |", "|---|---|---|---|",
            *(f"| {ray_train_run_label(run)} | {x['wall_time']:.2f} | {x['epoch_time']:.2f} | "
              f"{x['val_precision_diff']:+.4f} |" if "val_precision_diff" in x else
              f"| {ray_train_run_label(run)} | {x['wall_time']:.2f} | {x['epoch_time']:.2f} | |"
              for run, x in ratios.items())]


def ray_train() -> list[str] | None:
    r = _json("ray_train")
    if r is None:
        return None
    header = ["run", "best val P@100 (tie-aware)", "wall s", "Ray start s", "features s", "mean epoch s",
              "of which validation s", "wall to best epoch s"]
    rows = ([ray_train_run_label(name), f"{x['best_val_precision_at_k_tie_aware']:.4f}", f"{x['wall_seconds']:.1f}",
             f"{x.get('ray_start_seconds', 0):.1f}", f"{x['feature_seconds']:.1f}", f"{x['mean_epoch_seconds']:.2f}",
             seconds(x.get("mean_validate_seconds")), f"{x['wall_to_best_epoch_seconds']:.1f}"]
            for name, x in ((n, r[n]) for n in ("in-process", "on-disk", "1", "2") if n in r))
    return _table(header, rows) + _ratios(r["ratios_to_in_process"])




def ray_poll() -> list[str] | None:
    r = _json("ray_poll")
    if r is None:
        return None
    rows = []
    for x in r.values():
        docs = "the whole corpus" if x["limit"] is None else f"its first {x['limit']} documents"
        for name, label in (("ray_default", "every 2 s (Ray's default)"), ("dhim_ray", "every 0.25 s (dhim-ray)")):
            y = x[name]
            rows.append([f"{x['corpus']}, {docs}", label, f"{y['mean_epoch_s']:.2f}", f"{y['training_s']:.1f}",
                         f"{y['wall_s']:.1f}", f"{y['best_val_p']:.4f} (epoch {y['best_epoch']})",
                         "1.00x" if name == "ray_default" else f"{x['training_ratio']:.2f}x"])
    last = list(r.values())[-1]
    return _table(["corpus", "controller polls", "mean epoch s", "training s", "wall s", "best val P@100",
                   "training speed-up"], rows) + [
        "", f"{last['bits']} bits, {last['epochs']} epochs, {last['workers']} workers; the same training both ways: "
        f"{all(x['same_training'] for x in r.values())}; {last['device']}, best of {last['repeats']}."]


def gpu_memory() -> list[str] | None:
    r = _json("gpu_memory")
    if r is None:
        return None
    d, m = r["runs"]["on_disk"], r["runs"]["in_memory"]
    return ["| features | --feature-memory | peak RSS | features s | mean epoch s |", "|---|---|---|---|---|",
            f"| on disk (FeatureStore, read batch by batch) | 2 GiB (default) | {d['peak_rss_gib']:.2f} GiB | "
            f"{d['feature_seconds']:.1f} | {d['mean_epoch_seconds']:.1f} |",
            f"| in memory | 1000 GiB | {m['peak_rss_gib']:.2f} GiB | {m['feature_seconds']:.1f} | "
            f"{m['mean_epoch_seconds']:.1f} |"]


def gpu_encode() -> list[str] | None:
    r = _json("gpu_encode")
    if r is None:
        return None
    out = ["| corpus | precision | batch | sentence-transformers docs/s | `Hasher.encode` | ingest's actor, "
           "tokenising itself | ingest's actor, fed token ids | bits changed vs fp32 |", "|---|---|---|---|---|---|---|---|"]
    for name, c in r["corpora"].items():
        for x in c["runs"]:
            st = x["sentence_transformers_docs_per_s"]
            out.append(f"| {name} | {x['precision']} | {x['batch_size']} | {st:,.0f} | "
                       f"{x['hasher_over_st']:.2f}x | {x['ingest_actor_over_st']:.2f}x | "
                       f"{x['ingest_actor_tokenised_apart_over_st']:.2f}x ({x['ingest_actor_tokenised_apart_docs_per_s']:,.0f}/s) | "
                       f"{x['bits_changed_vs_fp32']:.2%} |")
    out += ["", "| corpus | clean + tokenise, one CPU core, docs/s | bits changed, GPU fp32 vs CPU (500 docs) |",
            "|---|---|---|",
            *(f"| {name} | {c['clean_and_tokenise_docs_per_s']:,.0f} | {c['bits_changed_gpu_fp32_vs_cpu']:.2%} |"
              for name, c in r["corpora"].items())]
    return out


def gpu_ingest() -> list[str] | None:
    results = [(r, label) for r, label in ((_json("gpu_ingest"), "milvus-lite"),
                                            (_json("gpu_ingest_server"), "Milvus 2.3 server")) if r is not None]
    if not results:
        return None
    out = ["| store | batch | text index | ingest docs/s | its encoding actor alone, docs/s | ingest over actor | "
           "GPU busy (mean) | writers | rows verified |", "|---|---|---|---|---|---|---|---|---|"]
    for r, store in results:
        for x in r["runs"]:
            busy = "" if x["gpu_busy_mean_pct"] is None else f"{x['gpu_busy_mean_pct']:.0f}%"
            writers = x.get("writers", 1)
            out.append(f"| {store} | {x['batch_size']} | {'yes' if x['text_index'] else 'no'} | "
                       f"{x['docs_per_second']:,.0f} | {x['actor_alone_docs_per_s']:,.0f} | "
                       f"{x['ingest_over_actor']:.2f}x | {busy} | {writers} | "
                       f"{x['rows_in_collection']:,} of {x['n_documents']:,} |")
        w = r.get("without_encoder")
        if w:
            out.append(f"| {store} | the same pipeline without the encoder | no | {w['docs_per_s']:,.0f} | | | | | "
                       f"{w['rows_in_collection']:,} of {w['docs']:,} |")
    return out


def gpu_train() -> list[str] | None:
    r = _json("gpu_train")
    if r is None:
        return None
    out = ["| run | best val P@100 | best/run epochs | features s | mean epoch s | wall s | peak RSS |",
           "|---|---|---|---|---|---|---|"]
    names = {"in_process_gpu": "in-process, `--device cuda`", "ray_1_gpu_worker":
             "Ray Train, 1 GPU worker (NCCL), `--workers 1 --use-gpu`",
             "in_process_cpu": f"in-process, `--device cpu` ({r['device']['cpu_cores']} cores)"}
    for key, label in names.items():
        x = r["runs"][key]
        out.append(f"| {label} | {x['best_val_precision_at_k_tie_aware']:.4f} | {x['best_epoch']}/"
                   f"{x['epochs_run']} | {x['feature_seconds']:.1f} | {x['mean_epoch_seconds']:.2f} | "
                   f"{x['wall_seconds']:.1f} | {x['peak_rss_gib']:.2f} GiB |")
    out += ["", "| ratio | value |", "|---|---|",
            f"| epoch time, CPU over GPU | {r['epoch_time_cpu_over_gpu']:.1f}x |",
            f"| epoch time, Ray Train's GPU worker over in-process GPU | "
            f"{r['epoch_time_ray_gpu_over_in_process_gpu']:.2f}x |"]
    return out








def _item_rows() -> list[dict]:
    path = HERE / "item_level.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _latest_item_row(rows: list[dict], corpus: str, method: str, bits: int | None) -> dict | None:
    """The last run of ``method`` at ``bits`` (None: a float or fixed-width baseline) on the shipped
    schedule, or None."""
    found = [r for r in rows if r["corpus"] == corpus and r["method"] == method and r.get("bits") == bits
             and r.get("max_epochs", 100) == 100]
    return found[-1] if found else None


def known_item() -> list[str] | None:
    """Both tasks per method and bytes: P@100 (tie-aware; re-ranked lists: their precision) and
    known-item recall@10 (8-word windows of val documents among train + val)."""
    rows = _item_rows()
    if not rows:
        return None

    def get(corpus: str, method: str) -> dict | None:
        return _latest_item_row(rows, corpus, method, None if method in ("ubinary", "cosine") else 64)

    out = _table(["corpus", "DHIM 64 (8 B)", "ITQ 64 (8 B)", "ubinary 384 (48 B)", "float cosine (1,536 B)",
                  "DHIM recall@10 / ITQ's"], [])
    for corpus in ("dbpedia", "agnews", "r8", "20ng"):
        d, itq, ub, cos = (get(corpus, m) for m in ("dhim shipped", "itq", "ubinary", "cosine"))

        def cell(r: dict | None) -> str:
            return f"{r['p_tie']:.3f} / {r['recall_at_10']:.3f}" if r and "recall_at_10" in r else ""

        ratio = f"{d['recall_at_10'] / itq['recall_at_10']:.2f}x" if d and itq else ""
        out.append(f"| {corpus} | {cell(d)} | {cell(itq)} | {cell(ub)} | {cell(cos)} | {ratio} |")
    return out


def known_item_128() -> list[str] | None:
    """The same two tasks at 128 bits (16 B), against ITQ 128 and ubinary's 48 B."""
    rows = _item_rows()
    body = []
    for corpus in ("dbpedia", "agnews", "r8", "20ng"):
        d, head, itq = (_latest_item_row(rows, corpus, m, 128) for m in ("dhim shipped", "dhim head-only", "itq"))
        ub = _latest_item_row(rows, corpus, "ubinary", None)
        if not d:
            continue
        cells = [f"{r['p_tie']:.3f} / {r['recall_at_10']:.3f}" if r else "" for r in (d, head, itq, ub)]
        body.append([corpus, *cells, f"{d['recall_at_10'] / ub['recall_at_10']:.2f}x" if ub else ""])
    return _table(["corpus", "DHIM 128 (16 B)", "DHIM 128, head only (16 B)", "ITQ 128 (16 B)", "ubinary 384 (48 B)",
                   "DHIM recall@10 / ubinary's"], body) if body else None


def item_level_training() -> list[str] | None:
    """DHIM variants on dbpedia (and agnews): both tasks, and the two-stage re-rankings where measured."""
    rows = [r for r in _item_rows() if r["method"].startswith("dhim") and r["corpus"] in ("dbpedia", "agnews")]
    if not rows:
        return None
    rows.sort(key=lambda r: (r["corpus"] != "dbpedia", r["bits"]))  # stable: in the order they were run
    body = []
    for r in rows:
        extra = (f"{r['p_ubinary']:.3f} / {r['recall_at_10_ubinary']:.3f}" if "p_ubinary" in r else "")
        body.append([r["corpus"], str(r["bits"]), r["method"].removeprefix("dhim "), f"{r['p_tie']:.3f}",
                     f"{r['recall_at_10']:.3f}", f"{r['mrr']:.3f}", str(r["best_epoch"]), extra])
    return _table(["corpus", "bits", "variant (--set)", "P@100", "known-item recall@10", "MRR", "best epoch",
                   "re-ranked by signs: P@100 / recall@10"], body)


def _hybrid_rows() -> dict[str, dict]:
    """The last bench.hybrid run per corpus (the shipped schedule)."""
    path = HERE / "hybrid.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return {r["corpus"]: r for r in rows if r.get("max_epochs", 100) == 100}


def _shipped_fusion() -> str:
    from dhim_ray.retrieval.fusion import Fusion

    return str(Fusion())


def hybrid() -> list[str] | None:
    """Both tasks through milvus-lite per list: the codes, BM25, the shipped fusion, RRF; float
    cosine's known-item recall (bench.item_level, in memory) for reference."""
    rows, items = _hybrid_rows(), _item_rows()
    if not rows:
        return None
    shipped = _shipped_fusion()
    names = {"codes": "DHIM 64 codes alone", "bm25": "BM25 alone (tantivy)", shipped: f"hybrid ({shipped}, shipped)",
             "rrf:60": "RRF(60) of the two lists"}
    body = []
    for corpus in ("dbpedia", "agnews", "r8", "20ng"):
        r = rows.get(corpus)
        if r is None:
            continue
        cos = _latest_item_row(items, corpus, "cosine", None)
        for how, name in names.items():
            body.append([corpus, name, f"{r[f'topic_p10_{how}']:.3f}", f"{r[f'topic_p100_{how}']:.3f}",
                         f"{r[f'short_p100_{how}']:.3f}", f"{r[f'item_recall_at_10_{how}']:.3f}",
                         f"{cos['recall_at_10']:.3f}" if cos and how == "codes" else ""])
    return _table(["corpus", "search", "topic P@10", "topic P@100", "short queries P@100", "known-item recall@10",
                   "float cosine recall@10 (1,536 B, in memory)"], body)


def hybrid_fusions() -> list[str] | None:
    """Every fusion measured, as the change from the codes alone (points) and known-item recall@10."""
    rows = _hybrid_rows()
    if not rows:
        return None
    fusions = [k.removeprefix("item_recall_at_10_") for k in next(iter(rows.values()))
               if k.startswith("item_recall_at_10_") and k[18:] not in ("codes", "bm25")]
    body = []
    for corpus, r in rows.items():
        for how in fusions:
            if f"topic_p10_{how}" not in r:
                continue
            delta = [100 * (r[f"{m}_{how}"] - r[f"{m}_codes"]) for m in ("topic_p10", "topic_p100", "short_p100")]
            body.append([corpus, how, *(f"{d:+.2f}" for d in delta), f"{r[f'item_recall_at_10_{how}']:.3f}"])
    return _table(["corpus", "fusion", "topic P@10 (points)", "topic P@100 (points)", "short P@100 (points)",
                   "known-item recall@10"], body)


def hybrid_bytes() -> list[str] | None:
    """Bytes per document: the milvus-lite file with and without the text index, the stored text."""
    rows = _hybrid_rows()
    if not rows:
        return None
    body = [[corpus, f"{r['bytes_per_doc_codes']:,.0f}", f"{r['bytes_per_doc_hybrid']:,.0f}",
             f"{r['bytes_per_doc_hybrid'] - r['bytes_per_doc_codes']:,.0f}", f"{r['text_bytes_per_doc']:,.0f}"]
            for corpus, r in rows.items()]
    return _table(["corpus", "file, codes only (B/doc)", "file, with the text index (B/doc)",
                   "the text index (B/doc)", "stored text (B/doc)"], body)


def hybrid_headline() -> list[str] | None:
    """The README's two tasks: the codes alone and hybrid through milvus-lite, float cosine for reference."""
    rows, items = _hybrid_rows(), _item_rows()
    if not rows:
        return None
    shipped = _shipped_fusion()
    body = []
    for corpus in ("dbpedia", "agnews", "r8", "20ng"):
        r, cos = rows.get(corpus), _latest_item_row(items, corpus, "cosine", None)
        if r is None:
            continue
        body.append([corpus, *(f"{r[f'topic_p100_{h}']:.3f} / {r[f'item_recall_at_10_{h}']:.3f}"
                               for h in ("codes", shipped, "bm25")),
                     f"{cos['p_tie']:.3f} / {cos['recall_at_10']:.3f}" if cos else "",
                     f"{r['bytes_per_doc_codes']:,.0f} / {r['bytes_per_doc_hybrid']:,.0f}"])
    return _table(["corpus", "DHIM 64 codes alone", "DHIM 64 + BM25, hybrid (the default)", "BM25 alone",
                   "float cosine (in memory)", "file B/doc: codes only / hybrid"], body)


TABLES: dict[str, Callable[[], list[str] | None]] = {
    "hybrid": hybrid, "hybrid-fusions": hybrid_fusions, "hybrid-bytes": hybrid_bytes,
    "hybrid-headline": hybrid_headline,
    "headline": headline, "known-item": known_item, "known-item-128": known_item_128,
    "item-level-training": item_level_training,
    "ray-poll": ray_poll,
    "startup": startup, "new-collection": new_collection, "ray-start": ray_start,
    "encode-speed": encode_speed, "onnx-speed": onnx_speed, "ingest-speed": ingest_speed,
    "ingest-rerun": ingest_rerun, "eval-methods": eval_methods,
    "service": service,
    "service-mixed": service_mixed,
    "quality": quality, "million-search": million_search, "million-ingest": million_ingest,
    "million-hybrid": million_hybrid, "store": store, "store-server": store_server, "million-write": million_write,
    "million-reopen": million_reopen, "million-upsert": million_upsert, "million-columns": million_columns, "million-rerun": million_rerun,
    "ray-train": ray_train,
    "gpu-memory": gpu_memory, "gpu-train": gpu_train, "gpu-encode": gpu_encode,
    "gpu-ingest": gpu_ingest,
}


def refresh(text: str) -> str:
    """``text`` with every table block rewritten from the results (an unknown name is an error)."""
    def fill(m: re.Match) -> str:
        if m.group(2) not in TABLES:
            raise SystemExit(f"BENCHMARKS.md: no table named {m.group(2)!r}; known: {', '.join(TABLES)}")
        lines = TABLES[m.group(2)]()
        return m.group(0) if lines is None else m.group(1) + "\n".join(lines) + "\n" + m.group(4)

    return BLOCK.sub(fill, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a table in BENCHMARKS.md is out of date")
    args = ap.parse_args()
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = refresh(text)
        if new != text:
            stale.append(doc.name)
            if not args.check:
                doc.write_text(new)
        if not args.check:
            print(f"refreshed {len(BLOCK.findall(new))} tables in {doc}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python -m bench.report", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
