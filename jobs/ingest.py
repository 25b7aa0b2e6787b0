"""Bulk ingest: corpus -> Ray Data -> DHIM codes -> Milvus binary collection.

Ray Data reads the source shard by shard (jobs/read_tasks.py: a counting pass refuses bad rows
before anything is written), the rows stream through the encoding actors to the sink
(jobs/milvus_sink.py); the driver never holds the corpus. Ids are deterministic per
(source, split, row), so a rerun writes onto the same rows (docs/ingest-and-search.md)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dhim_ray.config import FeatureConfig
from dhim_ray.connectors.connection import check_lite_path, is_lite, mask_uri, release
from dhim_ray.connectors.milvus import IndexSpec, MilvusTarget, check_collection_name
from dhim_ray.connectors.rows import RESERVED_FIELDS, document_ids, source_label
from dhim_ray.connectors.schema import check_alias_support, check_index_for, default_index
from dhim_ray.corpus.sources import label_vocabulary, plan_split, with_kept_columns, with_key_column
from dhim_ray.corpus.spec import CorpusSpec, canonical_split
from dhim_ray.encoding.encoder import load_tokenizer, token_ids
from dhim_ray.errors import ConfigError, IngestInterrupted, NoSpaceError, check_range
from dhim_ray.hasher import Hasher

from .milvus_sink import Expected, MilvusDatasink, write_dataset
from .ray_env import (
    actor_resources,
    check_capacity,
    check_gpus,
    check_shared_paths,
    cluster_address,
    init_ray,
    task_errors,
    tokeniser_resources,
)
from .read_tasks import Prepare, check_first_block, check_scan, read_documents, scan

logger = logging.getLogger(__name__)


#: Encoder batches in one Ray batch of an encoding actor, sorted by length together.
SORTED_BATCHES = 8


class TokenIds:
    """Ray Data callable class of the GPU path: CPU actors clean and tokenise ahead of the GPU
    actors (on a GPU, tokenising in the encoding actor leaves the GPU idle most of the time).
    Adds ``ids`` (n, n_tokens) int32, padded, and ``n_ids`` (n,): what CodeEncoder encodes."""

    def __init__(self, features: FeatureConfig):
        self.features = features
        self.tokenizer = load_tokenizer(features)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = token_ids(self.tokenizer, self.features, [str(t) for t in batch["text"]])
        padded = np.zeros((len(ids), self.features.n_tokens), dtype=np.int32)
        for row, seq in enumerate(ids):
            padded[row, : len(seq)] = seq
        batch["ids"], batch["n_ids"] = padded, np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        return batch


class CodeEncoder:
    """Ray Data callable class: loads the checkpoint once per actor, emits packed codes."""

    def __init__(self, model_dir: str, threads: int = 1, device: str = "cpu", batch_size: int = 64):
        import torch

        torch.set_num_threads(max(1, threads))
        self.hasher = Hasher.load(model_dir, device=device)
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tokenised = "ids" in batch  # TokenIds ran before (the GPU path)
        if tokenised:
            texts = [row[:n] for row, n in zip(batch.pop("ids"), batch.pop("n_ids"))]
        else:
            texts = [str(t) for t in batch["text"]]
        codes = np.zeros((len(texts), self.hasher.n_bytes), dtype=np.uint8)  # uint8 (n, n_bytes)
        todo = np.flatnonzero(~batch["stored"]) if "stored" in batch else np.arange(len(texts))  # stored: not again
        # A Ray batch holds SORTED_BATCHES encoder batches: sorted by length, each as wide as its longest.
        for rows, feats in self.hasher.encoder.iter_batches([texts[i] for i in todo], self.batch_size,
                                                            on_device=True, tokenised=tokenised):
            codes[todo[rows]] = self.hasher.hash_features(feats)
        batch["code"] = codes
        return batch


@dataclass
class IngestResult:
    """What an ingest wrote and what the collection then held. ``rows_in_collection`` counts this
    source's rows up to the last one ingested (a ``limit=N`` ingest verifies rows 0..N-1;
    ``rows_of_source`` counts them all); a whole-source ingest removes the rows the source no longer
    has (``stale_rows_removed``)."""

    collection: str
    uri: str
    source: str
    n_documents: int
    rows_written: int
    rows_in_collection: int
    rows_of_source: int
    seconds: float
    start_seconds: float = 0.0  # of them, Ray's start: fixed, whatever the corpus (docs_per_second leaves it out)
    writers: int = 1  # processes that upserted (the driver alone on milvus-lite)
    stale_rows_removed: int = 0  # rows of an earlier version of the source that it no longer has
    rows_unchanged: int = 0  # rows an earlier run had stored as they are: not encoded again, not written
    alias: str = ""  # the alias now pointing at the collection (ingest --alias)
    alias_was: str = ""  # the collection the alias pointed at before ("" for a new alias)
    text_index: bool = False  # the collection keeps BM25 over its text (hybrid search)
    keeps: str = "codes"  # what each row keeps beside its text: codes, a text index, columns

    @classmethod
    def of(cls, sink: MilvusDatasink, n_documents: int, seconds: tuple[float, float],
           figures: dict[str, Any]) -> IngestResult:
        """The result of an ingest through ``sink`` in ``seconds`` (all, Ray's start), whose
        ``on_write_complete`` returned ``figures``."""
        keeps = ["codes"] + ["text index (BM25)"] * sink.text_index + list(sink.columns)
        return cls(sink.target.collection, sink.target.uri, sink.source, n_documents, seconds=seconds[0],
                   start_seconds=seconds[1], text_index=sink.text_index, keeps=", ".join(keeps), **figures)

    @property
    def docs_per_second(self) -> float:
        """Documents read, encoded and written a second, Ray's start left out."""
        work = self.seconds - self.start_seconds
        return self.n_documents / work if work > 0 else 0.0

    @property
    def verified(self) -> bool:
        return self.rows_in_collection == self.n_documents

    def as_dict(self) -> dict[str, Any]:
        """The summary a user reads: an alias only where one was pointed."""
        out = {**self.__dict__, "uri": mask_uri(self.uri), "docs_per_second": round(self.docs_per_second, 1),
               "verified": self.verified}
        if not self.alias:
            out.pop("alias"), out.pop("alias_was")
        return out


@dataclass(frozen=True)
class IngestRequest:
    """One ingest, checked once when made (``parse`` makes one from the command's words); its fields
    are ``dhim-ray ingest``'s options (docs/ingest-and-search.md). ``text_index`` None: kept where the
    Milvus can; ``write_tasks`` None: max(2, workers) of Ray's write tasks on a server.

    >>> run_ingest(IngestRequest.parse(CorpusSpec("bbc"), "runs/bbc-64", "dhim_ray.db"))"""

    corpus: CorpusSpec
    model_dir: str | Path
    target: MilvusTarget
    workers: int = 2
    batch_size: int = 64
    overwrite: bool = False
    index: IndexSpec | None = None
    address: str | None = None
    write_batch: int = 500
    use_gpu: bool = False
    id_column: str | None = None
    keep_columns: tuple[str, ...] = ()
    alias: str | None = None
    tokenise_apart: bool | None = None
    text_index: bool | None = None
    write_tasks: int | None = None
    checkpoint: Any = field(default=None, repr=False, compare=False)  # the model's checked fields, where parse read them

    def __post_init__(self):
        if isinstance(self.workers, bool) or self.workers < 1:
            raise ConfigError(f"workers={self.workers}: must be >= 1, e.g. workers=2", field="workers")
        if self.batch_size < 1 or self.write_batch < 1:
            raise ConfigError(f"batch_size={min(self.batch_size, self.write_batch)}: must be >= 1, e.g. batch_size=64", field="batch_size")
        if self.write_tasks is not None:
            check_range("write_tasks", self.write_tasks, 1, 1024, example=4)
        object.__setattr__(self, "corpus", self.corpus.with_split(self.corpus.split or "train"))
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        check_alias_support(self.target.uri, self.alias)
        if self.alias is not None and self.alias == self.target.collection:
            raise ConfigError(f"alias={self.alias}: the alias and the collection need two names (the collection: a "
                              "version)", field="alias")
        object.__setattr__(self, "index", check_index_for(self.target.uri, self.index or default_index(self.target.uri)))

    @classmethod
    def parse(cls, corpus: CorpusSpec, model_dir: str | Path, uri: str, collection: str | None = None,
              split: str | None = None, index: str | None = None, nlist: int | None = None,
              token_env: str = "MILVUS_TOKEN", alias: str | None = None, **options) -> IngestRequest:
        """The request an ingest's words make: ``split`` (or the corpus' own ``:split``; train),
        ``collection`` (None: named after the alias and the model, else CORPUS_BITS), ``index``
        and ``nlist`` (None: the store's default) resolved here; ``options``: the fields above.
        Raises ConfigError for two splits, an ``nlist`` milvus-lite cannot use, a bad name."""
        if corpus.split and split is not None and corpus.split != split:
            raise ConfigError(f"split={split} and {corpus.name}:{corpus.split}: two splits named; give one", field="split")
        corpus = corpus.with_split(corpus.split or ("train" if split is None else split))
        if nlist is not None:
            IndexSpec("BIN_IVF_FLAT", nlist=nlist, nprobe=1)  # the range first: nlist=0 says so
            if is_lite(uri):
                raise ConfigError(f"nlist={nlist}: applies to BIN_IVF_FLAT on a Milvus server; a milvus-lite file is "
                                  "searched exactly (BIN_FLAT), leave nlist out", field="nlist")
        nlist = 128 if nlist is None else nlist
        checkpoint = Hasher.check(model_dir)  # the model's width and id name the collection
        if alias is not None and collection is None:  # a version of its own per model
            check_collection_name(alias, "alias", "news")  # the name typed, before one is made from it
            collection = f"{alias}_{checkpoint.model_id.split(':')[-1][:8]}"
        target = MilvusTarget(uri, collection or default_collection(corpus.name, checkpoint.n_bits),
                              token_env=token_env)
        index_spec = IndexSpec(index, nlist=nlist, nprobe=min(16, nlist)) if index else default_index(uri, nlist)
        return cls(corpus, model_dir, target, index=index_spec, alias=alias, checkpoint=checkpoint, **options)


def default_collection(name: str, n_bits: int) -> str:
    """A corpus' collection name: its preset or file name, letters, digits and ``_`` only, then the bits."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", Path(name).name if Path(name).exists() else name).strip("_") or "docs"
    if base[0].isdigit():
        base = "c_" + base
    return f"{base}_{n_bits}"


def run_ingest(request: IngestRequest, progress: bool = True) -> IngestResult:
    """``request``'s corpus through the model into its collection, verified; returns the
    IngestResult. Raises StoreError when the count differs from the source's,
    CollectionMismatchError for another width, model or source, IngestInterrupted on Ctrl-C."""
    r = request
    corpus, target = r.corpus, r.target
    # Everything that can be wrong with the model or the data fails here, before a
    # collection is created: the model, the columns, the first block here, then (in Ray) every row.
    model = _checked_model(r)
    features = model.config.features
    plan = with_kept_columns(with_key_column(plan_split(corpus), r.id_column), r.keep_columns, RESERVED_FIELDS)
    check_first_block(plan)
    source = source_label(f"{corpus.source_id}:{corpus.split}", f"{Path(corpus.name).name}:{corpus.split}")
    new_file = target.lite and not Path(target.uri).exists()
    if new_file:
        check_lite_path(target.uri)  # created by the sink's on_write_start, once the rows have passed the scan
    sink = MilvusDatasink(target, model.n_bits, model.model_id, source, model_dir=str(Path(r.model_dir).resolve()),
                          index=r.index, overwrite=r.overwrite, keys=r.id_column is not None, alias=r.alias)
    try:  # milvus-lite: the sink holds one session from its check to its last write (one process per file)
        existing = sink.check(plan.kept_columns, r.text_index, new_file)
        t0 = time.perf_counter()
        init_ray(r.address)
        check_capacity(r.workers, r.use_gpu)
        started = time.perf_counter() - t0
        # read tasks open the corpus and encoder actors the model on every node
        check_shared_paths({"--model": (Path(r.model_dir).resolve(), False),
                            **({"corpus": (Path(corpus.name).resolve(), False)} if Path(corpus.name).exists() else {})})
        scanned = scan(plan, features.cleaning)
        n_rows, n_dropped = check_scan(plan, scanned, corpus.drop_empty, corpus.limit)
        names = label_vocabulary(corpus, {canonical_split(corpus.split): scanned.label_names})
        n_documents = n_rows - n_dropped
        dropped = scanned.blank_rows[scanned.blank_rows < n_rows]  # empty texts left out (their ids may hold rows)
        sink.columns = {name: scanned.columns[name] for name in plan.kept_columns}
        # ids carry a hash of the source: a clash with another source's shows on its first rows
        sink.first_ids = document_ids(source, plan.id_rows(np.setdiff1d(np.arange(min(n_rows, 1000)),
                                                                          scanned.blank_rows)))
        sink.expected = Expected(n_documents, int(plan.id_rows([n_rows - 1])[0]), None if corpus.limit is not None
                                 else document_ids(source, plan.id_rows(dropped)))
        # the collection's kinds: an existing string field takes this ingest's numbers as text
        kinds = {name: kind for name, (kind, _) in (existing.columns if existing else sink.columns).items()}
        prepare = Prepare(source, tuple(scanned.offsets), n_rows, tuple(names) if names else None,
                          corpus.drop_empty, plan.label_names, tuple((name, kinds[name]) for name in plan.kept_columns),
                          None if existing is None or r.overwrite else sink.stored_parts())
        # no more encoding actors than Ray batches: each actor costs seconds to load the model
        actors = min(r.workers, -(-n_documents // (r.batch_size * SORTED_BATCHES)) or 1)
        ds = encoded(read_documents(plan, features.cleaning, prepare), sink.model_dir, features, actors,
                     r.batch_size, r.use_gpu, r.use_gpu if r.tokenise_apart is None else r.tokenise_apart)
        figures = _write(sink, ds, r, n_documents, progress)
        seconds = time.perf_counter() - t0
    except NoSpaceError:
        sink.close()
        if new_file and sink.info is None:  # refused before a row landed: leave no file behind
            release(target.uri)
            for leftover in (Path(target.uri), Path(target.uri).with_name(f".{Path(target.uri).name}.lock")):
                leftover.unlink(missing_ok=True)
        raise
    finally:
        sink.close()
    result = IngestResult.of(sink, n_documents, (seconds, started), figures)
    logger.info("ingested %d documents into %s at %s (%.0f docs/s)", n_documents, target.collection,
                mask_uri(target.uri), result.docs_per_second)
    return result


def _checked_model(r: IngestRequest) -> Hasher:
    """The checkpoint's fields the driver needs; local GPUs counted first."""
    if r.use_gpu and cluster_address(r.address) is None:
        import torch

        check_gpus(r.workers, True, available=torch.cuda.device_count())
    return r.checkpoint or Hasher.check(r.model_dir)


def _write(sink: MilvusDatasink, ds, r: IngestRequest, n_documents: int, progress: bool) -> dict[str, Any]:
    """The encoded rows through the sink: by the driver on milvus-lite, by Ray's write tasks on a server."""
    try:
        with task_errors():
            return write_dataset(ds, sink, progress, n_documents, r.write_tasks or max(2, r.workers), r.write_batch)
    except KeyboardInterrupt:
        raise IngestInterrupted(
            f"interrupted; rerun the same ingest to complete {r.target.collection!r}: a rerun writes the rows "
            "missing or changed and ends with exactly one row per document"
        ) from None


def encoded(ds, model_dir: str, features: FeatureConfig, workers: int, batch_size: int, use_gpu: bool,
            tokenise_apart: bool):
    """The documents' dataset through the encoding actors (one model each): packed codes.
    ``tokenise_apart``: CPU actors clean and tokenise ahead of them (a GPU actor then only
    encodes)."""
    import ray

    actor_cpus, threads = actor_resources(workers)
    if tokenise_apart:  # as many tokenising actors as the CPUs the encoders leave allow (Ray Data scales the pool)
        tok_cpus, most = tokeniser_resources(workers, actor_cpus)
        ds = ds.map_batches(TokenIds, fn_constructor_kwargs={"features": features},
                            batch_size=batch_size * SORTED_BATCHES, batch_format="numpy", num_cpus=tok_cpus,
                            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=most))
    return ds.map_batches(
        CodeEncoder,
        fn_constructor_kwargs={"model_dir": model_dir, "threads": threads, "device": "cuda" if use_gpu else "cpu",
                               "batch_size": batch_size},
        batch_size=batch_size * SORTED_BATCHES,
        # One block at a time per actor: otherwise the first actor up takes several blocks
        # while the others are still loading the model.
        compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
        num_cpus=actor_cpus,
        num_gpus=1 if use_gpu else 0,
        batch_format="numpy",
    )
