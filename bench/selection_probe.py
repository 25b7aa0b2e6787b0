"""Other label-free selection signals, tried on the cells where the shipped one misses.

    python -m bench.selection_probe --corpora agnews dbpedia --bits 64 --epochs 30 --intrinsic
    OMP_NUM_THREADS=1 python -m bench.selection_probe --corpora agnews dbpedia --bits 64 --epochs 30 \
        --objective-terms --out bench/selection_probe_terms.json   # each corpus in its own process
    python -m bench.selection_probe --corpora agnews --bits 64 --epochs 20 --set train.neighbours=0 \
        --out bench/selection_probe_neighbours.json   # then =30 and =100 with OMP_NUM_THREADS=1
    OMP_NUM_THREADS=1 python -m bench.selection_probe --corpora agnews --bits 64 --epochs 30 --lexical \
        --out bench/selection_probe_lexical.json
    OMP_NUM_THREADS=1 python -m bench.selection_probe --corpora agnews --bits 64 --epochs 20 \
        --set train.lr=3e-4 --out bench/selection_probe_training.json   # beside it: --set train.beta=1.0
    python -m bench.selection_probe --report
    python -m bench.selection_probe --gain-rule

Issue 15's label-free criterion (tie-aware recall of each val document's cosine top-100
among its Hamming top-100) picks within 1 point of the label-picked epoch on 6 of the 8
cells of bench.selection, and misses dbpedia and agnews at 64 bits, where it keeps rising
while label precision has peaked. This probe trains the same cell (the shipped
configuration, the same carved selection slice, labels picking nothing) and records per
epoch, on the selection slice:

- neighbour recall at k = 10, 100 and 1000 (k = 1000: the coarse structure of a
  4,000-document sample, not the fine one);
- pseudo-label P@100: tie-aware P@100 with labels from spherical k-means (C = 4, 16, 64
  clusters, faiss) of the frozen encoder's mean vectors of the selection database: a
  label-free stand-in for topical labels at three granularities;
- signals of the codes alone, no encoder geometry (`--intrinsic`): relative contrast (mean
  Hamming distance to the whole sample over mean distance to the 100 nearest), the share of
  the codes' variance that k-means with C = 4 and 16 clusters explains, bit independence
  (1 - mean |correlation| between bits), reciprocal 10-NN share among the sample's codes,
  and the mean confidence of the slice's bits (mean |2 sigmoid(logit / alpha) - 1|);
- the held-out objective's terms on the slice (`--objective-terms`): the loss, the local MI
  term and the regulariser's, each with the neighbour positives training uses and with a
  document's own codes as its only positive;
- recall of each slice document's TF-IDF cosine neighbours at k = 10 and 100 (`--lexical`;
  a view of the documents the frozen encoder does not shape);
- the slice's label P@100 and the val split's P@100 (what the criteria are judged on).

`--gain-rule` replays, on bench.selection's recorded cells, a retrospective rule: keep the
earliest epoch whose neighbour recall has made a share f of the run's whole gain over
epoch 0 (a knee of the recall curve), for f from 0.5 to 0.95.

For each signal: the epoch its maximum picks (from epoch 0, and after the shipped
6-epoch warm-up), that epoch's val P@100 against the best epoch's, and the signal's
Spearman correlation with val P@100 across epochs. Results: bench/selection_probe.json, or
the --out given (a cell per corpus, width and --set).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from bench.protocol import corpus_features, fit_carved
from dhim_ray.config import config_for_bits
from dhim_ray.model.inference import hash_features
from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k, precision_at_k
from dhim_ray.training.loop import carve_validation, selection_database
from dhim_ray.training.schedule import TrainCallback

logger = logging.getLogger("bench.selection_probe")
HERE = Path(__file__).resolve().parent
OUT = HERE / "selection_probe.json"
RECALL_KS = (10, 100, 1000)
CLUSTERS = (4, 16, 64)
WARMUPS = (0, 6)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def pseudo_labels(db_vectors: np.ndarray, q_vectors: np.ndarray, clusters: int, seed: int = 0):
    """(database, query) cluster ids of spherical k-means fitted on the database vectors."""
    import faiss

    db, q = _unit(db_vectors), _unit(q_vectors)
    km = faiss.Kmeans(db.shape[1], clusters, niter=25, seed=seed, spherical=True)
    km.train(db)
    return km.index.search(db, 1)[1][:, 0], km.index.search(q, 1)[1][:, 0]


def unpack(codes: np.ndarray) -> np.ndarray:
    """Packed uint8 codes as +-1 float32 (n, bits)."""
    return np.unpackbits(codes, axis=1).astype(np.float32) * 2 - 1


def intrinsic_signals(db_codes: np.ndarray, q_codes: np.ndarray, q_scores: np.ndarray, k: int = 100,
                      seed: int = 0) -> dict[str, float]:
    """Label-free and encoder-free scores of one epoch's codes (see the module docstring)."""
    import faiss

    from dhim_ray.retrieval.metrics import hamming_distances

    db, bits = unpack(db_codes), db_codes.shape[1] * 8
    out = {}
    d = hamming_distances(db_codes, q_codes).astype(np.float32)
    nearest = np.sort(d, axis=1)[:, :k]
    out["code relative contrast"] = float(d.mean() / max(nearest.mean(), 1e-6))
    total = float(((db - db.mean(0)) ** 2).sum())
    for c in (4, 16):
        km = faiss.Kmeans(bits, c, niter=25, seed=seed)
        km.train(db)
        inertia = float(km.index.search(db, 1)[0].sum())
        out[f"code k-means explained C={c}"] = 1.0 - inertia / max(total, 1e-9)
    corr = np.corrcoef(db.T)
    corr = np.nan_to_num(corr, nan=1.0)
    out["bit independence"] = float(1.0 - np.abs(corr[~np.eye(bits, dtype=bool)]).mean())
    dd = hamming_distances(db_codes, db_codes).astype(np.float32)
    np.fill_diagonal(dd, np.inf)
    order = np.argsort(dd + np.arange(len(dd))[None, :] * 1e-6, axis=1, kind="stable")[:, :10]
    member = np.zeros(dd.shape, dtype=bool)
    np.put_along_axis(member, order, True, axis=1)
    out["reciprocal 10-NN"] = float((member & member.T).sum() / member.sum())
    out["bit confidence"] = float(np.abs(q_scores).mean())
    return out


