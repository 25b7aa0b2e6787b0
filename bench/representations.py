"""Sentence-representation refinements (issue 16): whitening, BERT-flow, layer-averaged
whitening and SG-OPT, as float baselines, as sign-hashing baselines, and under DHIM.

    python -m bench.representations refine --corpora dbpedia agnews        # SG-OPT encoders (bench/.cache/sg-opt)
    python -m bench.representations refine --corpora r8 --refine-words 64  # long texts: refine on their first 64 words
    python -m bench.representations float --corpora dbpedia agnews r8 20ng  # float cosine kNN per representation
    python -m bench.representations signs --corpora dbpedia agnews r8 20ng --bits 16 32 64 128
    python -m bench.representations dhim --corpora dbpedia agnews --bits 16 --max-epochs 8
    python -m bench.representations report

Protocol as bench.quality (database = train.csv, queries = val.csv, tie-aware P@100;
DHIM picks its epoch on a 10% slice of train.csv). Every transform is fitted on the
database (train.csv) vectors only. Results accumulate in bench/representations.jsonl
(a rerun skips what is there); ``report`` prints the tables BENCHMARKS.md holds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA, append_row, read_rows
from bench.protocol import LONG, corpus_features, epoch_cap, load_results, record_shipped_schedule, train_dhim
from dhim_ray.config import FeatureConfig, config_for_bits
from dhim_ray.corpus.data import load_corpus
from dhim_ray.retrieval.baselines import make_baseline
from dhim_ray.retrieval.metrics import cosine_precision_at_k, precision_at_k

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "representations.jsonl"
CACHE = HERE / ".cache"
SG_DIR = CACHE / "sg-opt"


def load_rows() -> list[dict]:
    return read_rows(RESULTS)


def record(row: dict) -> None:
    append_row(RESULTS, row)


def done(rows, **key) -> bool:
    return any(all(r.get(k) == v for k, v in key.items()) for r in rows)


def sg_opt_encoder(name: str) -> Path:
    return SG_DIR / name


def layer_average(name: str, train, val, max_words: int) -> tuple[np.ndarray, np.ndarray]:
    """First-last-avg sentence vectors of train and val, cached under bench/.cache."""
    path = CACHE / "first-last-avg" / f"{name}.npz"
    if path.exists():
        saved = np.load(path)
        return saved["train"], saved["val"]
    from dhim_ray.encoding.encoder import FrozenEncoder

    enc = FrozenEncoder(FeatureConfig(max_words=max_words))
    tr = enc.sentence_vectors(train.texts, "first-last-avg", progress=True)
    va = enc.sentence_vectors(val.texts, "first-last-avg", progress=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, train=tr, val=va)
    return tr, va


def representations(name: str, cache_dir: str, with_layers: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (database vectors, query vectors), every transform fitted on the database."""
    from dhim_ray.encoding.transforms import Whitening, fit_transform, transform

    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    x, q = np.asarray(tr.mean, np.float32), np.asarray(va.mean, np.float32)
    reps = {"plain (mean)": (x, q), "plain [CLS]": (np.asarray(tr.cls), np.asarray(va.cls))}
    for kind in ("whitening", "flow"):
        t = fit_transform(kind, x)
        reps[kind] = (transform(t, x), transform(t, q))
    w = Whitening(x.shape[1], k=128).fit(x)
    reps["whitening k=128"] = (transform(w, x), transform(w, q))
    if with_layers:
        lx, lq = layer_average(name, train, val, encoder.config.max_words)
        reps["first-last-avg"] = (lx, lq)
        t = fit_transform("whitening", lx)
        reps["first-last-avg whitening"] = (transform(t, lx), transform(t, lq))
    sg = sg_opt_encoder(name)
    if sg.exists():
        _, _, _, a, b = corpus_features(name, cache_dir, str(sg))
        reps["sg-opt (mean)"] = (np.asarray(a.mean), np.asarray(b.mean))
        reps["sg-opt [CLS]"] = (np.asarray(a.cls), np.asarray(b.cls))
    return reps


def run_refine(corpora, steps: int, lr: float, max_words: int = 0) -> None:
    from dhim_ray.encoding.refine import RefineConfig, refine_encoder

    for name in corpora:
        out = sg_opt_encoder(name)
        if out.exists():
            continue
        train = load_corpus(str(DATA / name)).split("train")
        words = max_words or (400 if name in LONG else 50)
        cfg = RefineConfig(lr=lr, max_steps=steps, max_words=words)
        partial = out.with_name(out.name + ".partial")
        summary = refine_encoder(train.texts, out, cfg, resume=(partial / "refine-state").exists(), progress=True)
        row = {"kind": "refine", "corpus": name, "steps": summary["steps"], "seconds": summary["seconds"],
               "docs_per_second": round(summary["steps"] * cfg.batch_size / summary["seconds"], 2),
               "first_loss": summary["first_loss"], "last_loss": summary["last_loss"], "lr": lr, "max_words": words}
        # an encoder rebuilt (bench/.cache cleared) with the recorded settings: the same losses say it is
        # the same encoder, and the table keeps its one row; other losses are a new measurement
        same = [r for r in load_rows() if all(r.get(f) == row[f] for f in
                                               ("kind", "corpus", "steps", "lr", "max_words", "first_loss", "last_loss"))]
        if same:
            print(f"{name}: rebuilt the recorded SG-OPT encoder (the same losses, {row['seconds']} s)", flush=True)
        else:
            record(row)


