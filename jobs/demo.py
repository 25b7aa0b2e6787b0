"""The README's end-to-end run on the embedded defaults: packaged encoder
(all-MiniLM-L6-v2), packaged corpus (2,225 BBC news articles), milvus-lite file.

train -> eval (DHIM vs ITQ/LSH on the same features) -> Ray Data ingest into
milvus-lite -> P@100 through Milvus -> a text search.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from connectors.milvus import MilvusTarget
from dhim_ray.config import config_for_bits
from dhim_ray.pipeline import evaluate_baseline, evaluate_checkpoint, train_corpus

from .ingest import ingest
from .search import CodeSearcher, evaluate_in_milvus

CORPUS = "bbc"
QUERY = "oil prices push the stock market down"


def run_demo(out_dir: str | Path, bits: int = 64, epochs: int = 15, progress: bool = True, console=None,
             workers: int = 2) -> dict[str, Any]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = out_dir / "features"
    say = console.print if console is not None else (lambda *a, **k: None)
    t0 = time.perf_counter()

    say(f"[bold]1/5 train[/] DHIM {bits} bits on {CORPUS} (packaged encoder all-MiniLM-L6-v2)")
    cfg = config_for_bits(bits, train={"max_epochs": epochs})
    model_dir = out_dir / f"{CORPUS}-{bits}"
    _, summary = train_corpus(CORPUS, cfg, model_dir, progress=progress, cache_dir=cache)

    say("[bold]2/5 eval[/] precision@100, database = train, queries = val")
    rows = [evaluate_checkpoint(model_dir, f"{CORPUS}:train", f"{CORPUS}:val", 100, progress=progress,
                                cache_dir=cache)]
    for baseline in ("itq", "lsh"):
        rows.append(evaluate_baseline(baseline, bits, f"{CORPUS}:train", f"{CORPUS}:val", 100,
                                      progress=progress, cache_dir=cache))

    say(f"[bold]3/5 ingest[/] Ray Data -> milvus-lite {out_dir / 'dhim_ray.db'}")
    target = MilvusTarget(str(out_dir / "dhim_ray.db"), f"{CORPUS}_{bits}")
    ing = ingest(CORPUS, model_dir, target, split="train", workers=workers, overwrite=True, progress=progress)

    say("[bold]4/5 eval through Milvus[/]")
    milvus = evaluate_in_milvus(model_dir, f"{CORPUS}:val", target.uri, target.collection, k=100, progress=progress)

    say(f"[bold]5/5 search[/] {QUERY!r}")
    with CodeSearcher(model_dir, target) as searcher:
        hits = searcher.search(QUERY, k=5)[0]
        label_names = _label_names()

    result = {
        "model": str(model_dir),
        "n_bits": bits,
        "best_epoch": summary["best_epoch"],
        "train_seconds": summary["train_seconds"],
        "precision_at_100": {r["method"]: round(r["precision_at_k_tie_aware"], 4) for r in rows},
        "milvus_precision_at_100": round(milvus["precision_at_k_tie_aware"], 4),
        "ingest": ing.as_dict(),
        "query": QUERY,
        "hits": [{"distance": h["distance"], "label": label_names[h["label"]], "text": " ".join(h["text"].split())[:80]} for h in hits],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if console is not None:
        _show(console, result)
    return result


def _label_names() -> list[str]:
    from dhim_ray.data import load_split

    return load_split(f"{CORPUS}:val").label_names


def _show(console, r: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"precision@100 on {CORPUS} val ({r['n_bits']} bits, tie-aware)")
    t.add_column("method")
    t.add_column("P@100", justify="right")
    for method, p in r["precision_at_100"].items():
        t.add_row(method, f"{p:.4f}")
    t.add_row("dhim via Milvus", f"{r['milvus_precision_at_100']:.4f}")
    console.print(t)
    ing = r["ingest"]
    console.print(f"ingested {ing['rows_in_collection']} rows into {ing['collection']} at {ing['uri']} "
                  f"({ing['docs_per_second']} docs/s, verified={ing['verified']})")
    h = Table(title=f"search: {r['query']!r}")
    for col in ("distance", "label", "text"):
        h.add_column(col)
    for hit in r["hits"]:
        h.add_row(str(hit["distance"]), hit["label"], hit["text"])
    console.print(h)
    console.print(f"done in {r['seconds']} s")
