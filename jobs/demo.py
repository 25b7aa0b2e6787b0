"""The README's end-to-end run on the embedded defaults: packaged encoder
(all-MiniLM-L6-v2), packaged corpus (2,225 BBC news articles), milvus-lite file.

train -> eval (DHIM vs ITQ/LSH on the same features) -> Ray Data ingest into
milvus-lite -> P@100 through Milvus -> a text search.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from dhim_ray.config import config_for_bits
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.eval_in_memory import WindowSpec
from dhim_ray.evaluation import EvalRequest, evaluate
from dhim_ray.model.checkpoint import check_writable
from dhim_ray.search import Searcher, SearchRequest
from dhim_ray.training.pipeline import train_corpus

from .ingest import IngestRequest, run_ingest
from .train import draw_training_curve, prepare_searches

logger = logging.getLogger(__name__)

CORPUS = "bbc"
QUERY = "oil prices push the stock market down"
#: Written into the demo's folder: a rerun replaces the model and database only where it finds it.
MARK = ".dhim-ray-demo"


def claim_folder(out_dir: Path, model_dir: Path) -> None:
    """Refuse a folder whose model or database the demo did not make (it replaces them:
    ``--out runs`` would delete the Quickstart's runs/bbc-64), then mark it as the demo's. Only
    the mark says a folder is the demo's: a ``features/`` cache may be anyone's."""
    from dhim_ray.errors import ConfigError

    theirs = next((p for p in (model_dir, out_dir / "dhim_ray.db") if p.exists()), None)
    if theirs is not None and not (out_dir / MARK).exists():
        raise ConfigError(f"out={out_dir}: {theirs} was not made by the demo, which replaces it on each run; give "
                          "the demo a folder of its own, e.g. out=runs/demo", field="out")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARK).write_text("made by dhim-ray demo: each run replaces the model and database here\n")


def run_demo(out_dir: str | Path, bits: int = 64, epochs: int = 100, progress: bool = True,
             workers: int = 2) -> dict[str, Any]:
    """Train (the model ``dhim-ray train bbc --bits BITS`` trains), evaluate against baselines,
    ingest and search; returns what it measured. Each run replaces its model and database."""
    cfg = config_for_bits(bits, train={"max_epochs": epochs})  # bad settings fail before anything is written
    out_dir = check_writable(Path(out_dir))
    cache = out_dir / "features"
    t0 = time.perf_counter()
    # the epoch is picked on val; the figures are on test, which the selection never saw
    train_split, test_split = CorpusSpec(CORPUS, "train"), CorpusSpec(CORPUS, "test")

    logger.info("1/5 train: DHIM %d bits on %s (packaged encoder all-MiniLM-L6-v2)", bits, CORPUS)
    model_dir = out_dir / f"{CORPUS}-{bits}"
    claim_folder(out_dir, model_dir)
    shutil.rmtree(model_dir, ignore_errors=True)
    summary = train_corpus(CorpusSpec(CORPUS), cfg, model_dir, progress=progress, cache_dir=cache)
    draw_training_curve(model_dir, summary)  # training.png beside the model, as `dhim-ray train` draws it
    prepare_searches(model_dir)  # its first search (stage 5) as fast as any

    logger.info("2/5 eval: precision@100, database = train, queries = test (unseen by the epoch choice)")
    rows = evaluate(EvalRequest(model_dir, ("itq", "lsh"), train_split, test_split, cache_dir=cache), progress)

    logger.info("3/5 ingest: Ray Data -> milvus-lite %s", out_dir / "dhim_ray.db")
    target = MilvusTarget(str(out_dir / "dhim_ray.db"), f"{CORPUS}_{bits}")
    ingest_log = logging.getLogger("dhim_ray.jobs.ingest")
    level = ingest_log.level
    ingest_log.setLevel(logging.WARNING)  # its summary line: the demo's own table says what it ingested
    try:
        ing = run_ingest(IngestRequest(train_split, model_dir, target, workers=workers, overwrite=True), progress=progress)
    finally:
        ingest_log.setLevel(level)

    logger.info("4/5 eval through Milvus: the codes, and the codes fused with BM25 (hybrid); both tasks")
    milvus, hybrid = (evaluate(EvalRequest(model_dir, queries=test_split, collection=target, mode=mode))[0]
                      for mode in ("codes", "hybrid"))
    known = {mode: evaluate(EvalRequest(model_dir, collection=target, task="known-item", mode=mode,
                                        windows=WindowSpec(n_queries=500)))[0]["recall_at_10"]
             for mode in ("codes", "hybrid")}

    logger.info("5/5 search: %r", QUERY)
    with Searcher(model_dir, target) as searcher:
        hits = searcher.run(SearchRequest(QUERY, k=5)).hits[0]

    return {
        "model": str(model_dir),
        "n_bits": bits,
        "best_epoch": summary["best_epoch"],
        "train_seconds": summary["train_seconds"],
        "precision_at_100": {r["method"]: round(r["precision_at_k_tie_aware"], 4) for r in rows},
        "milvus_precision_at_100": round(milvus["precision_at_k_tie_aware"], 4),
        "hybrid_precision_at_100": round(hybrid["precision_at_k"], 4),
        "known_item_recall_at_10": {mode: round(r, 4) for mode, r in known.items()},
        "ingest": ing.as_dict(),
        "query": QUERY,
        "hits": [{"distance": h["distance"], "label": h["label_name"], "text": " ".join(h["text"].split())[:80]}
                 for h in hits],
        "seconds": round(time.perf_counter() - t0, 1),
    }
