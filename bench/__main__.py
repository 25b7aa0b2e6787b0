"""The benches behind BENCHMARKS.md: ``python -m bench`` lists them, ``python -m bench NAME
[ARGS]`` runs one (``--help`` after the name shows its options). Each writes its results
under bench/; ``python -m bench report`` puts them into BENCHMARKS.md's and the README's tables."""

from __future__ import annotations

import importlib
import sys

#: name -> (what it measures, the BENCHMARKS.md section its tables fill)
BENCHES: dict[str, tuple[str, str]] = {
    "headline": ("ubinary and float cosine beside DHIM and ITQ", "What a user gets"),
    "item_level": ("known-item recall and P@100 for every method, and DHIM's training variants", "Two tasks"),
    "hybrid": ("codes, BM25 (tantivy beside the file) and their fusions through milvus-lite, both tasks, bytes per document",
               "One search for both tasks"),
    "lexical": ("BM25 through tantivy beside the file against milvus-lite's own, the same queries",
                "One search for both tasks"),
    "words": ("the default search at 1-10 million documents against tantivy alone, four kinds of query",
              "The words' engine"),
    "quality": ("DHIM (shipped, as published, ablations) against LSH, PCA and ITQ", "Retrieval quality"),
    "encode_speed": ("Hasher.encode against SentenceTransformer.encode on the CPU", "The hot path"),
    "onnx_speed": ("torch, ONNX Runtime and int8 against sentence-transformers' backends", "Backends on the CPU"),
    "ingest_speed": ("dhim-ray ingest end to end against Hasher.encode", "The hot path"),
    "startup": ("a process's start-up with a model (Hasher.load, dhim-ray search) against loading the torch "
                "encoder too", "The hot path"),
    "eval_methods": ("one evaluation of the model and three baselines against each evaluated alone", "The hot path"),
    "serve_load": ("the HTTP service under load against the in-process Searcher", "The query service"),
    "million": ("a million generated documents: exact search, eval, ingest memory, an interrupted ingest, "
                "the write path alone, a file's reopen",
                "A million documents"),
    "store": ("milvus-lite or the Milvus server against faiss at 1-10 million generated codes: load, memory, "
              "latency, recall, radius search",
              "Where the embedded default ends"),
    "ray_start": ("a local Ray's start beside an open Milvus channel, grpcio's fork support on and off", "The hot path"),
    "ray_train": ("in-process training against 1 and 2 Ray Train workers", "Ray Train"),
    "ray_poll": ("Ray Train polling its workers every 2 s (Ray's default) against every 0.25 s", "Ray Train"),
    "gpu_path": ("encoding and training on one GPU (needs one)", "Training at scale"),
    "device_ingest": ("the ingest on a device machine in one command: the encoder alone, the store alone, the "
                      "pipeline without the encoder, end to end (--dry-run: on CPU, small)", "Training at scale"),
    "figures": ("the docs' pictures: the search page, the training and precision@k curves", "docs/images"),
    "report": ("refresh the generated tables (--check: exit 1 when one is out of date)", "every table"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, BENCHES))
        print(__doc__.split("\n\n")[0].replace("``", ""), "\n")
        for name, (what, section) in BENCHES.items():
            print(f"  {name:<{width}}  {what} [{section}]")
        return 0
    name = argv[0].replace("-", "_")
    if name not in BENCHES:
        print(f"error: no bench named {argv[0]!r}; run python -m bench to list them", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *argv[1:]]
    importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