def run_float(corpora, cache_dir: str, k: int, with_layers: bool) -> None:
    rows = load_rows()
    for name in corpora:
        _, train, val, _, _ = corpus_features(name, cache_dir)
        for rep, (x, q) in representations(name, cache_dir, with_layers).items():
            if done(rows, kind="float", corpus=name, representation=rep):
                continue
            p = cosine_precision_at_k(x, train.labels, q, val.labels, k)
            record({"kind": "float", "corpus": name, "representation": rep, "p": p})


def run_signs(corpora, bits_list, cache_dir: str, k: int) -> None:
    rows = load_rows()
    for name in corpora:
        _, train, val, tr, va = corpus_features(name, cache_dir)
        x, q = np.asarray(tr.mean), np.asarray(va.mean)
        for bits in bits_list:
            for method in ("whitening-sign", "flow-sign", "itq"):
                if done(rows, kind="sign", corpus=name, bits=bits, method=method):
                    continue
                t0 = time.perf_counter()
                b = make_baseline(method, bits, 0).fit(x)
                r = precision_at_k(b.hash(x), train.labels, b.hash(q), val.labels, k)
                record({"kind": "sign", "corpus": name, "bits": bits, "method": method,
                        "p_tie": r.precision_at_k_tie_aware, "seconds": round(time.perf_counter() - t0, 1)})


VARIANTS: dict[str, dict] = {
    "shipped": {},
    "flow target": {"model": {"target_transform": "flow"}},
    "whitening target": {"model": {"target_transform": "whitening"}},
    "flow neighbours": {"model": {"neighbour_transform": "flow"}},
    "whitening neighbours": {"model": {"neighbour_transform": "whitening"}},
    "sg-opt features": {"encoder": "sg-opt"},
    "sg-opt features, [CLS] target": {"encoder": "sg-opt", "model": {"regulariser": "cls"}},
    # long documents: training reads random windows (64 words shipped), codes read the whole text
    "crop 128 words": {"train": {"crop_tokens": 128}},
}


def run_dhim(corpora, bits_list, variants, max_epochs: int, long_epochs: int, k: int, cache_dir: str,
             seeds=(0,)) -> None:
    rows = load_rows()
    for name in corpora:
        for variant in variants:
            over = VARIANTS[variant]
            if over.get("encoder") == "sg-opt":
                if not sg_opt_encoder(name).exists():
                    print(f"skipping {name} {variant}: no SG-OPT encoder (run 'refine' first)", flush=True)
                    continue
                encoder, train, val, tr, va = corpus_features(name, cache_dir, str(sg_opt_encoder(name)))
            else:
                encoder, train, val, tr, va = corpus_features(name, cache_dir)
            for bits in bits_list:
                epochs = epoch_cap(name, bits, max_epochs, long_epochs)
                for seed in seeds:
                    key = {"kind": "dhim", "corpus": name, "bits": bits, "variant": variant, "seed": seed,
                           "max_epochs": epochs}
                    if done(rows, **key):
                        continue
                    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size, **over.get("model", {})},
                                          train={"max_epochs": epochs, "seed": seed, **over.get("train", {})})
                    row = train_dhim(cfg, tr, va, train, val, k)
                    record({**key, **row})
                    if variant == "shipped":
                        record_shipped_schedule(name, bits, seed, epochs, cfg.train.patience, row)


def quality_shipped(quality: list[dict], cell: list[dict], corpus: str, bits: int, cap: int) -> list[dict]:
    """The quality table's runs of the shipped configuration for the seeds a variant ran here and
    the 'shipped' variant did not: the same training (bench.quality's train_dhim, same carving and
    seed), so a variant pairs with it as with a shipped run of this bench."""
    here = {r.get("seed", 0) for r in cell if r["variant"] == "shipped"}
    wanted = {r.get("seed", 0) for r in cell if r["variant"] != "shipped"} - here
    return [{**r, "variant": "shipped", "from_quality": True} for r in quality
            if r.get("method") == "dhim shipped" and r["corpus"] == corpus and r["bits"] == bits
            and r.get("max_epochs") == cap and r.get("seed", 0) in wanted]


