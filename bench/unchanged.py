"""Did a refactor change what training computes? Retrain recorded quality-table cells
with the current code and compare with the figures in bench/quality.jsonl.

    python -m bench.unchanged --corpus agnews --bits 32 64 --max-epochs 8

Same protocol as bench.quality (features cached, model selection on a train slice,
seed 0); on corpora whose text is ASCII the text cleaner cannot matter, so the
figures must come back equal to the last digit. Writes bench/unchanged.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.protocol import corpus_features, load_results, train_dhim
from dhim_ray.config import config_for_bits

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="agnews")
    ap.add_argument("--bits", nargs="+", type=int, default=[32, 64])
    ap.add_argument("--max-epochs", type=int, default=8)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"),
                    help="frozen features, shared with the other benches (bench/.cache/features)")
    ap.add_argument("--out", default=str(HERE / "unchanged.json"))
    args = ap.parse_args()
    recorded = {(r["bits"]): r for r in load_results() if r["corpus"] == args.corpus and r["method"] == "dhim shipped"
                and r.get("seed") == 0 and r.get("max_epochs") == args.max_epochs}
    encoder, train, val, tr, va = corpus_features(args.corpus, args.cache_dir)
    out = []
    for bits in args.bits:
        if bits not in recorded:
            raise SystemExit(f"no recorded shipped seed-0 row for {args.corpus} {bits} bits at {args.max_epochs} epochs")
        cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size}, train={"max_epochs": args.max_epochs})
        now = train_dhim(cfg, tr, va, train, val, 100)
        row = {"corpus": args.corpus, "bits": bits, "recorded_p_tie": recorded[bits]["p_tie"], "now_p_tie": now["p_tie"],
               "recorded_best_epoch": recorded[bits]["best_epoch"], "now_best_epoch": now["best_epoch"],
               "identical": now["p_tie"] == recorded[bits]["p_tie"] and now["p"] == recorded[bits]["p"]}
        print(json.dumps(row), flush=True)
        out.append(row)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
