"""What the command prints: a result's table or JSON (``print_result``), an evaluation's rows
(``print_results``), its curves drawn (``draw``), a search's hits (``show_hits``) and the demo's
summary (``show_demo``); the command (dhim_ray/cli.py) parses, runs and hands its answer here."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import typer

logger = logging.getLogger(__name__)


def print_result(result: dict[str, Any], as_json: bool, title: str = "") -> None:
    if as_json:
        typer.echo(json.dumps(result, default=json_default))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title) if title else None, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, (list, dict)):
            continue
        shown = "-" if value is None else str(value) if not isinstance(value, float) else \
            f"{value:,.1f}" if key.endswith(("second", "seconds")) else f"{value:.4f}"  # s and docs/s: one decimal
        table.add_row(Text(key), Text(shown))
    Console().print(table)


def json_default(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def print_results(results: list[dict[str, Any]], as_json: bool, title: str, metrics: tuple[str, ...]) -> None:
    """One method: its figures; several: a row each, the ``metrics`` they share."""
    if len(results) == 1:
        return print_result(results[0], as_json, title)
    if as_json:
        typer.echo(json.dumps(results, default=json_default))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    shown = [m for m in metrics if all(m in r for r in results)]
    table = Table(title=Text(title))
    table.add_column("method")
    table.add_column("width", justify="right")
    for metric in shown:
        table.add_column(metric, justify="right")
    for r in results:
        width = f"{r['n_bits']} bits" if "n_bits" in r else f"{r.get('dims', '?')} floats"
        table.add_row(r["method"], width, *(f"{r[m]:.4f}" for m in shown))
    Console().print(table)


def draw(results: list[dict[str, Any]], plot: Path, what: str, title: str) -> None:
    from dhim_ray.plots import k_curves

    drawn = [r for r in results if "curve" in r]
    if len(drawn) < len(results):
        logger.warning("--plot: %s has no labels to draw precision@k by; no curve drawn for it",
                       ", ".join(r["method"] for r in results if "curve" not in r))
    if drawn:
        logger.info("drew %s for %s into %s", what, ", ".join(r["method"] for r in drawn), k_curves(drawn, plot, what,
                                                                                                   title))


_HIT_FIELDS = {"id", "distance", "label", "label_name", "text", "source", "row", "key", "rerank_score", "bm25",
               "rrf_score"}


#: Terminal columns from which the hit table shows ids (narrower, the text keeps the width).
WIDE = 100


def show_hits(queries: list[str], hits: list[list[dict[str, Any]]], as_json: bool = False) -> None:
    """A table per query: from WIDE columns on it shows each hit's id; narrower, its rank (``--like @RANK``)."""
    if as_json:
        typer.echo(json.dumps([{"query": q, "hits": h} for q, h in zip(queries, hits)], default=json_default))
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    for query, rows in zip(queries, hits):
        table = Table(title=Text(repr(query)), show_header=True, expand=True, box=box.SIMPLE_HEAD, show_edge=False,
                      pad_edge=False, collapse_padding=True,  # no vertical borders: their width goes to the text
                      caption=None if rows else "no hits (a filter, --max-distance or --mode text can leave none)")
        reranked = any("rerank_score" in h for h in rows)
        lexical = any("bm25" in h for h in rows)  # text or hybrid search: BM25's score where it found the hit
        keyed = any(h.get("key") for h in rows)
        labelled = any(h.get("label_name") or h.get("label", -1) != -1 for h in rows)  # else no label column
        kept = [c for c in (rows[0] if rows else {}) if c not in _HIT_FIELDS][:3]  # --keep-columns, the first three
        with_ids = console.width >= WIDE  # narrower: the text keeps the width, --like @RANK names a hit
        cols = ("rank", "distance", *(("score",) if reranked else ()), *(("label",) if labelled else ()),
                *(("id",) if with_ids else ()), *(("bm25",) if lexical else ()), *kept)
        ids = [str(h.get("key") or "")[:40] if keyed else str(h.get("id")) for h in rows]
        for col in cols:  # an id is shown whole: --like takes it
            table.add_column(col, no_wrap=True, justify="right",
                             min_width=max([len(col), *map(len, ids)]) if col == "id" else len(col))
        table.add_column("text", overflow="ellipsis", no_wrap=True, ratio=1)
        for rank, h in enumerate(rows, 1):
            score = (f"{h['rerank_score']:.2f}" if "rerank_score" in h else "",) if reranked else ()
            bm25 = (f"{h['bm25']:.2f}" if "bm25" in h else "",) if lexical else ()
            # a string label's name, else its number; -1 is the connector's "no label"
            label = h.get("label_name") or ("-" if h.get("label", -1) == -1 else str(h.get("label")))
            table.add_row(str(rank), str(h["distance"]), *score, *((label[:40],) if labelled else ()),
                          *((ids[rank - 1],) if with_ids else ()), *bm25, *(str(h.get(c, ""))[:30] for c in kept),
                          Text(" ".join(str(h.get("text", "")).split())[:300]))
        console.print(table)
    if any("bm25" in h for row in hits for h in row):
        console.print(Text("bm25: the words' score (higher matches more of them), on the hits put first; distance: "
                           "bits apart from the query's code (lower is nearer), the order below them", style="dim"))
    if any(hits) and console.width < WIDE:
        console.print(Text("more like a hit: --like @RANK (@QUERY.RANK for another query); its id: --json",
                           style="dim"))


