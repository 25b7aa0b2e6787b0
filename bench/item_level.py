"""Both tasks side by side: "same topic" (tie-aware P@100, val queries against the train
database) and known-item retrieval (1,000 windows of 8 words cut from val documents, searched
among train + val: the one relevant result is the window's own document; recall@10, MRR).

DHIM variants are trained by the quality protocol (bench/protocol.py: model selection on a
slice of train, never on val); the baselines are fitted on the train vectors. Features are
cached in bench/.cache/features.

    python -m bench.item_level --corpora dbpedia --bits 64 --variants shipped views
    python -m bench.item_level --baselines           # ITQ, LSH, PCA-sign, ubinary, cosine

Results accumulate in bench/item_level.jsonl (a rerun skips what is there).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.harness import HERE, append_row, read_rows
from bench.protocol import corpus_features, done, fit_carved, training_fields
from dhim_ray.config import config_for_bits, parse_overrides
from dhim_ray.model.inference import hash_features, score_features
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.baselines import make_baseline
from dhim_ray.retrieval.metrics import precision_at_k

RESULTS = HERE / "item_level.jsonl"
CORPORA = ("dbpedia", "agnews", "r8", "20ng")
#: Variants of the training, as --set pairs over the shipped configuration. The levers tried before
#: the identity bits shipped were measured on the head alone (model.identity_bits=0), as they stay.
#: The views and distill variants' rows stay in item_level.jsonl; their two loss terms were retired.
VARIANTS = {
    "shipped": [],
    "no-neighbours": ["train.neighbours=0", "model.identity_bits=0"],
    "itq-init": ["model.init=itq", "model.identity_bits=0"],
    # the head alone (the shipped code before the identity bits, and the shipped code at 16, 32 and
    # 128 bits), and codes whose last N bits are identity bits (ITQ of the mean word feature, fixed)
    "head-only": ["model.identity_bits=0"],
    "identity-8": ["model.identity_bits=8"],
    "identity-16": ["model.identity_bits=16"],
    "identity-24": ["model.identity_bits=24"],
    "identity-40": ["model.identity_bits=40"],
    "identity-48": ["model.identity_bits=48"],
    "identity-64": ["model.identity_bits=64"],
    # N windows of 8 words cut from each training document and encoded on their own (as a query
    # is), added to the training set with their document's label: a window's cosine neighbours,
    # its own document first of all, are its neighbour positives
    "windows-1": ["model.identity_bits=0"],
    "windows-3": ["model.identity_bits=0"],
}


def windows_of(train, val, seed: int = 0, words: int = 8, n: int = 1000):
    texts = train.texts + val.texts
    return known_item.cut_windows(texts, n, words, seed, np.arange(len(train.texts), len(texts)))


def evaluate_codes(db_train, db_val, q_val, train, val, window_codes, windows) -> dict:
    p = precision_at_k(db_train, train.labels, q_val, val.labels, 100)
    better, tied = known_item.hamming_ranks(np.concatenate([db_train, db_val]), window_codes, windows.targets)
    return {"p_tie": round(p.precision_at_k_tie_aware, 5),
            **{k: round(v, 5) for k, v in known_item.known_item_scores(better, tied).items()}}


def run_variant(name: str, bits: int, variant: str, cache_dir: str, max_epochs: int) -> dict:
    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    windows = windows_of(train, val)
    wf = encoder.features(windows.texts)
    over = parse_overrides(VARIANTS[variant])
    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size, **over["model"]},
                          train={"max_epochs": max_epochs, **over["train"]})
    t0 = time.perf_counter()
    if variant.startswith("windows-"):
        res = fit_with_windows(cfg, encoder, tr, train, int(variant.split("-")[1]))
    else:
        res = fit_carved(cfg, tr, train)
    db_train, db_val = hash_features(res.model, tr), hash_features(res.model, va)
    row = evaluate_codes(db_train, db_val, db_val, train, val, hash_features(res.model, wf), windows)
    return {**row, **two_stage(res.model, tr, va, wf, train, val, windows), **training_fields(res),
            "seconds_total": round(time.perf_counter() - t0, 1)}


def fit_with_windows(cfg, encoder, tr, train, per_document: int, words: int = 8):
    """fit_carved, its training set grown by ``per_document`` windows of each training document,
    encoded on their own and labelled as their document (the selection slice stays as it is)."""
    from dhim_ray.encoding.encoder import Features
    from dhim_ray.training.loop import carve_validation, fit

    fit_idx, sel_idx = carve_validation(len(tr), cfg.train)
    cut = known_item.cut_windows(train.texts, per_document * len(fit_idx), words, seed=1, candidates=fit_idx)
    wf, docs = encoder.features(cut.texts), tr.take(fit_idx)
    grown = Features(*(np.concatenate([getattr(docs, f), getattr(wf, f)]) for f in ("tokens", "mask", "cls", "mean")))
    labels = np.concatenate([train.labels[fit_idx], train.labels[cut.targets]])
    return fit(grown, tr.take(sel_idx), cfg, labels, train.labels[sel_idx], progress=False)


def two_stage(model, tr, va, wf, train, val, windows, k: int = 100, m: int = 4) -> dict:
    """Both tasks for the second stages a collection can hold: the top k x m Hamming candidates
    re-ranked by the query's own bit scores (no extra bytes), by the Hamming distance of a
    second, 384-bit ubinary code (+48 B a document), or by cosine of stored float16 vectors
    (+768 B). P@100 of the re-ranked list (val queries against train), known-item recall@10
    (windows against train + val)."""
    from dhim_ray.retrieval.baselines import make_baseline
    from dhim_ray.retrieval.metrics import hamming_distances, hamming_topk
    from dhim_ray.retrieval.rerank import rerank

    ub = make_baseline("ubinary", None, 0)
    ub.fit(tr.mean)
    out = {}
    for task, q_f in {"topic": va, "item": wf}.items():
        db_codes = hash_features(model, tr) if task == "topic" else np.concatenate(
            [hash_features(model, tr), hash_features(model, va)])
        db_mean = tr.mean if task == "topic" else np.concatenate([tr.mean, va.mean])
        q_codes, q_scores = score_features(model, q_f)
        cand, _ = hamming_topk(db_codes, q_codes, k * m)
        lists = {}
        order, _ = rerank(q_scores, db_codes[cand], k)
        lists["bits"] = np.take_along_axis(cand, order, axis=1)
        db_ub, q_ub = ub.hash(db_mean), ub.hash(q_f.mean)
        d = np.stack([hamming_distances(db_ub[c], q_ub[i : i + 1])[0] for i, c in enumerate(cand)])
        lists["ubinary"] = np.take_along_axis(cand, np.argsort(d, axis=1, kind="stable")[:, :k], axis=1)
        # DHIM's and the ubinary code's distances added up (each over its width)
        dh = np.stack([hamming_distances(db_codes[c], q_codes[i : i + 1])[0] for i, c in enumerate(cand)])
        mixed = dh / (8 * db_codes.shape[1]) + d / (8 * db_ub.shape[1])
        lists["mixed"] = np.take_along_axis(cand, np.argsort(mixed, axis=1, kind="stable")[:, :k], axis=1)
        unit = db_mean / np.linalg.norm(db_mean, axis=1, keepdims=True)
        q_unit = q_f.mean / np.linalg.norm(q_f.mean, axis=1, keepdims=True)
        cosine = np.einsum("ncd,nd->nc", unit[cand].astype(np.float16).astype(np.float32), q_unit)
        lists["cosine"] = np.take_along_axis(cand, np.argsort(-cosine, axis=1, kind="stable")[:, :k], axis=1)
        for how, ranked in lists.items():
            if task == "topic":
                out[f"p_{how}"] = round(float((train.labels[ranked] == val.labels[:, None]).mean()), 5)
            else:
                scores = known_item.known_item_scores(*known_item.list_ranks(ranked, windows.targets, len(db_codes)))
                out[f"recall_at_10_{how}"] = round(scores["recall_at_10"], 5)
    return out


def run_baseline(name: str, bits: int, method: str, cache_dir: str) -> dict:
    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    windows = windows_of(train, val)
    wm = encoder.features(windows.texts).mean
    if method == "cosine":
        p = _cosine_p(tr.mean, train.labels, va.mean, val.labels)
        better, tied = known_item.cosine_ranks(np.concatenate([tr.mean, va.mean]), wm, windows.targets)
        return {"p_tie": round(p, 5), "bytes_per_doc": 4 * tr.mean.shape[1],
                **{k: round(v, 5) for k, v in known_item.known_item_scores(better, tied).items()}}
    model = make_baseline(method, None if method == "ubinary" else bits, 0)
    model.fit(tr.mean)
    row = evaluate_codes(model.hash(tr.mean), model.hash(va.mean), model.hash(va.mean), train, val,
                         model.hash(wm), windows)
    return {**row, "bytes_per_doc": model.n_bits // 8, "n_bits": model.n_bits}


def _cosine_p(x, xl, q, ql) -> float:
    from dhim_ray.retrieval.metrics import cosine_precision_at_k

    return float(cosine_precision_at_k(np.asarray(x, np.float32), xl, np.asarray(q, np.float32), ql, 100))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=list(CORPORA))
    ap.add_argument("--bits", nargs="+", type=int, default=[64])
    ap.add_argument("--variants", nargs="*", default=["shipped"], choices=sorted(VARIANTS))
    ap.add_argument("--baselines", nargs="*", default=None,
                    help="itq lsh pca-sign ubinary cosine (no names: all of them)")
    ap.add_argument("--max-epochs", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    args = ap.parse_args()
    rows = read_rows(RESULTS)
    for name in args.corpora:
        for bits in args.bits:
            if args.baselines is not None:
                for method in args.baselines or ["itq", "lsh", "pca-sign", "ubinary", "cosine"]:
                    b = None if method in ("ubinary", "cosine") else bits
                    if done(rows, corpus=name, bits=b, method=method):
                        continue
                    row = {"corpus": name, "bits": b, "method": method, **run_baseline(name, bits, method,
                                                                                        args.cache_dir)}
                    print(row, flush=True)
                    append_row(RESULTS, row)
                continue
            for variant in args.variants:
                if done(rows, corpus=name, bits=bits, method=f"dhim {variant}", max_epochs=args.max_epochs):
                    continue
                row = {"corpus": name, "bits": bits, "method": f"dhim {variant}", "max_epochs": args.max_epochs,
                       **run_variant(name, bits, variant, args.cache_dir, args.max_epochs)}
                print(row, flush=True)
                append_row(RESULTS, row)


if __name__ == "__main__":
    main()
