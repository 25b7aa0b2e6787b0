"""Model selection without labels, and asymmetric re-ranking, on the four dev corpora.

    python -m bench.selection run --corpora dbpedia agnews r8 20ng --bits 16 64
    python -m bench.selection rerank --corpora dbpedia agnews r8 --bits 32 128   # re-ranking only
    python -m bench.selection to-quality      # cells that ran the shipped schedule -> bench/quality.jsonl
    python -m bench.selection report          # prints the tables BENCHMARKS.md holds

Protocol as bench.quality: database = train.csv, queries = val.csv, tie-aware P@100;
selection (both criteria) on a slice carved out of train.csv, never val.csv. Each cell
trains the shipped configuration once for a fixed number of epochs, recording every
epoch's two selection scores on the slice (label P@100, and the label-free
cosine-neighbour recall@100) and the val P@100 of that epoch's codes. Early stopping
with patience 6 is then replayed on each score: the epoch each criterion would have
picked, and what it scores on val. Training does not depend on the criterion (same
seed, same batches), so replaying one run is exact; a criterion that would still be
waiting at the cap picks its best epoch so far, as a capped run would.

Re-ranking uses the label-picked epoch's model: val P@100 of the Hamming top-100
(tie-aware) against the top-100 of k x m Hamming candidates re-ranked by agreement
with the query's pre-threshold scores, and the q/s of both (exact search in memory).
``rerank`` measures re-ranking alone on more widths: it trains the shipped schedule
(labels pick the epoch, patience 6, cap --shipped-epochs) without the per-epoch
records, which is what makes a cell cheap. Results go to bench/selection.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from dhim_ray.config import TrainConfig, config_for_bits
from dhim_ray.retrieval.metrics import cosine_topk, hamming_topk, precision_at_k
from dhim_ray.retrieval.rerank import rerank_topk, rescore_cosine
from dhim_ray.training.schedule import EarlyStopping, TrainCallback, selection_warmup

from .protocol import (
    LONG,
    SHIPPED_EPOCHS,
    TRAINING_FIELDS,
    corpus_features,
    fit_carved,
    record_shipped_schedule,
    training_fields,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "selection.json"
RERANK_M = (2, 4, 8)
MODELS = HERE / ".cache" / "selection"  # the label-picked model of each cell (not committed)
logger = logging.getLogger("bench.selection")


class ValEachEpoch(TrainCallback):
    """After each epoch: val P@100 (tie-aware) of this epoch's codes, train.csv as the database."""

    def __init__(self, tr, va, train_labels, val_labels, k):
        self.tr, self.va, self.train_labels, self.val_labels, self.k = tr, va, train_labels, val_labels, k
        self.val_p: list[float] = []

    def on_epoch_end(self, state) -> None:
        from dhim_ray.model.inference import hash_features

        r = precision_at_k(hash_features(state.model, self.tr), self.train_labels, hash_features(state.model, self.va),
                           self.val_labels, self.k)
        self.val_p.append(r.precision_at_k_tie_aware)
        state.model.train()


def replay(values: list[float], patience: int, warmup: int = 0) -> tuple[int, int]:
    """(picked epoch, epochs a run would have taken) of the library's early stopping on ``values``."""
    stopper = EarlyStopping(patience, warmup)
    for epoch, v in enumerate(values):
        stopper.update(v, epoch)
        if stopper.should_stop:
            return stopper.best_epoch, epoch + 1
    return stopper.best_epoch, len(values)


def picks(r: dict) -> dict:
    """The epoch each criterion picks from a cell's recorded history, and its val P@100."""
    h, patience = r["history"], r["patience"]
    warmup = selection_warmup("neighbours", TrainConfig(patience=patience, max_epochs=len(h["val_p"])))
    out = {}
    criteria = [("label", h["selection_p"], 0), ("neighbour", h["neighbour_recall"], warmup),
                ("neighbour_no_warmup", h["neighbour_recall"], 0)]
    if "objective" in h:  # a loss: lower is better
        criteria.append(("objective", [-v for v in h["objective"]], 0))
    for name, values, w in criteria:
        epoch, run = replay(values, patience, w)
        out[name] = {"epoch": epoch, "epochs_run": run, "val_p": h["val_p"][epoch]}
    return out


def spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(float) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def qps(fn, n_queries: int, repeat: int = 3) -> float:
    best = min(_timed(fn) for _ in range(repeat))
    return n_queries / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_cell(name: str, bits: int, epochs: int, patience: int, k: int, cache_dir: str) -> dict:
    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size},
                          train={"max_epochs": epochs, "patience": epochs, "select": "labels"})
    cb = ValEachEpoch(tr, va, train.labels, val.labels, k)
    res = fit_carved(cfg, tr, train, callbacks=(cb,))
    sel_p = [h.val_precision for h in res.history]
    nbr = [h.val_neighbour_recall for h in res.history]
    objective = [h.val_objective for h in res.history]
    out = {"corpus": name, "bits": bits, "epochs": epochs, "patience": patience,
           "spearman_neighbour_vs_val_p": spearman(nbr, cb.val_p),
           "spearman_objective_vs_val_p": spearman([-v for v in objective], cb.val_p),
           "spearman_label_selection_vs_val_p": spearman(sel_p, cb.val_p),
           "history": {"selection_p": sel_p, "neighbour_recall": nbr, "objective": objective, "val_p": cb.val_p},
           "epoch_seconds": round(float(np.mean([h.seconds for h in res.history])), 2)}
    # re-ranking, with the model of the label-picked epoch (the best by selection P@100 over the whole run)
    out.update(measure_rerank(res.model, train, val, tr, va, bits, k))
    from dhim_ray.model.checkpoint import save_checkpoint

    MODELS.mkdir(parents=True, exist_ok=True)
    save_checkpoint(MODELS / f"{name}-{bits}", res.model, res.config, encoder.fingerprint, {"bench": "selection"})
    logger.info("%s %d bits: %s, rho %.2f; rerank %s", name, bits, picks(out), out["spearman_neighbour_vs_val_p"],
                {m: round(v["p"], 4) for m, v in out["rerank"].items()})
    return out


def rerank_cell(name: str, bits: int, epochs: int, patience: int, k: int, cache_dir: str) -> dict:
    """Re-ranking only: the shipped schedule (labels pick the epoch, early stopping), then measure_rerank."""
    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size},
                          train={"max_epochs": epochs, "patience": patience, "select": "labels"})
    res = fit_carved(cfg, tr, train)
    out = {"corpus": name, "bits": bits, "epochs": epochs, "patience": patience, **training_fields(res),
           **measure_rerank(res.model, train, val, tr, va, bits, k)}
    _record_rerank_cell(out, cfg.train.seed)
    logger.info("%s %d bits (re-ranking only, best epoch %d of %d): %s", name, bits, res.best_epoch,
                len(res.history), {m: round(v["p"], 4) for m, v in out["rerank"].items()})
    return out


