"""Does the int8 encoder keep quality? For each dev corpus, the shipped 64-bit DHIM schedule
(bench/protocol.py: model selection on a slice of train, never val) trained on fp32 features,
then evaluated on fp32 and on dynamic-int8 features (ONNX Runtime), and trained on int8
features and evaluated on them: tie-aware P@100 (val against train) and known-item recall@10
(1,000 8-word windows of val documents against train + val), with the share of code bits
int8 changes for the fp32-trained head.

    python -m bench.int8_quality --corpora dbpedia agnews r8 20ng

Rows accumulate in bench/int8_quality.jsonl (a rerun skips what is there).
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.harness import HERE, append_row, read_rows
from bench.item_level import evaluate_codes, windows_of
from bench.protocol import LONG, corpus_features, done, fit_carved, training_fields
from dhim_ray.config import FeatureConfig, config_for_bits
from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.model.inference import hash_features

RESULTS = HERE / "int8_quality.jsonl"
CORPORA = ("dbpedia", "agnews", "r8", "20ng")


def run(name: str, cache_dir: str, bits: int = 64) -> list[dict]:
    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    int8 = FrozenEncoder(FeatureConfig(max_words=400 if name in LONG else 50, precision="int8"))
    tr8 = int8.features(train.texts, progress=True, cache_dir=cache_dir)
    va8 = int8.features(val.texts, progress=True, cache_dir=cache_dir)
    windows = windows_of(train, val)
    wf, wf8 = encoder.encode(windows.texts), int8.encode(windows.texts)
    cfg = config_for_bits(bits, model={"hidden_size": encoder.hidden_size})
    rows = []

    def score(model, t, v, w) -> dict:
        db_train, db_val = hash_features(model, t), hash_features(model, v)
        return evaluate_codes(db_train, db_val, db_val, train, val, hash_features(model, w), windows)

    res = fit_carved(cfg, tr, train)
    flipped = float(np.mean(np.unpackbits(hash_features(res.model, tr)) != np.unpackbits(hash_features(res.model, tr8))))
    rows.append({"corpus": name, "bits": bits, "trained_on": "fp32", "hashed_on": "fp32",
                 **score(res.model, tr, va, wf), **training_fields(res)})
    rows.append({"corpus": name, "bits": bits, "trained_on": "fp32", "hashed_on": "int8",
                 "bits_changed": round(flipped, 5), **score(res.model, tr8, va8, wf8)})
    res8 = fit_carved(cfg, tr8, train)
    rows.append({"corpus": name, "bits": bits, "trained_on": "int8", "hashed_on": "int8",
                 **score(res8.model, tr8, va8, wf8), **training_fields(res8)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=CORPORA)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    args = ap.parse_args()
    for name in args.corpora:
        if done(read_rows(RESULTS), corpus=name, trained_on="int8"):
            continue
        for row in run(name, args.cache_dir):
            append_row(RESULTS, row)


if __name__ == "__main__":
    main()