def tfidf_topk(db_texts, q_texts, k: int) -> np.ndarray:
    """Each query's k nearest database documents by cosine of sublinear TF-IDF vectors
    (vocabulary and idf fitted on the database): (n_queries, k) indices."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(sublinear_tf=True, min_df=2, stop_words="english")
    db = vec.fit_transform(list(db_texts))
    sims = (vec.transform(list(q_texts)) @ db.T).toarray()
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


class Probe(TrainCallback):
    def __init__(self, db, q, db_labels, q_labels, tr, va, va_labels, train_labels, k=100, intrinsic=False,
                 objective_terms=False, lexical=None):
        self.intrinsic, self.objective_terms, self.pairs = intrinsic, objective_terms, None
        # (database texts, query texts): neighbours by TF-IDF cosine, a view of the documents
        # independent of the frozen encoder
        self.lexical = None if lexical is None else tfidf_topk(*lexical, max(RECALL_KS[:2]))
        self.db, self.q, self.tr, self.va = db, q, tr, va
        self.db_labels, self.q_labels, self.va_labels, self.train_labels = db_labels, q_labels, va_labels, train_labels
        self.k = k
        self.neighbours = cosine_topk(db.mean, q.mean, max(RECALL_KS))
        self.pseudo = {c: pseudo_labels(db.mean, q.mean, c) for c in CLUSTERS}
        self.rows: list[dict] = []

    def on_epoch_end(self, state) -> None:
        model = state.model
        dbc, qc = hash_features(model, self.db), hash_features(model, self.q)
        row = {f"recall@{k}": neighbour_recall_at_k(dbc, qc, self.neighbours, k).recall_at_k for k in RECALL_KS}
        for c, (a, b) in self.pseudo.items():
            row[f"pseudo P@100 C={c}"] = precision_at_k(dbc, a, qc, b, self.k).precision_at_k_tie_aware
        if self.intrinsic:
            from dhim_ray.model.inference import score_features

            row.update(intrinsic_signals(dbc, qc, score_features(model, self.q)[1], self.k))
        if self.objective_terms:
            row.update(self.terms(state))
        if self.lexical is not None:
            for k in RECALL_KS[:2]:
                row[f"tf-idf recall@{k}"] = neighbour_recall_at_k(dbc, qc, self.lexical, k).recall_at_k
        row["slice label P@100"] = precision_at_k(dbc, self.db_labels, qc, self.q_labels, self.k).precision_at_k_tie_aware
        row["val P@100"] = precision_at_k(hash_features(model, self.tr), self.train_labels,
                                          hash_features(model, self.va), self.va_labels, self.k).precision_at_k_tie_aware
        model.train()
        self.rows.append(row)
        logger.info("epoch %d: %s", len(self.rows) - 1, {k: round(v, 4) for k, v in row.items()})


    def terms(self, state) -> dict[str, float]:
        """The held-out objective's terms on the slice, with the neighbour positives training
        uses and with a document's own codes as its only positive (higher is better)."""
        import torch

        from dhim_ray.training.loop import held_out_outputs, neighbour_table, neighbour_vectors

        cfg = state.config
        if self.pairs is None:
            self.pairs = neighbour_table(neighbour_vectors(self.q, state.model), cfg.train.neighbours)
        row = {}
        for name, pairs in (("pairs", self.pairs), ("own", None)):
            sums, n = {"-loss": 0.0, "mi_local": 0.0, "mi_reg": 0.0}, 0
            for out, size in held_out_outputs(state.model, self.q, cfg, torch.device("cpu"), pairs):
                sums["-loss"] -= out.loss.item() * size
                sums["mi_local"] += out.mi_local.item() * size
                sums["mi_reg"] += out.mi_regulariser.item() * size
                n += size
            row.update({f"held-out {key} ({name})": v / n for key, v in sums.items()})
        return row