def report() -> str:
    rows = load_rows()
    corpora = [c for c in ("dbpedia", "agnews", "r8", "20ng") if any(r.get("corpus") == c for r in rows)]
    out = []
    floats = [r for r in rows if r["kind"] == "float"]
    reps = list(dict.fromkeys(r["representation"] for r in floats))
    if floats:
        out += ["| representation | " + " | ".join(corpora) + " |", "|---|" + "---|" * len(corpora)]
        for rep in reps:
            cells = []
            for c in corpora:
                hit = [r["p"] for r in floats if r["corpus"] == c and r["representation"] == rep]
                cells.append(f"{hit[0]:.4f}" if hit else "")
            out.append(f"| {rep} | " + " | ".join(cells) + " |")
        out.append("")
    signs = [r for r in rows if r["kind"] == "sign"]
    if signs:
        bits = sorted({r["bits"] for r in signs})
        out += ["| corpus | method | " + " | ".join(f"{b} bits" for b in bits) + " |", "|---|---|" + "---|" * len(bits)]
        for c in corpora:
            for m in ("whitening-sign", "flow-sign", "itq"):
                cells = [next((f"{r['p_tie']:.4f}" for r in signs if r["corpus"] == c and r["method"] == m
                               and r["bits"] == b), "") for b in bits]
                out.append(f"| {c} | {m} | " + " | ".join(cells) + " |")
        out.append("")
    dhim = [r for r in rows if r["kind"] == "dhim"]
    if dhim:
        quality = load_results()
        out += ["| corpus | bits | variant | P@100 tie-aware | vs shipped | seeds: vs shipped per seed "
                "| best epoch / run (cap) | train s |", "|---|---|---|---|---|---|---|---|"]
        for c in corpora:
            for b, cap in sorted({(r["bits"], r["max_epochs"]) for r in dhim if r["corpus"] == c}):
                cell = [r for r in dhim if r["corpus"] == c and r["bits"] == b and r["max_epochs"] == cap]
                cell += quality_shipped(quality, cell, c, b, cap)
                # a variant's difference seed by seed, where the shipped variant ran with the same seed;
                # 'vs shipped' is their mean (paired: a seed only one side ran does not count)
                by_seed = {r.get("seed", 0): r["p_tie"] for r in cell if r["variant"] == "shipped"}
                for v in VARIANTS:
                    got = [r for r in cell if r["variant"] == v]
                    if not got:
                        continue
                    p = float(np.mean([r["p_tie"] for r in got]))
                    seeds = sorted({r.get("seed", 0) for r in got})
                    paired = [100 * (r["p_tie"] - by_seed[r.get("seed", 0)])
                              for r in sorted(got, key=lambda r: r.get("seed", 0))
                              if r.get("seed", 0) in by_seed] if v != "shipped" else []
                    per_seed = ", ".join(f"{d:+.2f}" for d in paired)
                    diff = f"{np.mean(paired):+.2f} pt" if paired else ""
                    r0 = got[0]
                    if v == "shipped" and all(r.get("from_quality") for r in got):
                        v += " (quality table)"
                    out.append(f"| {c} | {b} | {v} | {p:.4f} | {diff} | {len(seeds)}: {per_seed} | "
                               f"{r0['best_epoch']}/{r0['epochs_run']} ({r0['max_epochs']}) | {r0['seconds']} |")
        out.append("")
    refines = [r for r in rows if r["kind"] == "refine"]
    if refines:
        out += ["| corpus | SG-OPT steps | words per text | seconds | docs/s | loss first -> last | lr |",
                "|---|---|---|---|---|---|---|"]
        for r in refines:
            out.append(f"| {r['corpus']} | {r['steps']} | {r.get('max_words', 50)} | {r['seconds']} | "
                       f"{r['docs_per_second']} | {r['first_loss']:.3f} -> {r['last_loss']:.3f} | {r['lr']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["refine", "float", "signs", "dhim", "report"])
    ap.add_argument("--corpora", nargs="+", default=["dbpedia", "agnews", "r8", "20ng"])
    ap.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64, 128])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--max-epochs", type=int, default=8)
    ap.add_argument("--long-epochs", type=int, default=10)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(CACHE / "features"))
    ap.add_argument("--no-layers", action="store_true", help="skip first-last-avg (one more encoder pass per corpus)")
    ap.add_argument("--steps", type=int, default=0, help="refine: SG-OPT steps (0 = one epoch)")
    ap.add_argument("--lr", type=float, default=1e-5, help="refine: SG-OPT learning rate")
    ap.add_argument("--refine-words", type=int, default=0,
                    help="refine: words per text (0 = the corpus's feature length: 400 on r8/20ng, else 50)")
    a = ap.parse_args()
    if a.what == "refine":
        run_refine(a.corpora, a.steps, a.lr, a.refine_words)
    elif a.what == "float":
        run_float(a.corpora, a.cache_dir, a.k, not a.no_layers)
    elif a.what == "signs":
        run_signs(a.corpora, a.bits, a.cache_dir, a.k)
    elif a.what == "dhim":
        run_dhim(a.corpora, a.bits, a.variants, a.max_epochs, a.long_epochs, a.k, a.cache_dir, tuple(a.seeds))
    else:
        print(report())


if __name__ == "__main__":
    main()