def show_demo(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    t = Table(title=f"P@100 on bbc test, {r['n_bits']} bits")
    t.add_column("method")
    t.add_column("P@100", justify="right")
    for method, p in r["precision_at_100"].items():
        t.add_row(method, f"{p:.4f}")
    t.add_row("dhim via Milvus", f"{r['milvus_precision_at_100']:.4f}")
    t.add_row("dhim + BM25 via Milvus (hybrid, in its order)", f"{r['hybrid_precision_at_100']:.4f}")
    console.print(t)
    known = r["known_item_recall_at_10"]
    console.print(Text(f"does an 8-word phrase find its document? recall@10 through Milvus: codes "
                       f"{known['codes']:.3f}, hybrid {known['hybrid']:.3f}"))
    ing = r["ingest"]
    console.print(Text(f"ingested {ing['rows_in_collection']} rows into {ing['collection']} at {ing['uri']} "
                       f"({ing['docs_per_second']} docs/s, verified={ing['verified']})"))
    h = Table(title=Text(f"search: {r['query']!r}"))
    for col in ("distance", "label", "text"):
        h.add_column(col)
    for hit in r["hits"]:
        h.add_row(str(hit["distance"]), hit["label"], Text(hit["text"]))
    console.print(h)
    console.print(f"done in {r['seconds']} s")


def show_eval(results: list[dict[str, Any]], request: Any, window_words: int, plot: Path | None, as_json: bool) -> None:
    """An evaluation's table (or JSON) and, with ``plot``, its curves: titled by its task, captioned
    with what was searched."""
    first, k = results[0], request.k
    named = {"queries": _corpus_named(request.queries),
             "database": _corpus_named(request.database) or f"collection {request.collection and request.collection.collection}"}
    if request.task == "known-item":
        what, title = "known-item recall@k", f"known-item retrieval ({window_words}-word windows)"
        metrics = ("recall_at_1", "recall_at_10", "recall_at_100", "mrr")
        caption = (f"{first['n_queries']:,} windows of {window_words} words (from {named['queries'] or named['database']})"
                   f" among {named['database']}: {first['n_database']:,} documents")
    else:
        what = "precision@k"
        title = f"precision@{k}" if "precision_at_k" in first else f"cosine-neighbour recall@{k} (no labels)"
        metrics = ("precision_at_k", "precision_at_k_tie_aware", "neighbour_recall_at_k")
        caption = (f"{named['queries']}: {first['n_queries']:,} queries against {named['database']}: "
                   f"{first['n_database']:,} documents (tie-aware for codes)")
    if plot is not None:
        draw(results, plot, what, caption)
    print_results(results, as_json, title, metrics)


def _corpus_named(spec) -> str:
    """A corpus as a caption names it: ``bbc:test``, a local one by its file or folder name."""
    if spec is None:
        return ""
    name = Path(spec.name).name if Path(spec.name).exists() else spec.name
    return f"{name}:{spec.split}" if spec.split else name
