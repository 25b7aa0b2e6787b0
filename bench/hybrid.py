"""One search for both tasks, through milvus-lite: the codes, BM25 over the stored text (tantivy
beside the file), and the two fused, on the dev corpora.

Per corpus: the shipped 64-bit model trained by the quality protocol (bench/protocol.py: model
selection on a slice of train, never on val); one collection of train + val rows with the text
index (the words in tantivy beside the file), the codes hashed here and upserted through
the connector, and a second collection of the same rows without the index for the bytes. Three
query sets, each searched once per list (top 100 of the codes, top 100 of BM25), every fusion
then applied to the same two lists:

- topic: each val document against the train rows (filter ``source``), P@10 and P@100 (plain, in
  the order the search returns);
- short: the first 8 words of each val document, against train, P@100;
- known-item: 1,000 windows of 8 words cut from the stored texts of val rows (the same windows
  ``eval --task known-item`` cuts), searched among train + val, recall@1/10/100; and the bound any
  ranking by words has: a window whose words occur in that order in n documents finds its own in
  the top 10 with chance min(1, 10 / n) at best (``item_exact_bound_at_10``).

Bytes per document: the milvus-lite file of each collection after a flush (with what it keeps beside
it: the words' tantivy index), divided by its rows. ``--bytes`` measures them again alone, as the
connector writes a new file today, for the rows already recorded (no model: each text's code is 8
bytes of its hash, as dense as a trained model's balanced bits).

    python -m bench hybrid --corpora dbpedia agnews r8 20ng
    python -m bench hybrid --bytes       # the bytes per document again, for every corpus recorded

Results accumulate in bench/hybrid.jsonl (a rerun skips corpora already there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA, HERE, append_row, file_bytes, read_rows
from bench.protocol import corpus_features, done, fit_carved, training_fields
from dhim_ray.config import config_for_bits
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.connectors.rows import code_rows, document_ids
from dhim_ray.model.inference import hash_features
from dhim_ray.retrieval import known_item
from dhim_ray.retrieval.fusion import Fusion, fuse

RESULTS = HERE / "hybrid.jsonl"
CORPORA = ("dbpedia", "agnews", "r8", "20ng")
#: The lists compared: each list alone, then every fusion of the two.
FUSIONS = {"head:1": Fusion("head", 1), "head:2": Fusion("head", 2), "head:3": Fusion("head", 3),
           "head:5": Fusion("head", 5), "phrase:3": Fusion("phrase", 3), "phrase:5": Fusion("phrase", 5),
           "phrase:5@1.0": Fusion("phrase", 5, cover=1.0), "phrase:5@0.6": Fusion("phrase", 5, cover=0.6),
           "rrf:60": Fusion("rrf", c=60)}
DEPTH = 100


def build(path: Path, name: str, codes: np.ndarray, labels: np.ndarray, texts: list[str], sources: list[str],
          text_index: bool) -> MilvusTarget:
    target = MilvusTarget(str(path), name, timeout=600)  # 1,000 whole documents as BM25 queries take a while
    rows = np.arange(len(texts))
    with target.open() as collection:
        collection.ensure(64, "bench", text_index=text_index)
        for start in range(0, len(texts), 2000):
            part = slice(start, start + 2000)
            for source in sorted(set(sources[part])):
                keep = [i for i in rows[part] if sources[i] == source]
                collection.upsert(code_rows({"id": document_ids(source, keep), "code": codes[keep],
                                             "label": labels[keep], "text": [texts[i] for i in keep],
                                             "row": np.asarray(keep)}, 64, source))
        collection.count()
    return target


def lists(collection, codes: np.ndarray, texts: list[str], expr: str | None):
    by_codes = collection.search(codes, 64, DEPTH, output_fields=("label",), filter=expr)
    by_text = collection.search_text(texts, DEPTH, output_fields=("label", "text"), filter=expr)
    return by_codes, by_text, texts


def ranked(by_codes, by_text, texts) -> dict[str, list[list[dict]]]:
    out = {"codes": by_codes, "bm25": by_text}
    for name, fusion in FUSIONS.items():
        out[name] = [fuse(c, t, DEPTH, fusion, q) for c, t, q in zip(by_codes, by_text, texts)]
    return out


def precision(rows: list[list[dict]], labels: np.ndarray, k: int) -> float:
    return float(np.mean([sum(h["label"] == label for h in row[:k]) / k for row, label in zip(rows, labels)]))


def recall(rows: list[list[dict]], targets: np.ndarray, n_database: int) -> dict[str, float]:
    ids = np.full((len(rows), DEPTH), -1, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = [h["id"] for h in row]
    return known_item.known_item_scores(*known_item.list_ranks(ids, targets, n_database))


def run_corpus(name: str, cache_dir: str, max_epochs: int, windows: int, folder: Path) -> dict:
    import torch

    encoder, train, val, tr, va = corpus_features(name, cache_dir)
    # the trained model is kept in bench/.cache/hybrid: a rerun of the searches does not train again
    cached = Path(cache_dir).parent / "hybrid" / f"{name}-64-{max_epochs}.pt"
    if cached.exists():
        model, fields = torch.load(cached, weights_only=False)
    else:
        cfg = config_for_bits(64, model={"hidden_size": encoder.hidden_size}, train={"max_epochs": max_epochs})
        res = fit_carved(cfg, tr, train)
        model, fields = res.model, training_fields(res)
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save((model, fields), cached)
    codes = np.concatenate([hash_features(model, tr), hash_features(model, va)])
    texts = train.texts + val.texts
    out = {"corpus": name, "bits": 64, "n_database": len(texts), **fields}
    return {**out, **search_corpus(model, encoder, train, val, codes, texts, windows, folder)}


def search_corpus(model, encoder, train, val, codes, texts, windows: int, folder: Path) -> dict:
    labels = np.concatenate([train.labels, val.labels])
    sources = np.array(["train"] * len(train.texts) + ["val"] * len(val.texts))
    t0 = time.perf_counter()
    target = build(folder / "hybrid.db", "hybrid", codes, labels, texts, sources, True)
    seconds_with = time.perf_counter() - t0
    t0 = time.perf_counter()
    bare = build(folder / "codes.db", "codes", codes, labels, texts, sources, False)
    seconds_without = time.perf_counter() - t0
    out: dict = {**bytes_per_doc(target, bare, texts), "ingest_seconds_ratio": round(seconds_with / seconds_without, 2)}
    with target.open(create=False) as collection:
        # topic: val documents against train; short: their first 8 words
        train_only = 'source == "train"'
        q_codes = codes[len(train.texts):]
        topic = ranked(*lists(collection, q_codes, val.texts, train_only))
        shorts = [" ".join(t.split()[:8]) for t in val.texts]
        short = ranked(*lists(collection, encoder_codes(model, encoder, shorts), shorts, train_only))
        # known-item: windows of val rows' stored texts (as eval --task known-item cuts them), among all rows
        stored = [t[:1024] for t in texts]
        cut = known_item.cut_windows(stored, windows, 8, 0, np.arange(len(train.texts), len(texts)))
        row_ids = np.array([document_ids(sources[i], [i])[0] for i in range(len(texts))])
        item = ranked(*lists(collection, encoder_codes(model, encoder, cut.texts), cut.texts, None))
    out["item_exact_bound_at_10"] = round(exact_bound(cut.texts, stored, 10), 5)
    for how in topic:
        out[f"topic_p10_{how}"] = round(precision(topic[how], val.labels, 10), 5)
        out[f"topic_p100_{how}"] = round(precision(topic[how], val.labels, 100), 5)
        out[f"short_p100_{how}"] = round(precision(short[how], val.labels, 100), 5)
        scores = recall(item[how], row_ids[cut.targets], len(texts))
        out.update({f"item_{k}_{how}": round(v, 5) for k, v in scores.items() if k.startswith("recall")})
    return out


def bytes_per_doc(hybrid: MilvusTarget, bare: MilvusTarget, texts: list[str]) -> dict:
    return {"bytes_per_doc_hybrid": round(file_bytes(Path(hybrid.uri)) / len(texts), 1),
            "bytes_per_doc_codes": round(file_bytes(Path(bare.uri)) / len(texts), 1),
            "text_bytes_per_doc": round(float(np.mean([len(t[:1024].encode()) for t in texts])), 1)}


def measure_bytes(name: str, folder: Path) -> dict:
    """``bytes_per_doc`` of the corpus' train + val rows written as a new file is today, no model:
    each text's code is the first 8 bytes of its blake2b hash."""
    import hashlib

    from dhim_ray.corpus.data import load_corpus

    corpus = load_corpus(str(DATA / name))
    train, val = corpus.split("train"), corpus.split("val")
    texts = train.texts + val.texts
    codes = np.frombuffer(b"".join(hashlib.blake2b(t.encode(), digest_size=8).digest() for t in texts),
                          np.uint8).reshape(len(texts), 8)
    labels = np.concatenate([train.labels, val.labels])
    sources = np.array(["train"] * len(train.texts) + ["val"] * len(val.texts))
    hybrid = build(folder / "hybrid.db", "hybrid", codes, labels, texts, sources, True)
    bare = build(folder / "codes.db", "codes", codes, labels, texts, sources, False)
    with hybrid.open(create=False) as collection:
        info = collection.describe()
    if (info.text_store, info.in_doc) != ("file", True):
        raise SystemExit(f"the new file's layout is {info.text_store!r}, in_doc={info.in_doc}: not {BYTES_LAYOUT}")
    return {**bytes_per_doc(hybrid, bare, texts), "bytes_layout": BYTES_LAYOUT}


