"""What `dhim-ray eval` reports without labels, against what labels say, on the dev corpora.

    python -m bench.label_free_eval --corpora dbpedia agnews --bits 64

Most corpora have no labels; `dhim-ray eval` then scores cosine-neighbour recall@100: the
share of each query's 100 nearest database documents by cosine of the frozen encoder's
mean-pooled vectors that a method's 100 nearest codes recover (tie-aware). For each corpus
this bench trains the shipped model (`dhim-ray train`, shipped schedule, in a temporary
folder), then runs `dhim-ray eval` twice per method, database = train.csv, queries =
val.csv: once as the corpus is (tie-aware P@100 by labels), once on copies of its texts
without labels (neighbour recall). Methods: DHIM, ITQ, LSH, float cosine kNN. Results in
bench/label_free_eval.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "data"
OUT = HERE / "label_free_eval.json"
logger = logging.getLogger("bench.label_free_eval")


def cli(*args: str) -> dict:
    """One dhim-ray command with --json; its last stdout line parsed."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "-q", *args, "--json"], capture_output=True,
                         text=True, env=env, timeout=7200)
    if run.returncode:
        raise SystemExit(f"dhim-ray {args[0]} failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def without_labels(corpus: Path, folder: Path) -> Path:
    """train.jsonl and val.jsonl of the corpus' texts alone."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        with open(corpus / f"{split}.csv", newline="", encoding="utf-8") as f, \
                open(folder / f"{split}.jsonl", "w", encoding="utf-8") as out:
            for _label, text in csv.reader(f):
                out.write(json.dumps({"text": text}) + "\n")
    return folder


def run_corpus(name: str, bits: int, cache: str, tmp: Path) -> dict:
    corpus = SHARED / name
    if not corpus.exists():
        raise SystemExit(f"{corpus}: not found; this bench reads the dev corpora in ../shared/data")
    plain = without_labels(corpus, tmp / f"{name}-texts")
    model = tmp / f"{name}-{bits}"
    words = ["--max-words", "400"] if name in ("r8", "20ng") else []
    summary = cli("train", str(corpus), "--bits", str(bits), "--out", str(model), "--cache-dir", cache, *words)
    logger.info("%s: trained, best epoch %s", name, summary["best_epoch"])
    methods = {"dhim": [str(model)], "itq": ["--baseline", "itq", "--bits", str(bits), *words],
               "lsh": ["--baseline", "lsh", "--bits", str(bits), *words], "cosine": ["--baseline", "cosine", *words]}
    out = {"bits": bits, "best_epoch": summary["best_epoch"], "methods": {}}
    for method, args in methods.items():
        labelled = cli("eval", *args, "--database", f"{corpus}:train", "--queries", f"{corpus}:val",
                       "--cache-dir", cache)
        free = cli("eval", *args, "--database", str(plain), "--queries", f"{plain}:val", "--cache-dir", cache)
        out["methods"][method] = {"precision_at_100": labelled["precision_at_k_tie_aware"],
                                  "neighbour_recall_at_100": free["neighbour_recall_at_k"],
                                  "bytes_per_doc": labelled.get("bytes_per_doc", bits // 8)}
        logger.info("%s %s: %s", name, method, out["methods"][method])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", nargs="+", default=["dbpedia", "agnews"])
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "cli"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["command"] = "python -m bench.label_free_eval --corpora dbpedia agnews --bits 64"
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.corpora:
            results.setdefault("corpora", {})[name] = run_corpus(name, args.bits, args.cache_dir, Path(tmp))
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