def run_cell(corpus: str, bits: int, epochs: int, cache: str, intrinsic: bool = False,
             objective_terms: bool = False, lexical: bool = False, overrides: list[str] = ()) -> dict:
    from dhim_ray.config import parse_overrides

    encoder, train, val, tr, va = corpus_features(corpus, cache)
    over = parse_overrides(list(overrides))
    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size, **over["model"]},
                          train={**over["train"], "max_epochs": epochs, "patience": epochs, "select": "labels"})
    fit_idx, sel_idx = carve_validation(len(tr), cfg.train)
    db_idx = fit_idx[selection_database(len(fit_idx), cfg.train)]
    probe = Probe(tr.take(db_idx), tr.take(sel_idx), train.labels[db_idx], train.labels[sel_idx],
                  tr, va, val.labels, train.labels, intrinsic=intrinsic, objective_terms=objective_terms,
                  lexical=([train.texts[i] for i in db_idx], [train.texts[i] for i in sel_idx]) if lexical else None)
    fit_carved(cfg, tr, train, callbacks=(probe,))
    return {"corpus": corpus, "bits": bits, "epochs": epochs, "set": list(overrides), "history": probe.rows}


def summarise(cell: dict) -> list[dict]:
    from scipy.stats import spearmanr

    rows = cell["history"]
    val = np.array([r["val P@100"] for r in rows])
    best = float(val.max())
    out = []
    for key in rows[0]:
        if key == "val P@100":
            continue
        signal = np.array([r[key] for r in rows])
        picks = {}
        for warm in WARMUPS:
            epoch = warm + int(signal[warm:].argmax())
            picks[warm] = (epoch, float(val[epoch]) - best)
        out.append({"signal": key, "picks": picks, "spearman": float(spearmanr(signal, val).statistic)})
    return out


def report(cells: dict) -> str:
    lines = []
    for name, cell in cells.items():
        rows = cell["history"]
        val = [r["val P@100"] for r in rows]
        best = int(np.argmax(val))
        lines += [f"{name}: {cell['epochs']} epochs, best val P@100 {val[best]:.4f} at epoch {best}", "",
                  "| signal | picks (from epoch 0) | vs best | picks (after warm-up 6) | vs best | Spearman vs val P@100 |",
                  "|---|---|---|---|---|---|"]
        for s in summarise(cell):
            (e0, d0), (e6, d6) = s["picks"][0], s["picks"][6]
            lines.append(f"| {s['signal']} | {e0} | {100 * d0:+.2f} pt | {e6} | {100 * d6:+.2f} pt | {s['spearman']:+.3f} |")
        lines.append("")
    return "\n".join(lines)


def gain_rule_report(selection: Path, shares=(0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)) -> str:
    """For each share f: per cell of bench.selection, the earliest epoch whose neighbour
    recall reaches r0 + f (r_max - r0), and its val P@100 against the label-picked epoch's
    (bench.selection's replay of early stopping, as its table has it)."""
    from bench.selection import picks

    cells = {name: cell for name, cell in json.loads(selection.read_text()).items() if "history" in cell}
    label_val = {name: picks(cell)["label"]["val_p"] for name, cell in cells.items()}
    lines = ["| f | " + " | ".join(cells) + " | cells within 1 pt |", "|---" * (len(cells) + 2) + "|"]
    for f in shares:
        row, ok = [], 0
        for name, cell in cells.items():
            recall, val = np.array(cell["history"]["neighbour_recall"]), np.array(cell["history"]["val_p"])
            picked = int(np.argmax(recall >= recall[0] + f * (recall.max() - recall[0])))
            diff = 100 * (val[picked] - label_val[name])
            ok += diff >= -1
            row.append(f"{picked}: {diff:+.2f}")
        lines.append(f"| {f} | " + " | ".join(row) + f" | {ok} of {len(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", default=["agnews", "dbpedia"])
    parser.add_argument("--bits", nargs="+", type=int, default=[64])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--intrinsic", action="store_true", help="also record the codes' own signals")
    parser.add_argument("--objective-terms", action="store_true",
                        help="also record the held-out objective's terms, with and without neighbour positives")
    parser.add_argument("--lexical", action="store_true",
                        help="also record recall of each slice document's TF-IDF cosine neighbours")
    parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                        help="train another configuration than the shipped one, e.g. train.neighbours=0")
    parser.add_argument("--gain-rule", action="store_true",
                        help="print the recall-knee rule's picks on bench/selection.json and exit")
    parser.add_argument("--report", action="store_true", help="print the tables of --out and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.gain_rule:
        print(gain_rule_report(HERE / "selection.json"))
        return
    cells = json.loads(args.out.read_text()) if args.out.exists() else {}
    if not args.report:
        for corpus in args.corpora:
            for bits in args.bits:
                name = " ".join([f"{corpus}-{bits}", *args.set])  # a cell per configuration
                cells[name] = run_cell(corpus, bits, args.epochs, args.cache_dir, args.intrinsic,
                                       args.objective_terms, args.lexical, args.set)
                args.out.write_text(json.dumps(cells, indent=1))
    print(report(cells))


if __name__ == "__main__":
    main()
