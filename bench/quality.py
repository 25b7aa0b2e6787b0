"""Quality benchmark: DHIM (as shipped, as published) vs classic hashing on the same frozen features.

    python -m bench.quality table --corpora dbpedia agnews r8 20ng --bits 16 32 64 128
    python -m bench.quality ablation --corpora dbpedia --bits 32 64
    python -m bench.quality report

Protocol (../shared/data/README.md): database = train.csv, queries = val.csv,
precision@100 by Hamming distance, both tie rules; cosine kNN on the float
mean-pooled features is the unhashed reference. DHIM's model selection (early
stopping, best epoch) uses a held-out slice of train.csv (10%, at most 1,000
documents), never val.csv; it trains on the rest, then hashes all of train.csv as
the database. Short corpora keep 50 words, long ones (20ng, r8) 400.
Every result is appended to bench/quality.jsonl as it comes (reruns skip what is
there); ``report`` turns it into bench/quality.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.harness import HERE
from bench.protocol import (
    SHIPPED_EPOCHS,
    corpus_features,
    done,
    epoch_cap,
    load_results,
    record,
    train_dhim,
)
from bench.report import has_shipped_identity
from dhim_ray.config import as_published, config_for_bits
from dhim_ray.retrieval.baselines import make_baseline
from dhim_ray.retrieval.metrics import cosine_precision_at_k, precision_at_k

SEEDS = {32: (0, 1, 2), 64: (0, 1, 2)}  # DHIM seeds per code length (one elsewhere)

# Ablation: the shipped configuration with one lever changed: back to the paper's choice,
# or (the ITQ-initialised linear path) a lever that was tried and measured as losing.
ABLATIONS: dict[str, dict] = {
    "shipped": {},
    "no neighbour positives": {"train": {"neighbours": 0}},
    "with ITQ-initialised linear path": {"model": {"linear_path": True, "init": "itq"}},
    "[CLS] regulariser target": {"model": {"regulariser": "cls"}},
    "sigmoid before softplus (paper code)": {"model": {"score_sigmoid": True}},
    "padding counted as words (paper code)": {"model": {"mask_padding": False}},
    "beta 1 (paper code ignores --beta)": {"train": {"beta": 1.0}},
    "256 filters (paper)": {"model": {"n_filters": 256}},
    "batch 512 (fewer steps)": {"train": {"batch_size": 512}},
    "no crops": {"train": {"crop_tokens": 0}},
}


def run_table(corpora, bits_list, max_epochs, k, cache_dir, published_epochs, published_corpora,
              one_seed_corpora=(), long_epochs=None, cell_epochs=None) -> None:
    rows = load_results()
    for name in corpora:
        encoder, train, val, tr, va = corpus_features(name, cache_dir)
        if not done(rows, corpus=name, method="cosine kNN"):
            cos = cosine_precision_at_k(tr.mean, train.labels, va.mean, val.labels, k)
            record({"corpus": name, "bits": "float", "method": "cosine kNN", "p": cos, "p_tie": cos, "seconds": 0.0})
        for bits in bits_list:
            for method in ("lsh", "pca-sign", "pca-median", "itq"):
                if done(rows, corpus=name, bits=bits, method=method):
                    continue
                t0 = time.perf_counter()
                b = make_baseline(method, bits, 0).fit(tr.mean)
                r = precision_at_k(b.hash(tr.mean), train.labels, b.hash(va.mean), val.labels, k)
                record({"corpus": name, "bits": bits, "method": method, "p": r.precision_at_k,
                        "p_tie": r.precision_at_k_tie_aware, "seconds": round(time.perf_counter() - t0, 1)})
            seeds = (0,) if name in one_seed_corpora else SEEDS.get(bits, (0,))
            epochs = epoch_cap(name, bits, max_epochs, long_epochs, cell_epochs)
            for seed in seeds:
                cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size},
                                      train={"max_epochs": epochs, "seed": seed})
                if done(rows, corpus=name, bits=bits, method="dhim shipped", seed=seed, max_epochs=epochs,
                        identity_bits=cfg.model.identity_bits):
                    continue
                record({"corpus": name, "bits": bits, "method": "dhim shipped", "seed": seed, "max_epochs": epochs,
                        "identity_bits": cfg.model.identity_bits, **train_dhim(cfg, tr, va, train, val, k)})
            if name in published_corpora and not done(rows, corpus=name, bits=bits, method="dhim as published"):
                cfg = as_published(config_for_bits(bits, model={"hidden_size": encoder.hidden_size},
                                                   train={"max_epochs": published_epochs}))
                record({"corpus": name, "bits": bits, "method": "dhim as published", "seed": 0,
                        "max_epochs": published_epochs, **train_dhim(cfg, tr, va, train, val, k)})


def run_ablation(corpora, bits_list, max_epochs, k, cache_dir, levers, long_epochs=None) -> None:
    rows = load_results()
    for name in corpora:
        encoder, train, val, tr, va = corpus_features(name, cache_dir)
        for bits in bits_list:
            epochs = epoch_cap(name, bits, max_epochs, long_epochs)
            for lever in levers:
                if done(rows, corpus=name, bits=bits, method="ablation", lever=lever):
                    continue
                over = ABLATIONS[lever]
                cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size, **over.get("model", {})},
                                      train={"max_epochs": epochs, **over.get("train", {})})
                record({"corpus": name, "bits": bits, "method": "ablation", "lever": lever, "seed": 0,
                        "max_epochs": epochs, "identity_bits": cfg.model.identity_bits,
                        **train_dhim(cfg, tr, va, train, val, k)})


def parse_cell_epochs(pairs: list[str]) -> dict[tuple[str, int], int]:
    """["20ng:16=20"] -> {("20ng", 16): 20}: an epoch cap for one corpus and width."""
    out = {}
    for pair in pairs:
        cell, sep, n = pair.partition("=")
        name, colon, bits = cell.partition(":")
        if not (sep and colon and bits.isdigit() and n.isdigit() and int(n) > 0):
            raise SystemExit(f"--cell-epochs {pair!r}: write CORPUS:BITS=EPOCHS, e.g. 20ng:16=20")
        out[(name, int(bits))] = int(n)
    return out


def _fmt(values: list[float | None]) -> str:
    if any(v is None for v in values):  # not recorded (a run replayed from another bench's history)
        return ""
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{np.mean(values):.4f} ± {np.std(values):.4f} (n={len(values)})"


def _identity(r: dict) -> int:
    return r.get("identity_bits", 0)


def _of_shipped(rs: list[dict], bits: int) -> tuple[list[dict], list[dict]]:
    """'dhim shipped' rows: (those with the shipped identity bits of this width, those with none,
    run before the identity bits shipped)."""
    return [r for r in rs if has_shipped_identity(r, bits)], [r for r in rs if not has_shipped_identity(r, bits)]


def _shipped_split(rs: list[dict]) -> tuple[list[dict], list[dict]]:
    """'dhim shipped' runs: (the shipped schedule's, the capped ones of the most common cap, the longer on a tie)."""
    full = [r for r in rs if r.get("max_epochs", 0) >= SHIPPED_EPOCHS]
    capped = [r for r in rs if r.get("max_epochs", 0) < SHIPPED_EPOCHS]
    if capped:  # one cap per row: the cap most of the seeds ran at
        caps = [r.get("max_epochs") for r in capped]
        capped = [r for r in capped if r.get("max_epochs") == max(set(caps), key=lambda c: (caps.count(c), c))]
    return full, capped


def _seconds(runs: list[dict]) -> str:
    """Mean training seconds of the runs that recorded them (replays of another bench may not)."""
    got = [r["seconds"] for r in runs if r.get("seconds") is not None]
    return f"{np.mean(got):.0f}" if got else ""


def to_markdown(rows: list[dict]) -> str:
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    order = ["dhim shipped", "dhim as published", "itq", "pca-median", "pca-sign", "lsh"]
    lines = ["Tie-aware P@100 (ties at the k-th distance count as their expected share); 'db order' breaks ties "
             "by database row. DHIM: mean ± std over seeds where n > 1; training seconds per run (2 shared CPU "
             "cores: other runs were going at the same time, so read them as upper bounds), best epoch / epochs "
             "run of the first seed. Cosine kNN: float mean-pooled features (384 floats = 12,288 bits).", "",
             "| corpus | bits | method | P@100 tie-aware | P@100 db order | train s | epochs (best/run) |",
             "|---|---|---|---|---|---|---|"]
    for c in corpora:
        cos = [r for r in rows if r["corpus"] == c and r["method"] == "cosine kNN"]
        if cos:
            lines.append(f"| {c} | float | cosine kNN | {cos[0]['p_tie']:.4f} | {cos[0]['p']:.4f} | 0 | |")
        for bits in (16, 32, 64, 128):
            for m in order:
                rs = [r for r in rows if r["corpus"] == c and r["bits"] == bits and r["method"] == m]
                groups = [(m, rs)]
                if m == "dhim shipped":  # the shipped schedule's run when there is one; a capped run beside it
                    groups = []
                    for label, part in zip((m, "dhim head only (identity_bits=0)"), _of_shipped(rs, bits)):
                        full, capped = _shipped_split(part)
                        groups += [(label, full), (f"{label}, capped", capped)] if full else [(label, capped)]
                for label, grp in groups:
                    if not grp:
                        continue
                    ep = f"{grp[0]['best_epoch'] + 1}/{grp[0]['epochs_run']}" if "best_epoch" in grp[0] else ""
                    if ep and label.startswith(("dhim shipped", "dhim head only")):
                        cap = grp[0].get("max_epochs", 0)
                        ep += " (shipped schedule)" if cap >= SHIPPED_EPOCHS else f" (cap {cap})"
                    lines.append(f"| {c} | {bits} | {label} | {_fmt([r['p_tie'] for r in grp])} | "
                                 f"{_fmt([r['p'] for r in grp])} | {_seconds(grp)} | {ep} |")
    # The goal: shipped DHIM >= ITQ + 2 points everywhere, >= cosine kNN at 64 bits.
    lines += ["", "Margins of DHIM as shipped (mean over seeds, tie-aware):", "",
              "| corpus | bits | vs ITQ (points) | vs cosine kNN (points) | DHIM run |", "|---|---|---|---|---|"]
    for c in corpora:
        cos = [r["p_tie"] for r in rows if r["corpus"] == c and r["method"] == "cosine kNN"]
        for bits in (16, 32, 64, 128):
            full, capped = _shipped_split(_of_shipped([r for r in rows if r["corpus"] == c and r["bits"] == bits
                                                       and r["method"] == "dhim shipped"], bits)[0])
            d = [r["p_tie"] for r in (full or capped)]
            itq = [r["p_tie"] for r in rows if r["corpus"] == c and r["bits"] == bits and r["method"] == "itq"]
            if d and itq:
                vs_cos = f"{100 * (np.mean(d) - cos[0]):+.1f}" if cos else ""
                run = "shipped schedule" if full else f"cap {capped[0].get('max_epochs')}"
                lines.append(f"| {c} | {bits} | {100 * (np.mean(d) - itq[0]):+.1f} | {vs_cos} | {run} |")
    abl = [r for r in rows if r["method"] == "ablation"]
    if abl:
        cols = list(dict.fromkeys((r["corpus"], r["bits"]) for r in abl))
        # the shipped row is the table's seed-0 run of the same corpus, width and epoch cap
        runs = {(r["corpus"], r["bits"], r.get("max_epochs"), _identity(r)) for r in abl}
        abl = [{**r, "lever": "shipped"} for r in rows if r["method"] == "dhim shipped" and r.get("seed") == 0
               and (r["corpus"], r["bits"], r.get("max_epochs"), _identity(r)) in runs] + abl
        levers = list(dict.fromkeys(r["lever"] for r in abl))
        lines += ["", "Ablation (tie-aware P@100, seed 0; each row changes one lever of the shipped configuration: "
                  "back to the paper's choice, or a lever tried and dropped; at 64 bits all were run on the head "
                  "alone, before the identity bits shipped):", "",
                  "| lever | " + " | ".join(f"{c} {b}b" for c, b in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for lever in levers:
            cells = []
            for c, b in cols:
                rs = [r for r in abl if r["lever"] == lever and r["corpus"] == c and r["bits"] == b]
                cells.append(f"{rs[0]['p_tie']:.4f}" if rs else "")
            lines.append(f"| {lever} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["table", "ablation", "report"])
    ap.add_argument("--corpora", nargs="+", default=["dbpedia", "agnews", "r8", "20ng"])
    ap.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64, 128])
    ap.add_argument("--max-epochs", type=int, default=10, help="DHIM epoch cap (early stopping may end sooner)")
    ap.add_argument("--published-epochs", type=int, default=5)
    ap.add_argument("--published-corpora", nargs="*", default=["dbpedia", "agnews"],
                    help="corpora for the as-published runs (256 filters at 400 tokens is slow on 2 cores)")
    ap.add_argument("--one-seed-corpora", nargs="*", default=[], help="corpora trained with seed 0 only")
    ap.add_argument("--long-epochs", type=int, default=None, help="epoch cap for the long corpora (20ng, r8)")
    ap.add_argument("--cell-epochs", nargs="*", default=[], metavar="CORPUS:BITS=EPOCHS",
                    help="table: epoch cap for single cells, e.g. 20ng:16=20 (overrides the two above)")
    ap.add_argument("--levers", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"),
                    help="frozen features, shared with the other benches (bench/.cache/features)")
    args = ap.parse_args()
    if args.mode == "table":
        run_table(args.corpora, args.bits, args.max_epochs, args.k, args.cache_dir, args.published_epochs,
                  set(args.published_corpora), set(args.one_seed_corpora), args.long_epochs,
                  parse_cell_epochs(args.cell_epochs))
    elif args.mode == "ablation":
        run_ablation(args.corpora, args.bits, args.max_epochs, args.k, args.cache_dir, args.levers, args.long_epochs)
    (HERE / "quality.md").write_text(to_markdown(load_results()))
    print(f"wrote {HERE / 'quality.md'}")


if __name__ == "__main__":
    main()
