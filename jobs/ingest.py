"""Bulk ingest: corpus -> Ray Data -> DHIM codes -> Milvus binary collection.

Encoding runs in parallel actors (one model per actor). With milvus-lite (a local
.db file, one process per file) the driver is the single writer; with a Milvus
server every write task upserts in parallel through MilvusDatasink. Ids are
deterministic per (corpus, split, row) and writes are upserts, so a rerun after
an interruption ends with exactly one row per document.

Runs as a Ray job too:
    ray job submit --working-dir . -- python -m jobs.ingest dbpedia --model runs/dbpedia-64
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from connectors.milvus import (
    IndexSpec,
    MilvusTarget,
    count_rows,
    default_index,
    document_ids,
    ensure_collection,
    make_rows,
    release,
    upsert_rows,
)
from dhim_ray.checkpoint import read_meta
from dhim_ray.data import load_corpus, parse_spec
from dhim_ray.errors import DataError, StoreError

from .ray_env import init_ray


def model_id(model_dir: str | Path) -> str:
    """A stable id of a checkpoint's weights: what a collection's codes came from."""
    read_meta(model_dir)
    digest = hashlib.sha256(Path(model_dir, "model.safetensors").read_bytes()).hexdigest()[:16]
    return f"dhim:{digest}"


class CodeEncoder:
    """Ray Data callable class: loads the checkpoint once per actor, emits packed codes."""

    def __init__(self, model_dir: str, threads: int = 1):
        import torch

        torch.set_num_threads(max(1, threads))
        from dhim_ray.hasher import Hasher

        self.hasher = Hasher.load(model_dir)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        feats = self.hasher.encoder.encode_batch(texts)
        batch["code"] = self.hasher.hash_features(feats)  # uint8 (n, n_bytes)
        return batch


@dataclass
class IngestResult:
    collection: str
    uri: str
    source: str
    n_documents: int
    rows_written: int
    rows_in_collection: int
    seconds: float
    writers: int = 1  # processes that upserted (the driver alone on milvus-lite)
    max_parallel_writes: int = 1  # write tasks running at the same moment

    @property
    def docs_per_second(self) -> float:
        return self.n_documents / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "docs_per_second": round(self.docs_per_second, 1),
                "verified": self.rows_in_collection == self.n_documents}


def ingest(
    corpus: str,
    model_dir: str | Path,
    target: MilvusTarget,
    split: str = "train",
    workers: int = 2,
    batch_size: int = 64,
    limit: int | None = None,
    overwrite: bool = False,
    index: IndexSpec | None = None,
    address: str | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    write_batch: int = 500,
    **data_kwargs: Any,
) -> IngestResult:
    """Encode one split of a corpus with a trained model and upsert it into Milvus.

    Args:
        corpus: preset, local folder/file or hub id (``CORPUS:split`` also works).
        model_dir: checkpoint folder from ``dhim-ray train``.
        target: Milvus URI and collection.
        workers: encoding actors.
        write_batch: rows per upsert from the driver (milvus-lite).
        stop_after: testing aid: stop after writing about this many rows, as a crash would.
    Returns:
        IngestResult with the verified row count. Raises StoreError when the
        collection's count of this source differs from the source's size.
    """
    import ray

    from dhim_ray.hasher import Hasher  # noqa: F401  (fail before Ray starts if torch is broken)

    name, only = parse_spec(corpus)
    split = only or split
    meta = read_meta(model_dir)
    n_bits = int(meta["config"]["model"]["n_bits"])
    if workers < 1:
        raise DataError(f"--workers {workers}: must be >= 1")
    data = load_corpus(f"{name}:{split}", limit=limit, **data_kwargs).split(split)
    source = f"{Path(name).name if os.path.exists(name) else name}:{split}"
    ids = document_ids(source, data.rows)
    index = index or default_index(target.uri)
    mid = model_id(model_dir)

    # Check (or create) the collection before starting Ray: a mismatch fails in a second.
    client = target.connect()
    try:
        ensure_collection(client, target.collection, n_bits, mid, index, overwrite, target.timeout)
    finally:
        client.close()
        release(target.uri)
    t0 = time.perf_counter()
    init_ray(address, num_cpus=None)
    import pyarrow as pa

    table = pa.table({
        "id": ids,
        "text": pa.array(data.texts, pa.string()),
        "label": data.labels if data.labels is not None else np.full(len(data), -1, np.int64),
        "row": data.rows,
    })
    ds = ray.data.from_arrow(split_table(table, workers * 4))
    actor_cpus, threads = actor_resources(workers)
    ds = ds.map_batches(
        CodeEncoder,
        fn_constructor_kwargs={"model_dir": str(Path(model_dir).resolve()), "threads": threads},
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=actor_cpus,
        batch_format="numpy",
    )
    writers = parallel = 1
    if target.lite:
        written = _write_from_driver(ds, target, n_bits, source, len(data), progress, stop_after, write_batch)
    else:
        from connectors.milvus_sink import MilvusDatasink

        sink = MilvusDatasink(target, n_bits, source, mid, index, overwrite=False)
        # Upserts wait on the network, not the CPU: a quarter CPU each lets them run beside the encoders.
        ds.write_datasink(sink, concurrency=max(2, workers), ray_remote_args={"num_cpus": 0.25})
        written, writers, parallel = sink.rows_written, sink.writers, sink.max_parallel_writes
    seconds = time.perf_counter() - t0
    client = target.connect()
    try:
        stored = _count_source(client, target, source)
    finally:
        client.close()
        release(target.uri)
    result = IngestResult(target.collection, target.uri, source, len(data), written, stored, seconds, writers,
                          parallel)
    if stop_after is None and stored != len(data):
        raise StoreError(
            f"collection {target.collection!r} holds {stored} rows of {source} but the source has {len(data)}; "
            "rerun the same ingest (it upserts) to repair it"
        )
    return result


def split_table(table, n_blocks: int) -> list:
    """Slices of a pyarrow table, one Ray Data block each (no repartition task needed)."""
    n_blocks = max(1, min(n_blocks, table.num_rows))
    step = -(-table.num_rows // n_blocks)
    return [table.slice(i, step) for i in range(0, table.num_rows, step)]


def actor_resources(workers: int) -> tuple[float, int]:
    """(CPUs each encoding actor asks for, torch threads it uses).

    Actors asking 1 CPU each on a small box leave nothing for Ray Data's other
    tasks and the pipeline hangs; one CPU always stays free.
    """
    import ray

    cpus = max(1.0, float(ray.cluster_resources().get("CPU", 1)))
    actor_cpus = max(0.1, min(1.0, (cpus - 1) / workers)) if cpus > 1 else 0.5 / workers
    return round(actor_cpus, 3), max(1, int(cpus // workers))


def _count_source(client, target: MilvusTarget, source: str) -> int:
    count_rows(client, target.collection, target.timeout)  # flushes
    res = client.query(target.collection, filter=f'source == "{source}"', output_fields=["count(*)"],
                       consistency_level="Strong", timeout=target.timeout)
    return int(res[0]["count(*)"])


def _write_from_driver(ds, target, n_bits, source, total, progress, stop_after, write_batch) -> int:
    from tqdm.auto import tqdm

    client = target.connect()
    written = 0
    try:
        bar = tqdm(total=total, desc=f"ingest {target.collection}", unit="doc", disable=not progress)
        for batch in ds.iter_batches(batch_size=write_batch, batch_format="numpy"):
            rows = make_rows(batch["id"], np.asarray(batch["code"], dtype=np.uint8), n_bits, batch["label"],
                             [str(t) for t in batch["text"]], source, batch["row"])
            written += upsert_rows(client, target.collection, rows, target.timeout)
            bar.update(len(rows))
            if stop_after is not None and written >= stop_after:
                break
        bar.close()
    finally:
        client.close()
        release(target.uri)
    return written


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``ray job submit ... -- python -m jobs.ingest``: the CLI's ingest."""
    from dhim_ray.cli import app

    app(["ingest", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
