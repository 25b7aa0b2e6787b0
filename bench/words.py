"""The default search at scale against an engine made for BM25, alone, on the same texts.

    python -m bench.words --docs 1000000 --queries 50

A collection made by the project's own ingest of the generated corpus (bench/million.py; the
encoder bypassed: StoredCodes), then, one query at a time in one process (``Searcher.open``, as
the CLI and an application open it: the query graph hashes each query), all engines
alternating query by query: ``Searcher.run`` in text, hybrid and codes mode, and tantivy alone
(an index of the same texts with nothing stored, its top 10 ids read), for four kinds of query:
an 8-word phrase of a document (known item: is it in the top 10?), 2-3 rare words, 3 common words,
one common word. Also the ingest's rate and the words' bytes a document, and tantivy alone's build
time and bytes. Results go to bench/words.json (one entry per size).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.harness import file_bytes, record_key
from bench.million import CACHE, child, make_corpus, tiny_model
from dhim_ray.search import SearchRequest

HERE = Path(__file__).resolve().parent
logger = logging.getLogger("bench.words")
KINDS = ("phrase", "rare", "common", "one_common")


def queries(texts: list[str], n: int, seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """(query, the row it came from, or -1) of each kind, seeded."""
    rng = np.random.default_rng(seed)
    sample = [texts[i] for i in rng.choice(len(texts), min(len(texts), 20_000), replace=False)]
    df = Counter(w for t in sample for w in set(t.lower().split()) if w.isalpha())
    common = [w for w, _ in df.most_common(200)]
    rare = [w for w, c in df.items() if 2 <= c <= 3 and len(w) > 4]
    out: dict[str, list[tuple[str, int]]] = {kind: [] for kind in KINDS}
    for i in rng.choice(len(texts), n, replace=False):
        words = texts[i].split()
        start = int(rng.integers(0, max(1, len(words) - 8)))
        out["phrase"].append((" ".join(words[start : start + 8]), int(i)))
    for _ in range(n):
        out["rare"].append((" ".join(rng.choice(rare, int(rng.integers(2, 4)), replace=False)), -1))
        out["common"].append((" ".join(rng.choice(common[:60], 3, replace=False)), -1))
        out["one_common"].append((str(rng.choice(common[:20])), -1))
    return out


def tantivy_alone(texts: list[str], folder: Path) -> tuple[object, dict]:
    """tantivy's own index of ``texts`` (its default tokenizer, positions, nothing stored), timed."""
    import tantivy

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("row", indexed=True, fast=True)
    builder.add_text_field("text")
    index = tantivy.Index(builder.build(), str(folder))
    t0 = time.perf_counter()
    writer = index.writer(heap_size=256_000_000)
    for i, text in enumerate(texts):
        writer.add_document(tantivy.Document(row=i, text=text))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, {"build_s": time.perf_counter() - t0, "bytes_per_doc": file_bytes(folder) / len(texts)}


def run(n_docs: int, n_queries: int, workers: int) -> dict:
    import pyarrow.parquet as pq

    from dhim_ray.connectors.lexical import text_file
    from dhim_ray.search import Searcher

    model, corpus = tiny_model(), make_corpus(n_docs)
    db = CACHE / f"words-{n_docs}.db"
    for f in CACHE.glob(f"{db.name}*"):
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    ingest = child([str(n_docs), str(db), "docs", "--workers", str(workers), "--precomputed", "--text-index"])
    out: dict = {"docs": n_docs, "queries_per_kind": n_queries, "ingest": ingest,
                 "words_bytes_per_doc": file_bytes(text_file(db)) / n_docs}
    logger.info("ingest: %s", ingest)
    texts = pq.read_table(sorted((corpus / "train").glob("*.parquet")), columns=["text"]).column("text").to_pylist()
    index, out["tantivy_alone"] = tantivy_alone(texts, CACHE / f"tantivy-{n_docs}")
    logger.info("tantivy alone: %s", out["tantivy_alone"])
    asked = queries(texts, n_queries)
    with Searcher.open(model, str(db), "docs") as searcher:  # as the CLI and an application open it
        def alone(q: str) -> list[int]:
            s = index.searcher()
            return [int(r) for r in s.fast_field_values("row", [a for _, a in s.search(
                index.parse_query_lenient(q.replace('"', " "), ["text"])[0], 10, count=False).hits])]

        engines = {"text": lambda q: [h["row"] for h in searcher.run(SearchRequest([q], k=10, mode="text")).hits[0]],
                   "hybrid": lambda q: [h["row"] for h in searcher.run(SearchRequest([q], k=10)).hits[0]],
                   "codes": lambda q: [h["row"] for h in searcher.run(SearchRequest([q], k=10, mode="codes")).hits[0]],
                   "tantivy": alone}
        for engine in engines.values():  # each engine's first answer (files opened, caches warm) off the clock
            engine("warm up")
        for kind in KINDS:
            ms: dict[str, list[float]] = {name: [] for name in engines}
            found: dict[str, int] = dict.fromkeys(engines, 0)
            for q, row in asked[kind]:
                for name, engine in engines.items():
                    t0 = time.perf_counter()
                    rows = engine(q)
                    ms[name].append((time.perf_counter() - t0) * 1e3)
                    found[name] += row in rows
            out[kind] = {name: {"p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99))}
                         for name, v in ms.items()}
            if kind == "phrase":
                out[kind]["known_item_recall_at_10"] = {name: found[name] / n_queries for name in engines}
            logger.info("%s: %s", kind, out[kind])
    for kind in KINDS:
        r = out[kind]
        r["text_over_alone_p50"] = r["text"]["p50_ms"] / r["tantivy"]["p50_ms"]
        r["text_goal_p50_ms"] = 1.5 * r["tantivy"]["p50_ms"] + 2
        r["text_goal_p99_ms"] = 2 * r["tantivy"]["p99_ms"] + 5
        r["hybrid_goal_p50_ms"] = 1.3 * (r["codes"]["p50_ms"] + r["tantivy"]["p50_ms"])
    shutil.rmtree(CACHE / f"tantivy-{n_docs}", ignore_errors=True)
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1_000_000])
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    for n in args.docs:
        result = run(n, args.queries, args.workers)
        record_key("words", f"docs_{n}", result)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