#: How the rows' bytes were laid out when measured (a row without it: Milvus' own BM25 in the file,
#: each field apart).
BYTES_LAYOUT = "words beside the file (tantivy), the document's fields in one JSON field"


def exact_bound(windows: list[str], texts: list[str], k: int) -> float:
    """What any ranking by the words can reach: a window whose words occur, in order, in n stored
    texts (its own among them) puts its own document in the top k with chance min(1, k / n) at
    best; the mean over windows. Words: lowercase runs of letters and digits."""
    def words(t: str) -> str:
        return " " + " ".join(_WORDS.findall(t.lower())) + " "

    docs = [words(t) for t in texts]
    return float(np.mean([min(1.0, k / max(1, sum(w in d for d in docs))) for w in map(words, windows)]))


_WORDS = re.compile(r"\w+")


def encoder_codes(model, encoder, texts: list[str]) -> np.ndarray:
    return hash_features(model, encoder.features(texts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=list(CORPORA))
    ap.add_argument("--max-epochs", type=int, default=100)
    ap.add_argument("--windows", type=int, default=1000)
    ap.add_argument("--cache-dir", default=str(HERE / ".cache" / "features"))
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--bytes", action="store_true", help="measure the bytes per document again, alone")
    args = ap.parse_args()
    rows = read_rows(args.results)
    if args.bytes:
        for row in rows:
            with tempfile.TemporaryDirectory(prefix="dhim-ray-hybrid-") as folder:
                row.update(measure_bytes(row["corpus"], Path(folder)))
            print(row["corpus"], {k: v for k, v in row.items() if "bytes" in k}, flush=True)
        args.results.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return
    for name in args.corpora:
        if done(rows, corpus=name, max_epochs=args.max_epochs):
            continue
        with tempfile.TemporaryDirectory(prefix="dhim-ray-hybrid-") as folder:
            row = {**run_corpus(name, args.cache_dir, args.max_epochs, args.windows, Path(folder)),
                   "max_epochs": args.max_epochs}
        print({k: v for k, v in row.items() if "recall_at_10_" in k or "p100" in k or "bytes" in k}, flush=True)
        append_row(args.results, row)
        os.sync()


if __name__ == "__main__":
    main()
