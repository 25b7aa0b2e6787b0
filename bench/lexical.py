"""BM25 through the two text stores, on the dev corpora: tantivy beside the milvus-lite
file (the default since it holds its rate past a million rows) against milvus-lite's own BM25
function (a 2.5+ server's path, the default before). The same rows in both, the same three
query sets as bench/hybrid.py (topic: val documents against train; short: their first 8
words; known-item: 1,000 windows of 8 words), the text list alone: the hybrid search fuses
this list with the codes' list, which neither store changes.

Per corpus and store: P@10 / P@100 (topic), P@100 (short), known-item recall@1/10/100, and
the two stores' agreement (the share of each query's top 10 found by both), with seconds per
query of each.

    python -m bench lexical --corpora dbpedia agnews r8 20ng

Results go to bench/lexical.json (one entry per corpus, replaced on a rerun).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA, HERE
from bench.hybrid import CORPORA, DEPTH, exact_bound, precision, recall
from dhim_ray.connectors.milvus import CodeCollection, MilvusTarget
from dhim_ray.connectors.rows import code_rows, document_ids
from dhim_ray.corpus.data import load_corpus
from dhim_ray.retrieval import known_item

RESULTS = HERE / "lexical.json"
STORES = ("file", "milvus")


@contextlib.contextmanager
def opened(target: MilvusTarget, store: str, create: bool = True):
    """The target's collection; for the "milvus" store, bound as a server's (Milvus' BM25, no file)."""
    with target.open(create) as collection:
        yield collection if store == "file" else CodeCollection(collection.client, target.collection, target.timeout)


def build(db: Path, store: str, labels: np.ndarray, texts: list[str], sources: np.ndarray) -> MilvusTarget:
    target = MilvusTarget(str(db), f"words_in_{store}", timeout=600)
    with opened(target, store) as collection:
        collection.ensure(64, "bench:lexical", text_index=True)
        for source in ("train", "val"):
            rows = np.flatnonzero(sources == source)
            for start in range(0, len(rows), 2000):
                keep = rows[start : start + 2000]
                collection.upsert(code_rows({"id": document_ids(source, keep), "code": np.zeros((len(keep), 8), np.uint8),
                                             "label": labels[keep], "text": [texts[i] for i in keep],
                                             "row": keep}, 64, source), new=True)
        collection.count()
    return target


def run_corpus(name: str, windows: int, folder: Path) -> dict:
    corpus = load_corpus(str(DATA / name))
    train, val = corpus.split("train"), corpus.split("val")
    texts, labels = train.texts + val.texts, np.concatenate([train.labels, val.labels])
    sources = np.array(["train"] * len(train.texts) + ["val"] * len(val.texts))
    stored = [t[:1024] for t in texts]
    cut = known_item.cut_windows(stored, windows, 8, 0, np.arange(len(train.texts), len(texts)))
    row_ids = np.array([document_ids(sources[i], [i])[0] for i in range(len(texts))])
    shorts = [" ".join(t.split()[:8]) for t in val.texts]
    out: dict = {"corpus": name, "n_database": len(texts), "windows": windows,
                 "item_exact_bound_at_10": round(exact_bound(cut.texts, stored, 10), 5)}
    top10: dict[str, list[set]] = {}
    for store in STORES:
        t0 = time.perf_counter()
        target = build(folder / f"{store}.db", store, labels, texts, sources)
        out[f"build_s_{store}"] = round(time.perf_counter() - t0, 1)
        with opened(target, store, create=False) as c:
            t0 = time.perf_counter()
            topic = c.search_text(val.texts, DEPTH, output_fields=("label",), filter='source == "train"')
            short = c.search_text(shorts, DEPTH, output_fields=("label",), filter='source == "train"')
            item = c.search_text(cut.texts, DEPTH, output_fields=("label",))
            out[f"s_per_query_{store}"] = round((time.perf_counter() - t0) / (2 * len(val.texts) + len(cut.texts)), 5)
        out[f"topic_p10_{store}"] = round(precision(topic, val.labels, 10), 5)
        out[f"topic_p100_{store}"] = round(precision(topic, val.labels, 100), 5)
        out[f"short_p100_{store}"] = round(precision(short, val.labels, 100), 5)
        scores = recall(item, row_ids[cut.targets], len(texts))
        out.update({f"item_{k}_{store}": round(v, 5) for k, v in scores.items() if k.startswith("recall")})
        top10[store] = [{h["id"] for h in row[:10]} for row in topic + short + item]
    out["top10_agreement"] = round(float(np.mean([len(a & b) / max(1, len(a), len(b))
                                                  for a, b in zip(top10["file"], top10["milvus"])])), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=list(CORPORA))
    ap.add_argument("--windows", type=int, default=1000)
    args = ap.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in args.corpora:
        with tempfile.TemporaryDirectory(prefix="dhim-ray-lexical-") as folder:
            results[name] = run_corpus(name, args.windows, Path(folder))
        print(json.dumps(results[name]), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
