"""The headline's reference columns: what a user of the same encoder would pick instead of
DHIM. ``ubinary`` (sentence-transformers' ``quantize_embeddings(..., "ubinary")``: the sign of
each of the sentence vector's 384 dims, 48 bytes a document) and float cosine kNN (1,536 bytes),
by the quality protocol: train database, val queries, tie-aware P@100; 50 words for dbpedia and
agnews, 400 for r8 and 20ng. DHIM's and ITQ's columns come from bench/quality.jsonl.

    python -m bench.headline          # writes bench/headline.json (features cached in bench/.cache)
"""

from __future__ import annotations

from bench.harness import HERE, corpus_path, write_result
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.evaluation import EvalRequest, evaluate

CORPORA = {"dbpedia": 50, "agnews": 50, "r8": 400, "20ng": 400}


def main() -> None:
    rows = []
    for name, words in CORPORA.items():
        folder = str(corpus_path(name))
        request = EvalRequest(baselines=("ubinary", "cosine"), database=CorpusSpec(folder, "train"),
                              queries=CorpusSpec(folder, "val"), max_words=words, cache_dir=HERE / ".cache" / "features")
        for r in evaluate(request, progress=False):
            row = {"corpus": name, "method": r["method"], "bytes_per_doc": r["bytes_per_doc"],
                   "p_tie": round(r["precision_at_k_tie_aware"], 5)}
            print(row, flush=True)
            rows.append(row)
    write_result("headline", rows)


if __name__ == "__main__":
    main()
