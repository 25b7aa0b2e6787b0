"""Would the validation slice pick the better regulariser target? (issue 16, 16 bits)

    python -m bench.target_choice --cells agnews:1 r8:3 20ng:2
    python -m bench.target_choice --label-free --cells agnews:1 r8:3 20ng:2

The whitened regulariser target wins every 20ng seed at 16 bits and loses on agnews, with
r8 split (bench.representations). An "auto" target would train both and keep the one whose
best epoch scores higher on the carved selection slice (labels there, as model selection
does). This bench retrains, for each corpus:seed, the shipped model and the whitened-target
one on the shipped schedule (the same configuration, seed and carving as
bench.representations, whose val P@100 each run must reproduce) and records the slice
score of the epoch each kept. The cells default to those where the two targets differ by
2.4 points or more. With --label-free the slice's labels are hidden: each run picks its
epoch by cosine-neighbour recall, and auto compares that score, as `dhim-ray train
--target-transform auto` does on a corpus without labels (keys end in ':label-free'; val
P@100 still uses val.csv's labels). Results in bench/target_choice.json.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from bench.protocol import corpus_features, fit_carved
from bench.representations import VARIANTS, load_rows
from dhim_ray.config import config_for_bits
from dhim_ray.model.inference import hash_features
from dhim_ray.retrieval.metrics import precision_at_k

HERE = Path(__file__).resolve().parent
OUT = HERE / "target_choice.json"
BITS = 16
logger = logging.getLogger("bench.target_choice")


def run(name: str, seed: int, variant: str, enc, train, val, tr, va, labelled: bool = True) -> dict:
    cfg = config_for_bits(BITS, model={"hidden_size": enc.hidden_size, **VARIANTS[variant].get("model", {})},
                          train={"max_epochs": 100, "seed": seed})
    res = fit_carved(cfg, tr, train, labelled=labelled)
    chosen = next(h for h in res.history if h.epoch == res.best_epoch)
    p = precision_at_k(hash_features(res.model, tr), train.labels, hash_features(res.model, va), val.labels, 100)
    stored = [r["p_tie"] for r in load_rows() if r.get("kind") == "dhim" and r["corpus"] == name
              and r["bits"] == BITS and r["variant"] == variant and r.get("seed", 0) == seed
              and r["max_epochs"] == 100]
    return {"slice_p": chosen.val_precision, "slice_neighbour_recall": chosen.val_neighbour_recall,
            "criterion": res.criterion, "val_p": p.precision_at_k_tie_aware, "best_epoch": res.best_epoch,
            "epochs_run": len(res.history), "stored_val_p": stored[0] if stored and labelled else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=["agnews:1", "r8:3", "20ng:2"], help="CORPUS:SEED")
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--label-free", action="store_true", help="hide the slice's labels (neighbour criterion)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for cell in args.cells:
        name, seed = cell.split(":")
        enc, train, val, tr, va = corpus_features(name, args.cache_dir)
        for variant in ("shipped", "whitening target"):
            key = f"{name}:{seed}:{variant}" + (":label-free" if args.label_free else "")
            if key in results:
                continue
            results[key] = run(name, int(seed), variant, enc, train, val, tr, va, labelled=not args.label_free)
            logger.info("%s: %s", key, results[key])
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