def measure_rerank(model, train, val, tr, va, bits: int, k: int) -> dict:
    """Hamming top-k against bit re-ranking and float re-scoring of k x m candidates: P@k, recall of
    the float cosine top-k, q/s (exact search in memory, best of 3)."""
    from dhim_ray.model.inference import hash_features, score_features

    out: dict = {}
    db = hash_features(model, tr)
    q_codes, q_scores = score_features(model, va)
    plain = precision_at_k(db, train.labels, q_codes, val.labels, k)
    qps_plain = qps(lambda: hamming_topk(db, q_codes, k), len(q_codes))
    cos_top = cosine_topk(tr.mean, va.mean, k)  # what float cosine kNN returns: the recall reference
    # unit-norm float16, as a float16 vector field keeps them (held as float32 here for the arithmetic)
    db_vec = (tr.mean / np.linalg.norm(tr.mean, axis=1, keepdims=True)).astype(np.float16).astype(np.float32)
    plain_idx, _ = hamming_topk(db, q_codes, k)
    out["rerank"] = {"1": {"p": plain.precision_at_k, "p_tie": plain.precision_at_k_tie_aware, "qps": qps_plain,
                           "cosine_recall": recall(plain_idx, cos_top)}}
    out["float"] = {"cosine_knn_p": float((train.labels[cos_top] == val.labels[:, None]).mean()),
                    "bytes_per_doc_codes": bits // 8, "bytes_per_doc_float16": int(db_vec.shape[1] * 2)}
    for m in RERANK_M:
        idx, _ = rerank_topk(db, q_codes, q_scores, k, m)
        out["rerank"][str(m)] = {"p": float((train.labels[idx] == val.labels[:, None]).mean()),
                                 "cosine_recall": recall(idx, cos_top),
                                 "qps": qps(lambda m=m: rerank_topk(db, q_codes, q_scores, k, m), len(q_codes))}
        fidx = float_rescore(db, db_vec, q_codes, va.mean, k, m)
        out["float"][str(m)] = {"p": float((train.labels[fidx] == val.labels[:, None]).mean()),
                                "cosine_recall": recall(fidx, cos_top),
                                "qps": qps(lambda m=m: float_rescore(db, db_vec, q_codes, va.mean, k, m),
                                           len(q_codes))}
    return out


def recall(found: np.ndarray, reference: np.ndarray) -> float:
    """Share of each row of ``reference`` (the float cosine top-k) that ``found`` holds."""
    return float(np.mean([len(np.intersect1d(f, r)) / len(r) for f, r in zip(found, reference)]))


def float_rescore(db_codes, db_vectors, q_codes, q_vectors, k: int, m: int) -> np.ndarray:
    """k x m Hamming candidates re-scored by cosine against the query's float vector
    (database vectors unit-norm, rounded to float16)."""
    cand, _ = hamming_topk(db_codes, q_codes, k * m)
    order, _ = rescore_cosine(q_vectors, db_vectors[cand], k)
    return np.take_along_axis(cand, order, axis=1)


def _epoch(r: dict) -> str:
    """The re-ranked model's epoch: from the selection history, or the shipped schedule's run."""
    if "history" in r:  # run_cell re-ranks the best epoch by selection P@100 over the whole capped run
        sel = r["history"]["selection_p"]
        return f"{int(np.argmax(sel))} of {len(sel)} (cap {r['epochs']}, no early stop)"
    return f"{r['best_epoch']} of {r['epochs_run']} (cap {r['epochs']}, patience {r['patience']})"


def _record_rerank_cell(r: dict, seed: int = 0) -> None:
    """A re-ranking cell is the shipped schedule when its cap is the shipped one, or when early
    stopping fired before a lower cap (the run is then the same): its plain search goes into the
    quality table as a shipped-schedule row."""
    stopped = r["epochs_run"] < r["epochs"]
    plain = r["rerank"]["1"]
    record_shipped_schedule(r["corpus"], r["bits"], seed, SHIPPED_EPOCHS if stopped else r["epochs"], r["patience"], {
        "p": plain["p"], "p_tie": plain["p_tie"], **{f: r.get(f) for f in TRAINING_FIELDS}})


def to_quality() -> None:
    """Cells whose label-selection replay stopped before the cap ran exactly the shipped schedule
    (same seed, same batches; training does not depend on when it would stop): their picked epoch's
    val P@100 goes into the quality table. The db-order P@100 was not recorded there, so it stays blank."""
    for r in load().values():
        if "history" not in r:
            _record_rerank_cell(r)  # a no-op for cells already recorded
            continue
        lab = picks(r)["label"]
        if lab["epoch"] + r["patience"] >= len(r["history"]["val_p"]):
            continue  # early stopping had not fired by the cap: not the shipped schedule
        record_shipped_schedule(r["corpus"], r["bits"], 0, SHIPPED_EPOCHS, r["patience"], {
            "p": None, "p_tie": lab["val_p"], "seconds": round(r["epoch_seconds"] * lab["epochs_run"], 1),
            "best_epoch": lab["epoch"], "epochs_run": lab["epochs_run"], "epoch_seconds": r["epoch_seconds"]})


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _order(rows: dict) -> list[dict]:
    corpora = ("dbpedia", "agnews", "r8", "20ng")
    return sorted(rows.values(), key=lambda r: (corpora.index(r["corpus"]) if r["corpus"] in corpora else 9, r["bits"]))


def report() -> str:
    rows = load()
    lines = ["| corpus | bits | epochs run | label-picked epoch: val P@100 | neighbour-picked epoch: val P@100 | "
             "difference | without the warm-up | Spearman rho (neighbour recall vs val P@100) | "
             "rho (label selection P vs val P@100) | objective-picked epoch: val P@100 (difference) | "
             "rho (held-out objective vs val P@100) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in _order(rows):
        if "history" not in r:  # a re-ranking-only cell (`rerank`)
            continue
        pk = picks(r)
        lab, nbr, raw = pk["label"], pk["neighbour"], pk["neighbour_no_warmup"]
        obj = pk.get("objective")
        obj_cells = (f"{obj['epoch']}: {obj['val_p']:.4f} ({100 * (obj['val_p'] - lab['val_p']):+.2f} pt) | "
                     f"{r['spearman_objective_vs_val_p']:.2f}" if obj else "not run | -")
        lines.append(f"| {r['corpus']} | {r['bits']} | {lab['epochs_run']} / {nbr['epochs_run']} (cap "
                     f"{len(r['history']['val_p'])}) | {lab['epoch']}: {lab['val_p']:.4f} | {nbr['epoch']}: "
                     f"{nbr['val_p']:.4f} | {100 * (nbr['val_p'] - lab['val_p']):+.2f} pt | {raw['epoch']}: "
                     f"{100 * (raw['val_p'] - lab['val_p']):+.2f} pt | {r['spearman_neighbour_vs_val_p']:.2f} | "
                     f"{r['spearman_label_selection_vs_val_p']:.2f} | {obj_cells} |")
    lines += ["", "| corpus | bits | epoch (label-picked) | Hamming top-100 (tie-aware) | "
              + " | ".join(f"re-rank x{m}" for m in RERANK_M)
              + " | q/s re-rank x4 vs Hamming |", "|---|---|---|---|" + "---|" * len(RERANK_M) + "---|"]
    for r in _order(rows):
        rr = r["rerank"]
        cells = " | ".join(f"{rr[str(m)]['p']:.4f} ({100 * (rr[str(m)]['p'] - rr['1']['p_tie']):+.2f})"
                           for m in RERANK_M)
        lines.append(f"| {r['corpus']} | {r['bits']} | {_epoch(r)} | {rr['1']['p_tie']:.4f} | {cells} | "
                     f"{rr['4']['qps'] / rr['1']['qps']:.2f}x |")
    lines += ["", "| corpus | bits | codes alone: P@100 (tie-aware) / recall of cosine top-100 | "
              "bit re-rank x4 | float re-score x2 | float re-score x4 | float re-score x8 | float cosine kNN P@100 | "
              "q/s float x4 vs Hamming | bytes/doc: codes, + float16 vector |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in _order(rows):
        if "float" not in r:
            continue
        rr, fl = r["rerank"], r["float"]

        def pr(x):
            return f"{x['p']:.4f} / {x['cosine_recall']:.3f}"

        lines.append(f"| {r['corpus']} | {r['bits']} | {rr['1']['p_tie']:.4f} / {rr['1']['cosine_recall']:.3f} | "
                     f"{pr(rr['4'])} | {pr(fl['2'])} | {pr(fl['4'])} | {pr(fl['8'])} | {fl['cosine_knn_p']:.4f} | "
                     f"{fl['4']['qps'] / rr['1']['qps']:.2f}x | {fl['bytes_per_doc_codes']}, "
                     f"{fl['bytes_per_doc_codes'] + fl['bytes_per_doc_float16']} |")
    return "\n".join(lines)


def main() -> None:  # noqa: C901
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "rerank", "to-quality", "report"))
    ap.add_argument("--corpora", nargs="+", default=["dbpedia", "agnews", "r8", "20ng"])
    ap.add_argument("--bits", nargs="+", type=int, default=[16, 64])
    ap.add_argument("--epochs", type=int, default=30, help="epochs per cell (short corpora)")
    ap.add_argument("--long-epochs", type=int, default=20, help="epochs per cell on 20ng and r8")
    ap.add_argument("--patience", type=int, default=6)
    ap.add_argument("--shipped-epochs", type=int, default=100, help="rerank: the epoch cap of the shipped schedule")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    ap.add_argument("--results", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.results:
        global RESULTS
        RESULTS = Path(args.results)
    if args.command == "report":
        print(report())
        return
    if args.command == "to-quality":
        to_quality()
        return
    for name in args.corpora:
        for bits in args.bits:
            key = f"{name}-{bits}"
            row = load().get(key, {})
            if "objective" in row.get("history", {}) or (args.command == "rerank" and "rerank" in row):
                continue
            epochs = args.long_epochs if name in LONG else args.epochs
            if args.command == "rerank":
                row = rerank_cell(name, bits, args.shipped_epochs, args.patience, args.k, args.cache_dir)
            else:
                row = run_cell(name, bits, epochs, args.patience, args.k, args.cache_dir)
            results = load()
            results[key] = row
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
