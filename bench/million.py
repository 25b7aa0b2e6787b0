"""A million documents: the generated corpus, streaming ingest and exact search at scale.

    python -m bench.million corpus --docs 1000000          # bench/.cache/million (not committed)
    python -m bench.million search --n-codes 1000000       # hamming_topk vs faiss, 16/64/128 bits
    python -m bench.million eval --queries 10000           # precision@100, 10k x 1M: time, peak memory
    python -m bench.million ingest --docs 10000 1000000    # tiny BERT: driver/worker peak memory, docs/s
    python -m bench.million interrupt --docs 1000000       # Ctrl-C mid-ingest, rerun: exact count
    python -m bench.million interrupt --docs 10000000 --after 300 --precomputed --no-text-index
                                                           # the same, the write path alone
    python -m bench.million interrupt --docs 10000000 --after 300 --precomputed --server
                                                           # the same into the tests' Milvus server
    python -m bench.million hybrid --docs 1000000          # with and without the text index: ingest,
                                                           # disk, codes-only vs hybrid search latency
    python -m bench.million write --docs 1000000 --no-text-index   # the write path alone (codes
                                                           # precomputed): rows/s, peaks, verification,
                                                           # Ctrl-C + rerun
    python -m bench.million digests --rows 1000000 3000000 # a rerun's start: the driver's own memory as
                                                           # the collection grows (parts vs whole)
    python -m bench.million reopen --docs 1000000          # hybrid's two files opened again: the time to
                                                           # the first answer (milvus-lite loads on open)
    python -m bench.million upsert --rows 4000000          # milvus-lite's insert and upsert rates as the
                                                           # collection grows (our rows, 500 a call)
    python -m bench.million columns --docs 200000          # the write path, rows sent by column (as the
                                                           # connector does) against by row (as before)
    python -m bench.million pipeline --docs 200000         # the ingest with the encoder bypassed: the
                                                           # driver's CPU per row, against bare insert loops
    python -m bench.million server-writers --docs 200000   # the same into the tests' Milvus server at 1, 2
                                                           # and 4 write tasks, against a bare insert loop

The corpus is generated deterministically from the dev corpora's text (../shared/data):
document i takes a random dev document (its corpus and label are the label) and
shuffles its words with a seeded generator, so anyone with ../shared rebuilds the same
bytes. Past a million, the million's shards are linked again in order (rows 1,000,000 on
repeat the texts of rows 0 on; their row numbers, and so their ids, are new). It is written as 100k-row Parquet shards under ``train/``. Results are appended
to bench/million.json; ``python -m bench.report`` puts them in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA, busy_cpu_s, file_bytes, record_key, remove
from dhim_ray.search import SearchRequest

CACHE = Path(__file__).resolve().parent / ".cache" / "million"
RESULTS = Path(__file__).resolve().parent / "million.json"
SHARD_ROWS = 100_000
logger = logging.getLogger("bench.million")


def record(key: str, value: dict) -> None:
    record_key(RESULTS.stem, key, value)


# ---- corpus ---------------------------------------------------------------------------
def corpus_dir(n_docs: int) -> Path:
    return CACHE / f"corpus-{n_docs}"


def make_corpus(n_docs: int, seed: int = 0) -> Path:
    """Parquet shards of ``n_docs`` generated documents (skipped when already built)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec

    out = corpus_dir(n_docs)
    if (out / "done").exists():
        return out
    if n_docs > 1_000_000 and n_docs % 1_000_000 == 0:  # the million's shards, linked again (no new bytes)
        shards = sorted((make_corpus(1_000_000, seed) / "train").glob("*.parquet"))
        (out / "train").mkdir(parents=True, exist_ok=True)
        for i in range(n_docs // SHARD_ROWS):
            link = out / "train" / f"part-{i:05d}.parquet"
            if not link.exists():
                os.link(shards[i % len(shards)], link)
        (out / "done").write_text(str(n_docs))
        return out
    if not DATA.exists():
        raise SystemExit(f"{DATA} is missing: the generated corpus is built from the dev corpora there")
    words, labels = [], []
    for name in ("dbpedia", "agnews", "20ng", "r8"):
        split = load_split(CorpusSpec(str(DATA / name), "train"))
        words += [t.split()[:120] for t in split.texts]
        labels += [f"{name}:{v}" for v in split.labels]
    rng = np.random.default_rng(seed)
    (out / "train").mkdir(parents=True, exist_ok=True)
    for start in range(0, n_docs, SHARD_ROWS):
        n = min(SHARD_ROWS, n_docs - start)
        pick = rng.integers(0, len(words), n)
        texts = []
        for j in pick:
            w = list(words[j])
            rng.shuffle(w)
            texts.append(" ".join(w[: max(8, len(w) // 2)]))
        pq.write_table(pa.table({"text": texts, "label": [labels[j] for j in pick]}),
                       out / "train" / f"part-{start // SHARD_ROWS:05d}.parquet", row_group_size=10_000)
    (out / "done").write_text(str(n_docs))
    return out


# ---- models ---------------------------------------------------------------------------
def tiny_model(bits: int = 64) -> Path:
    """A 2-layer, 32-wide BERT with MiniLM's tokenizer, and a DHIM head trained 2 epochs on
    5k generated documents: the pipeline's own overhead, with learned codes."""
    out = CACHE / f"tiny-dhim-{bits}"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dhim_ray.config import DEFAULT_ENCODER, config_for_bits
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.encoding.encoder import resolve_encoder
    from dhim_ray.training.pipeline import train_corpus

    bert = CACHE / "tiny-bert"
    tok = AutoTokenizer.from_pretrained(resolve_encoder(DEFAULT_ENCODER))
    tok.save_pretrained(bert)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)).save_pretrained(bert)
    cfg = config_for_bits(bits, features={"encoder": str(bert)}, train={"max_epochs": 2})
    train_corpus(CorpusSpec(str(make_corpus(5000, seed=1)), limit=5000), cfg, out, progress=False)
    return out


def bench_digests(sizes: list[int]) -> dict:
    """A rerun's start as the collection grows: one milvus-lite file of our rows (64-bit codes, 60
    words of text and a digest each, the ids ``document_ids`` gives, no text index) grown to each
    size in ``sizes``; at each, fresh processes read the source's stored ids and digests as a
    rerun does, 'parts' (each part put into Ray's object store as it is read: the shipped way) and
    'whole' (every part held, joined, then put: as before), and 'by-source' (the same rows paged
    through by a filter on their source, as before, not their ids' range: its time only). Reported:
    each process' own peak (PeakMemory.own, Ray's shared pages left out) above what it held before
    the read, and the seconds of the read."""
    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import IndexSpec, MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids

    CACHE.mkdir(parents=True, exist_ok=True)
    db = CACHE / "digests.db"
    for f in CACHE.glob(f"{db.name}*"):
        remove(f)
    rng = np.random.default_rng(0)
    vocabulary = np.array([f"w{i}" for i in range(5000)])
    texts = np.array([" ".join(rng.choice(vocabulary, 60)) for _ in range(10_000)], dtype=object)
    ways = ("parts", "whole", "by-source")
    out: dict = {"sizes": [], "parts_mib": [], "whole_mib": [], "parts_s": [], "by_source_s": []}
    held = 0
    try:
        for size in sorted(sizes):
            with MilvusTarget(str(db), "docs", timeout=3600).open() as c:
                c.ensure(64, "bench:digests", IndexSpec(), text_index=False)
                while held < size:
                    n = min(5000, size - held)
                    rows = np.arange(held, held + n)
                    batch = {"id": document_ids(DIGESTS_SOURCE, rows), "row": rows,
                             "code": rng.integers(0, 256, (n, 8), dtype=np.uint8), "label": np.zeros(n, np.int64),
                             "text": texts[rows % len(texts)], "digest": rng.integers(1, 2**62, n, dtype=np.int64)}
                    held += c.upsert(code_rows(batch, 64, DIGESTS_SOURCE), new=True)
            release(str(db))
            row = {}
            for way in ways:  # a fresh process each: peak memory is per process
                done = subprocess.run([sys.executable, "-m", "bench.million", "_digests", "--db", str(db), "--way", way],
                                      capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
                row[way] = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
                if row[way]["rows"] != size:
                    raise SystemExit(f"{way}: read {row[way]['rows']} rows of {size}")
            out["sizes"].append(size)
            for way in ("parts", "whole"):
                out[f"{way}_mib"].append(row[way]["own_growth"] / 2**20)
            out["parts_s"].append(row["parts"]["seconds"])
            out["by_source_s"].append(row["by-source"]["seconds"])
            logger.info("%d rows: driver +%.0f MiB in parts, +%.0f MiB whole; read in %.1f s by the ids' range, "
                        "%.1f s by source", size, out["parts_mib"][-1], out["whole_mib"][-1], out["parts_s"][-1],
                        out["by_source_s"][-1])
    finally:
        release(str(db))
        for f in CACHE.glob(f"{db.name}*"):
            remove(f)
    return out


DIGESTS_SOURCE = "bench:digests"


def _read_digests(db: str, way: str) -> dict:
    import ray

    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.jobs.ray_env import init_ray

    init_ray(num_cpus=1)
    with MilvusTarget(db, "docs", timeout=3600).open(create=False) as c, PeakMemory(every=0.02) as peak:
        c.count()  # loaded: the read alone is timed
        time.sleep(0.1)
        before, t0, n = peak.own, time.perf_counter(), 0
        refs, parts = [], []
        if way == "by-source":  # the previous read: a filter on the source, in the rows' JSON document
            it = c.client.query_iterator("docs", batch_size=16384, output_fields=["id", "doc"], timeout=3600,
                                         filter=f'doc["source"] == "{DIGESTS_SOURCE}" and doc["digest"] != 0')
            while page := it.next():
                n += len(page)
            it.close()
        for ids, digests in () if way == "by-source" else c.digests(DIGESTS_SOURCE):
            n += len(ids)
            if way == "parts":
                refs.append((int(ids[0]), int(ids[-1]), ray.put((ids, digests))))
            else:
                parts.append((ids, digests))
        if way == "whole":
            refs.append(ray.put((np.concatenate([i for i, _ in parts]), np.concatenate([d for _, d in parts]))))
        seconds = time.perf_counter() - t0
        time.sleep(0.1)
    return {"own_growth": peak.own - before, "parts": len(refs), "rows": n, "seconds": seconds}


# ---- memory ---------------------------------------------------------------------------
class PeakMemory:
    """Peak resident memory of this process and of every Ray worker process, sampled. ``own``:
    this process' peak without the pages of Ray's object store it maps (RssShmem), which count
    towards its resident size as it reads blocks but are the store's, bounded by its size."""

    def __init__(self, every: float = 0.5):
        self.every, self.workers, self.store, self.own = every, 0, 0, 0  # store: the milvus-lite server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            mine = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
            self.own = max(self.own, sum(int(mine.get(f, "0 kB").split()[0]) for f in ("RssAnon", "RssFile")) * 1024)
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == os.getpid():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    store = b"milvus" in cmd.split(b"\0")[0]
                    if b"ray::" not in cmd and b"default_worker.py" not in cmd and not store:
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")), 0)
                if store:
                    self.store = max(self.store, hwm * 1024)
                else:
                    self.workers = max(self.workers, hwm * 1024)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @staticmethod
    def driver() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- commands ---------------------------------------------------------------------------
def bench_search(n_codes: int, bits_list: list[int], n_queries: int, k: int) -> None:
    import faiss

    from dhim_ray.retrieval.metrics import hamming_topk

    rng = np.random.default_rng(0)
    for bits in bits_list:
        # Learned codes are far from uniform: draw from 4k centres with 5% bit noise so the
        # top-100 has real ties, as DHIM codes do.
        centres = rng.integers(0, 2, (4096, bits), dtype=np.uint8)
        db = np.packbits(centres[rng.integers(0, 4096, n_codes)] ^ (rng.random((n_codes, bits)) < 0.05), axis=1)
        q = np.packbits(centres[rng.integers(0, 4096, n_queries)] ^ (rng.random((n_queries, bits)) < 0.05), axis=1)
        index = faiss.IndexBinaryFlat(bits)  # as a user would: defaults
        index.add(db)
        index.search(q[:10], k)
        hamming_topk(db, q[:10], k)
        faiss_s = ours_s = float("inf")
        for _ in range(3):  # best of 3, alternating, so a busy moment hurts neither side alone
            t0 = time.perf_counter()
            fd, fi = index.search(q, k)
            faiss_s = min(faiss_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            idx, dist = hamming_topk(db, q, k)  # index built inside: counted
            ours_s = min(ours_s, time.perf_counter() - t0)
        same_dist = bool(np.array_equal(dist, np.sort(fd, axis=1)))
        # Same neighbours once faiss' ties are put in database order; and brute force on 50 queries.
        key = np.sort(fd.astype(np.int64) << 40 | fi, axis=1)
        same_idx = bool(np.array_equal(idx, key & ((1 << 40) - 1)))
        full = np.zeros((50, n_codes), np.int32)
        dbw, qw = np.unpackbits(db, axis=1), np.unpackbits(q[:50], axis=1)
        for s in range(0, n_codes, 100_000):
            full[:, s:s + 100_000] = (qw[:, None, :] != dbw[None, s:s + 100_000, :]).sum(-1)
        brute = np.argsort(full, axis=1, kind="stable")[:, :k]
        record(f"search_{bits}", {
            "n_codes": n_codes, "bits": bits, "queries": n_queries, "k": k,
            "faiss_qps": n_queries / faiss_s, "hamming_topk_qps": n_queries / ours_s,
            "ratio": faiss_s / ours_s, "same_distances": same_dist, "same_neighbours_as_faiss_tie_sorted": same_idx,
            "equal_to_brute_force_50_queries": bool(np.array_equal(idx[:50], brute)),
        })
        del full, dbw


def bench_eval(n_codes: int, eval_queries: int, k: int) -> None:
    """Eval at scale: 10k queries against 1M 64-bit codes, peak memory of the process
    (run alone: nothing else in it allocates more)."""
    from dhim_ray.retrieval.metrics import precision_at_k

    rng = np.random.default_rng(0)
    bits = 64
    db = np.packbits(rng.integers(0, 2, (n_codes, bits), dtype=np.uint8), axis=1)
    q = np.packbits(rng.integers(0, 2, (eval_queries, bits), dtype=np.uint8), axis=1)
    labels, q_labels = rng.integers(0, 10, n_codes), rng.integers(0, 10, eval_queries)
    before = PeakMemory.driver()
    t0 = time.perf_counter()
    r = precision_at_k(db, labels, q, q_labels, k)
    record("eval_10k_x_1m", {"n_codes": n_codes, "queries": eval_queries, "bits": bits, "k": k,
                             "seconds": time.perf_counter() - t0, "p_at_k_tie_aware": r.precision_at_k_tie_aware,
                             "peak_rss_before_gib": before / 2**30, "peak_rss_after_gib": PeakMemory.driver() / 2**30,
                             "inputs_gib": (db.nbytes + q.nbytes + labels.nbytes) / 2**30})


class StoredCodes:
    """The bench hook that bypasses the encoder (``--precomputed``): it takes the place of
    jobs/ingest.py's ``CodeEncoder`` in the ingest's encoding actors and gives each row a
    64-bit code drawn from its row number around bench/store.py's clustered centres, so the
    rest of the ingest (scan, the writes, verification, the ledger) runs as it does for a
    user, at sizes an encoder would take hours to reach. Not a product flag: only a bench
    process that swaps the class in gets it."""

    def __init__(self, model_dir: str, **_):
        from dhim_ray.hasher import Hasher

        self.n_bytes = Hasher.check(model_dir).n_bits // 8
        self.centres = np.random.default_rng(0).integers(0, 256, (65536, self.n_bytes), dtype=np.uint8)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = np.asarray(batch["row"], dtype=np.int64)
        # each row's noise from a hash of its row number alone, as an encoder's code depends on its
        # document alone: a rerun that cuts the rows into other batches makes the same codes
        bit = np.arange(self.n_bytes * 8, dtype=np.uint64)
        h = rows.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) + bit * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
        noise = np.packbits(h % np.uint64(1000) < 60, axis=1)
        batch["code"] = self.centres[(rows * 2654435761) % len(self.centres)] ^ noise
        return batch


def run_ingest(n_docs: int, model: Path, uri: str, collection: str, workers: int,
               text_index: bool | None = None, precomputed: bool = False, corpus: Path | None = None,
               write_batch: int = 2000, write_tasks: int | None = None) -> dict:
    """One ingest in this process (run it in a fresh one: peak memory is per process).
    ``precomputed``: the encoder is bypassed (StoredCodes). ``corpus``: a folder of Parquet
    parts holding ``n_docs`` rows (default: the generated corpus)."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.jobs import ingest as job
    from dhim_ray.jobs.ray_env import init_ray

    if precomputed:
        job.CodeEncoder = StoredCodes
    init_ray(None)
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    corpus = CorpusSpec(str(corpus or make_corpus(n_docs)), "train")
    from dhim_ray.hasher import Hasher

    Hasher.check(model)  # the model's check and its imports (transformers: ~2 s of CPU) once, before the clock
    t0, cpu0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
    with PeakMemory() as peak:
        result = job.run_ingest(job.IngestRequest(corpus, model, MilvusTarget(uri, collection, timeout=3600), workers=workers, batch_size=256, write_batch=write_batch, text_index=text_index, write_tasks=write_tasks), progress=False)
    driver_cpu = time.process_time() - cpu0  # every thread of the driver's process: Ray's own included
    writer_cpu = time.thread_time() - own0  # the thread that runs the ingest and writes the rows: the serial part
    return {"docs": n_docs, "workers": workers, "docs_per_s": result.docs_per_second, "seconds": result.seconds,
            "driver_cpu_s": driver_cpu, "driver_cpu_us_per_row": driver_cpu / n_docs * 1e6,
            "writer_cpu_s": writer_cpu, "writer_cpu_us_per_row": writer_cpu / n_docs * 1e6,
            # after the last write: stale rows, the two counts, the ledger
            "verify_s": time.perf_counter() - t0 - result.seconds,
            "rows_in_collection": result.rows_in_collection, "rows_of_source": result.rows_of_source,
            "rows_written": result.rows_written, "rows_unchanged": result.rows_unchanged,
            "verified": result.verified, "driver_peak_gib": PeakMemory.driver() / 2**30,
            "driver_own_peak_gib": peak.own / 2**30,
            "worker_peak_gib": peak.workers / 2**30, "store_peak_gib": peak.store / 2**30}


def child(args: list[str], timeout: float | None = None, interrupt_after: float | None = None) -> dict | None:
    """Run ``python -m bench.million _one ...`` and return its JSON line (None if interrupted)."""
    # A bench started in the background (`cmd &`) inherits SIGINT ignored, and so would the
    # child: give it Python's own Ctrl-C handling back, or the interrupt below does nothing.
    proc = subprocess.Popen([sys.executable, "-m", "bench.million", "_one", *args], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1],
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines and proc.returncode == 0 else None


def count_collection(uri: str | Path, collection: str) -> dict:
    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import CodeCollection, MilvusTarget

    target = MilvusTarget(str(uri), collection, timeout=3600)
    t0 = time.perf_counter()
    client = target.connect(create=False)
    try:
        if not client.has_collection(collection):  # an ingest stopped before it made one
            return {"count": 0, "distinct_ids": 0, "open_to_count_s": time.perf_counter() - t0}
        n = CodeCollection(client, collection, timeout=3600).count()
        first_answer_s = time.perf_counter() - t0  # milvus-lite loads the file's collection before it answers
        ids = set()
        last = -1
        while True:  # page by primary key: every id once, duplicates would show as n > len(ids)
            page = client.query(collection, filter=f"id > {last}", output_fields=["id"], limit=16384)
            if not page:
                break
            ids.update(r["id"] for r in page)
            last = max(r["id"] for r in page)
        return {"count": n, "distinct_ids": len(ids), "open_to_count_s": first_answer_s}
    finally:
        client.close()
        release(target.uri)



def interrupt_then_rerun(uri: str, n_docs: int, after: float, workers: int, extra: tuple[str, ...] = ()) -> dict:
    """Ctrl-C an ingest after ``after`` seconds, count what it left, rerun it to the end:
    the rerun's figures, and the final count and distinct ids (duplicates would show)."""
    args = [str(n_docs), uri, "docs", "--workers", str(workers), *extra]
    first = child(args, interrupt_after=after)
    partial = count_collection(uri, "docs")
    if first is not None or partial["count"] >= n_docs:
        logger.warning("the first ingest finished before its Ctrl-C after %.0f s: nothing was interrupted; "
                       "rerun with a smaller --after", after)
    again = child(args)
    return {"interrupted_after_s": after, "first_completed": first is not None, "rows_after_interrupt": partial,
            "rerun": again, "final": count_collection(uri, "docs")}


def bench_hybrid(n_docs: int, workers: int, n_queries: int) -> dict:
    """The same ingest with and without the text index (docs/s, file bytes per document), then
    one query at a time through Searcher on the indexed file: codes-only against hybrid, p50/p99.
    Queries: the first 8 words of seeded random documents of the corpus."""
    import pyarrow.parquet as pq

    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.search import Searcher

    model, corpus = tiny_model(), make_corpus(n_docs)
    out: dict = {"docs": n_docs, "workers": workers}
    for text_index in (False, True):
        db = CACHE / f"hybrid-{n_docs}-{'text' if text_index else 'codes'}.db"
        for f in CACHE.glob(f"{db.name}*"):
            remove(f)
        result = child([str(n_docs), str(db), "docs", "--workers", str(workers),
                        "--text-index" if text_index else "--no-text-index"])
        key = "with_text_index" if text_index else "codes_only"
        out[key] = {**result, "file_bytes": file_bytes(db), "bytes_per_doc": file_bytes(db) / n_docs}
    texts = pq.read_table(sorted((corpus / "train").glob("*.parquet"))[0], columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(0)
    queries = [" ".join(texts[i].split()[:8]) for i in rng.choice(len(texts), n_queries, replace=False)]
    with Searcher(model, MilvusTarget(str(db), "docs", timeout=600)) as searcher:
        for mode in ("codes", "hybrid", "codes", "hybrid"):  # each twice: the second pass is the one kept
            ms = []
            for q in queries:
                t0 = time.perf_counter()
                searcher.run(SearchRequest([q], k=10, mode=mode))
                ms.append((time.perf_counter() - t0) * 1e3)
            out[f"{mode}_p50_ms"], out[f"{mode}_p99_ms"] = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    out["hybrid_over_codes_p50"] = out["hybrid_p50_ms"] / out["codes_p50_ms"]
    out["ingest_rate_ratio"] = out["with_text_index"]["docs_per_s"] / out["codes_only"]["docs_per_s"]
    out["bytes_ratio"] = out["with_text_index"]["file_bytes"] / out["codes_only"]["file_bytes"]
    return out


def bench_write(n_docs: int, workers: int, after: float, n_queries: int, text_index: bool) -> dict:
    """The write path alone at ``n_docs`` (codes precomputed; ``text_index``: the collection keeps
    one, as a new milvus-lite file does by default): an ingest into a new file (rows/s, peaks,
    verification, bytes per document, the time a reopened file takes to answer, search on it),
    then another Ctrl-C'd after ``after`` seconds and rerun to the exact count."""
    import pyarrow.parquet as pq

    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.search import Searcher

    model, corpus = tiny_model(), make_corpus(n_docs)
    out: dict = {"docs": n_docs, "workers": workers, "text_index": text_index}
    extra = ("--precomputed", "--text-index" if text_index else "--no-text-index")
    for name in ("write", "interrupt"):
        for f in CACHE.glob(f"{name}-{n_docs}.db*"):
            remove(f)
    db = CACHE / f"write-{n_docs}.db"
    run = child([str(n_docs), str(db), "docs", "--workers", str(workers), *extra])
    out["ingest"] = {**run, **count_collection(db, "docs"), "bytes_per_doc": file_bytes(db) / n_docs}
    logger.info("ingest: %s", out["ingest"])
    texts = pq.read_table(sorted((corpus / "train").glob("*.parquet"))[0], columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(0)
    queries = [" ".join(texts[i].split()[:8]) for i in rng.choice(len(texts), n_queries, replace=False)]
    with Searcher(model, MilvusTarget(str(db), "docs", timeout=3600)) as searcher:
        for mode in ("codes", "hybrid", "codes", "hybrid") if text_index else ("codes", "codes"):
            ms = []  # each mode twice: the second pass is the one kept
            for q in queries:
                t0 = time.perf_counter()
                searcher.run(SearchRequest([q], k=10, mode=mode))
                ms.append((time.perf_counter() - t0) * 1e3)
            out[f"{mode}_p50_ms"], out[f"{mode}_p99_ms"] = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    db.unlink()
    if after > 0:  # --after 0: no interrupted run
        out["interrupt"] = interrupt_then_rerun(str(CACHE / f"interrupt-{n_docs}.db"), n_docs, after, workers, extra)
    for f in CACHE.glob(f"interrupt-{n_docs}.db*"):
        remove(f)
    return out


def bench_upsert(n_rows: int, probe: int = 50_000, every: int = 1_000_000, uri: str | None = None,
                 text_index: bool = False, max_step_s: float = 600.0, text_store: str | None = None) -> dict:
    """The store's write rates as a collection of our rows grows: insert ``n_rows`` rows, 500 a
    call as the ingest's driver writes them (the rate of each ``every``), and at 0 rows and at
    ``n_rows`` rows time ``probe`` rows through upsert and through insert (ids not yet held).
    ``uri``: a Milvus server's (whose write tasks upsert every row); else a new milvus-lite file.
    ``text_index``: the collection keeps a BM25 index over the text, as a new file does, in
    ``text_store`` (file: tantivy beside the file, the default; milvus: the server's layout, Milvus'
    BM25, on milvus-lite's own server: a collection bound with no file). A step
    that takes over ``max_step_s`` ends the growth there (the rows held, then the probes); a
    milvus-lite file is then opened in a fresh process and timed to its first answers."""
    import pyarrow.parquet as pq

    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import CodeCollection, IndexSpec, MilvusTarget
    from dhim_ray.connectors.rows import code_rows

    texts = pq.read_table(sorted((make_corpus(1_000_000) / "train").glob("*.parquet"))[0],
                          columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(0)
    db = CACHE / f"upsert-{n_rows}.db"
    for f in CACHE.glob(f"{db.name}*"):
        remove(f)
    lite = uri is None
    uri = str(db) if lite else uri

    def rows(start: int, n: int) -> dict[str, list]:
        batch = {"id": np.arange(start, start + n, dtype=np.int64), "row": np.arange(start, start + n),
                 "code": rng.integers(0, 256, (n, 8), dtype=np.uint8), "label": np.zeros(n, np.int64),
                 "text": np.array([texts[(start + i) % len(texts)] for i in range(n)], dtype=object)}
        return code_rows(batch, 64, "bench:upsert")

    def rate(collection, start: int, n: int, new: bool, budget: float = float("inf")) -> tuple[int, float]:
        """Rows written (at most ``budget`` seconds of them) and their rate."""
        t0 = time.perf_counter()
        done = 0
        while done < n and time.perf_counter() - t0 < budget:
            done += collection.upsert(rows(start + done, min(500, n - done)), new=new)
        return done, done / (time.perf_counter() - t0)

    out: dict = {"rows": n_rows, "probe": probe, "store": "milvus-lite" if lite else "Milvus 2.3 server",
                 "text_index": text_index, "every": every, "insert_rows_per_s_by_million": []}
    if text_index:
        out["text_store"] = text_store or ("file" if lite else "milvus")
    try:
        with MilvusTarget(uri, "docs", timeout=3600).open() as c:
            if text_index and text_store == "milvus":
                c = CodeCollection(c.client, "docs", 3600)
            c.ensure(64, "bench:upsert", IndexSpec(), text_index=text_index)
            out["at_0"] = {"upsert": rate(c, 10**12, probe, False)[1], "insert": rate(c, 2 * 10**12, probe, True)[1]}
            held = 0
            while held < n_rows:  # a step past max_step_s ends the growth where it got to
                step = min(every, n_rows - held)
                done, r = rate(c, held, step, True, max_step_s)
                held += done
                out["insert_rows_per_s_by_million"].append(r)
                logger.info("%d rows: %.0f rows/s", held, r)
                if done < step:
                    out["stopped_at"] = held
                    logger.info("a step took over %.0f s: stopped at %d rows", max_step_s, held)
                    break
            out["rows"] = held
            out["at_n"] = {"upsert": rate(c, 3 * 10**12, probe, False)[1], "insert": rate(c, 4 * 10**12, probe, True)[1]}
            out["count"] = c.count()
        if lite:
            release(str(db))
            out["reopen"] = child_json(f"import json, bench.million as m; print(json.dumps(m.first_answers({str(db)!r}, "
                                       f"'docs', {text_index})))")
            logger.info("reopened: %s", out["reopen"])
    finally:
        if lite:
            release(str(db))
        for f in CACHE.glob(f"{db.name}*"):
            remove(f)
    out["upsert_slowdown"] = out["at_0"]["upsert"] / out["at_n"]["upsert"]
    out["insert_over_upsert_at_n"] = out["at_n"]["insert"] / out["at_n"]["upsert"]
    logger.info("%s", out)
    return out


def first_answers(db: str, collection: str, text: bool) -> dict:
    """Seconds from opening a milvus-lite file in this process to its first count, its first
    search by code and (``text``) by words: what a one-shot ``dhim-ray search`` waits for."""
    from dhim_ray.connectors.milvus import MilvusTarget

    t0 = time.perf_counter()
    out = {}
    with MilvusTarget(db, collection, timeout=3600).open(create=False) as c:
        c.count()
        out["open_to_count_s"] = time.perf_counter() - t0
        c.search(np.zeros((1, 8), np.uint8), 64, 10)
        out["open_to_code_search_s"] = time.perf_counter() - t0
        if text:
            t1 = time.perf_counter()
            c.search_text(["the market rose after the company said its profit grew"], 10)
            out["text_search_s"] = time.perf_counter() - t1
            out["open_to_text_search_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()  # its common words' counts now known: a service's next query
            c.search_text(["the price of oil fell after the company said that its sales were down"], 10)
            out["next_text_search_s"] = time.perf_counter() - t1
    return out


def child_json(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def upsert_on_server(n_rows: int, probe: int, every: int, max_step_s: float) -> None:
    """bench_upsert on the tests' Milvus 2.3 server, in a network namespace of its own (the server
    listens on every interface)."""
    from bench.store import ensure_own_network, tests_server

    ensure_own_network("million")
    with tests_server(CACHE / "server-upsert") as uri:
        record(f"upsert_server_{n_rows}", bench_upsert(n_rows, probe, every, uri=uri, max_step_s=max_step_s))


def interrupt_on_server(n_docs: int, after: float, workers: int, precomputed: bool) -> None:
    """interrupt_then_rerun into the tests' Milvus 2.3 server (write tasks upsert every row), in a
    network namespace of its own, as upsert_on_server runs."""
    from bench.store import ensure_own_network, tests_server

    ensure_own_network("million")
    tiny_model()
    make_corpus(n_docs)
    with tests_server(CACHE / "server-interrupt") as uri:
        record(f"server_interrupt_rerun_{'codes_' * precomputed}{n_docs}",
               interrupt_then_rerun(uri, n_docs, after, workers, ("--precomputed",) * precomputed))


def bare_insert(n_docs: int, db: str, write_batch: int, text_index: bool) -> dict:
    """The same rows as a ``--precomputed`` ingest of the generated corpus writes (StoredCodes'
    codes, the texts, labels and ids), built in memory first, then inserted into a new
    collection of the same schema ``write_batch`` rows a call by a bare loop, twice: pymilvus'
    public ``insert`` of row dicts, and the connector's column write alone (no Ray, no driver)."""
    import pyarrow.parquet as pq

    from dhim_ray.connectors.connection import is_lite, release
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids, source_label
    from dhim_ray.connectors.schema import default_index
    from dhim_ray.corpus.spec import CorpusSpec

    model = tiny_model()
    table = pq.read_table(sorted((make_corpus(n_docs) / "train").glob("*.parquet")), columns=["text", "label"])
    texts, names = table.column("text").to_pylist(), table.column("label").to_pylist()
    label_of = {name: i for i, name in enumerate(sorted(set(names)))}
    rows = np.arange(n_docs, dtype=np.int64)
    corpus = CorpusSpec(str(corpus_dir(n_docs)), "train")
    source = source_label(f"{corpus.source_id}:{corpus.split}", f"{Path(corpus.name).name}:{corpus.split}")  # as ingest
    codes = StoredCodes(str(model))({"row": rows})["code"]
    ids = document_ids(source, rows)
    batches = []
    for start in range(0, n_docs, write_batch):
        cut = slice(start, start + write_batch)
        batches.append({"id": ids[cut], "row": rows[cut], "code": codes[cut], "text": texts[cut],
                        "label": [label_of[n] for n in names[cut]], "label_name": names[cut]})
    out: dict = {"docs": n_docs, "write_batch": write_batch, "text_index": text_index}
    for way in ("public_rows", "connector_columns"):
        for f in Path(db).parent.glob(f"{Path(db).name}*"):
            remove(f)
        with MilvusTarget(db, "docs", timeout=3600).open() as c:
            c.ensure(64, "bench:bare", default_index(db), text_index=text_index)
            built = [code_rows(b, 64, source) for b in batches]
            stored = [c._stored(r) for r in built]  # the fields as the collection keeps them (a JSON doc in a file)
            by_row = [[dict(zip(r, values)) for values in zip(*r.values())] for r in stored] \
                if way == "public_rows" else None
            t0, busy = time.perf_counter(), busy_cpu_s()
            for i, r in enumerate(built):
                if by_row is not None:
                    c.client.insert(c.name, by_row[i], timeout=3600)
                else:
                    c.upsert(r, new=True)
            seconds = time.perf_counter() - t0
            cpu = busy_cpu_s() - busy
            out[way] = {"rows_per_s": n_docs / seconds, "seconds": seconds, "count": c.count(),
                        "machine_cpu_us_per_row": cpu / n_docs * 1e6, "machine_cores_busy": cpu / seconds}
            if not is_lite(db):  # a server keeps it: the next way starts empty too
                c.client.drop_collection(c.name)
        release(db)
    for f in Path(db).parent.glob(f"{Path(db).name}*"):
        remove(f)
    return out


def bench_pipeline(n_docs: int, workers: int, write_batch: int = 500) -> dict:
    """The ingest's own ceiling on milvus-lite, the encoder bypassed: a ``--precomputed``
    ingest (scan, the stand-in codes, the driver's writes, verification) with the driver's
    CPU time per row, against bare insert loops of the same rows and write size (``bare_insert``),
    each in a fresh process."""
    tiny_model()
    make_corpus(n_docs)
    db = CACHE / f"pipeline-{n_docs}.db"
    for f in CACHE.glob(f"{db.name}*"):
        remove(f)
    runs = {}
    for n in (n_docs // 2, n_docs):  # two sizes: the driver's CPU per row is the slope, its fixed part apart
        make_corpus(n)
        busy, t0 = busy_cpu_s(), time.perf_counter()
        runs[n] = child([str(n), str(db), "docs", "--workers", str(workers), "--precomputed",
                         "--write-batch", str(write_batch)])
        runs[n]["machine_cpu_us_per_row"] = (busy_cpu_s() - busy) / n * 1e6
        runs[n]["machine_cores_busy"] = (busy_cpu_s() - busy) / (time.perf_counter() - t0)
        for f in CACHE.glob(f"{db.name}*"):
            remove(f)
    ingest, half = runs[n_docs], runs[n_docs // 2]
    ingest["driver_cpu_us_per_row_marginal"] = ((ingest["driver_cpu_s"] - half["driver_cpu_s"])
                                                / (n_docs - n_docs // 2) * 1e6)
    ingest["driver_cpu_fixed_s"] = ingest["driver_cpu_s"] - ingest["driver_cpu_us_per_row_marginal"] * n_docs / 1e6
    # the wall time's slope between the two sizes: the rate each further row goes at, the fixed part apart
    ingest["machine_cpu_us_per_row_marginal"] = ((ingest["machine_cpu_us_per_row"] * n_docs
                                                  - half["machine_cpu_us_per_row"] * (n_docs // 2)) / (n_docs - n_docs // 2))
    ingest["half"] = {k: half[k] for k in ("seconds", "docs_per_s", "machine_cpu_us_per_row", "machine_cores_busy")}
    slope = (ingest["seconds"] - half["seconds"]) / (n_docs - n_docs // 2)
    ingest["rows_per_s_marginal"], ingest["fixed_s"] = 1 / slope, ingest["seconds"] - slope * n_docs
    ingest["writer_cpu_us_per_row_marginal"] = ((ingest["writer_cpu_s"] - half["writer_cpu_s"])
                                                / (n_docs - n_docs // 2) * 1e6)
    done = subprocess.run([sys.executable, "-m", "bench.million", "_bare", str(n_docs), str(db), str(write_batch)],
                          stdout=subprocess.PIPE, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    bare = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    out = {"docs": n_docs, "workers": workers, "write_batch": write_batch, "ingest": ingest, "bare": bare,
           "over_public_rows": ingest["docs_per_s"] / bare["public_rows"]["rows_per_s"],
           "over_connector_columns": ingest["docs_per_s"] / bare["connector_columns"]["rows_per_s"],
           "marginal_over_connector_columns": ingest["rows_per_s_marginal"] / bare["connector_columns"]["rows_per_s"]}
    logger.info("%s", out)
    return out


def server_writers(n_docs: int, workers: int, write_tasks: list[int]) -> None:
    """The server path's write tasks: a ``--precomputed`` ingest into the tests' Milvus 2.3 server
    (codes only, BIN_IVF_FLAT) at each number of write tasks, each into a new collection in a fresh
    process, against a bare loop of pymilvus' public inserts of the same rows (2,000 a call, as a
    write task sends them) into the same server: its own insert rate from one client."""
    from bench.store import ensure_own_network, tests_server
    from dhim_ray.jobs.milvus_sink import BATCH_ROWS

    ensure_own_network("million")
    tiny_model()
    make_corpus(n_docs)
    with tests_server(CACHE / "server-writers") as uri:
        out: dict = {"docs": n_docs, "workers": workers, "write_batch": BATCH_ROWS, "ingest": {}}
        for n in write_tasks:
            out["ingest"][n] = child([str(n_docs), uri, f"docs_w{n}", "--workers", str(workers), "--precomputed",
                                      "--write-tasks", str(n)])
            logger.info("%d write tasks: %.0f docs/s", n, out["ingest"][n]["docs_per_s"])
        done = subprocess.run([sys.executable, "-m", "bench.million", "_bare", str(n_docs), uri, str(BATCH_ROWS),
                               "--no-text-index"], stdout=subprocess.PIPE, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1])
        out["bare"] = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    out["over_bare_public_rows"] = {n: r["docs_per_s"] / out["bare"]["public_rows"]["rows_per_s"]
                                    for n, r in out["ingest"].items()}
    logger.info("%s", out)
    record(f"server_writers_{n_docs}", out)


def bench_columns(n_docs: int, workers: int, rounds: int = 2) -> dict:
    """The write path alone (StoredCodes into milvus-lite, no text index, 500 rows a write as
    ingest's driver writes) with rows sent by column, as the connector sends them, against by
    row (pymilvus' public insert of row dicts, which packs them value by value): each a fresh
    ingest in a fresh process, alternated, best of ``rounds``."""
    tiny_model()
    make_corpus(n_docs)
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for mode in ("by_column", "by_row"):
            db = CACHE / f"columns-{n_docs}.db"
            for f in CACHE.glob(f"columns-{n_docs}.db*"):
                remove(f)
            result = child([str(n_docs), str(db), "docs", "--workers", str(workers), "--precomputed",
                            "--no-text-index", "--write-batch", "500", *(["--by-row"] if mode == "by_row" else [])])
            if mode not in best or result["docs_per_s"] > best[mode]["docs_per_s"]:
                best[mode] = result
            logger.info("%s: %.0f docs/s", mode, result["docs_per_s"])
    for f in CACHE.glob(f"columns-{n_docs}.db*"):
        remove(f)
    return {"docs": n_docs, "rounds": rounds, **best,
            "column_over_row": best["by_column"]["docs_per_s"] / best["by_row"]["docs_per_s"]}


def bench_reopen(n_docs: int) -> dict:
    """The files ``hybrid`` wrote, each opened in a fresh process: seconds to the first count
    (milvus-lite loads a file's collection on its first use after every open)."""
    out: dict = {"docs": n_docs}
    for kind in ("codes", "text"):
        db = CACHE / f"hybrid-{n_docs}-{kind}.db"
        if not db.exists():
            raise SystemExit(f"{db} is missing: run python -m bench million hybrid --docs {n_docs} first")
        code = f"import json, bench.million as m; print(json.dumps(m.count_collection({str(db)!r}, 'docs')))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1])
        out[f"{kind}_open_to_count_s"] = json.loads(done.stdout.strip().splitlines()[-1])["open_to_count_s"]
        logger.info("%s: %.0f s to the first count", db.name, out[f"{kind}_open_to_count_s"])
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("corpus")
    p.add_argument("--docs", type=int, default=1_000_000)
    p = sub.add_parser("search")
    p.add_argument("--n-codes", type=int, default=1_000_000)
    p.add_argument("--bits", type=int, nargs="+", default=[16, 64, 128])
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=100)
    p = sub.add_parser("eval")
    p.add_argument("--n-codes", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--k", type=int, default=100)
    p = sub.add_parser("ingest")
    p.add_argument("--docs", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("interrupt")
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--after", type=float, default=120.0, help="seconds before Ctrl-C")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precomputed", action="store_true", help="bypass the encoder (StoredCodes): the write path")
    p.add_argument("--text-index", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--server", action="store_true", help="into the tests' Milvus 2.3 server (a network namespace)")
    p = sub.add_parser("hybrid")
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--queries", type=int, default=200)
    p = sub.add_parser("write")
    p.add_argument("--docs", type=int, default=10_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--after", type=float, default=300.0, help="seconds before the second ingest's Ctrl-C (0: none)")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--text-index", action=argparse.BooleanOptionalAction, default=True)
    p = sub.add_parser("digests")
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000])
    p = sub.add_parser("_digests")
    p.add_argument("--db")
    p.add_argument("--way", choices=["parts", "whole", "by-source"])
    p = sub.add_parser("reopen")
    p.add_argument("--docs", type=int, default=1_000_000)
    p = sub.add_parser("upsert")
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--probe", type=int, default=50_000, help="rows timed through upsert and insert")
    p.add_argument("--server", action="store_true", help="the Milvus 2.3 server of the tests (in a network namespace)")
    p.add_argument("--every", type=int, default=1_000_000, help="rows per measured step of the insert rate")
    p.add_argument("--max-step-seconds", type=float, default=600.0, help="a slower step ends the growth there")
    p.add_argument("--text-index", action="store_true", help="the collection keeps a BM25 index (milvus-lite)")
    p.add_argument("--text-store", choices=("file", "milvus"), default=None,
                   help="where: tantivy beside the file (the default) or milvus-lite's own BM25")
    p = sub.add_parser("columns")
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("pipeline")
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--write-batch", type=int, default=500, help="rows per write (ingest's default)")
    p = sub.add_parser("server-writers")
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--write-tasks", type=int, nargs="+", default=[1, 2, 4])
    p = sub.add_parser("_bare")
    p.add_argument("docs", type=int)
    p.add_argument("db")
    p.add_argument("write_batch", type=int)
    p.add_argument("--text-index", action=argparse.BooleanOptionalAction, default=True)
    p = sub.add_parser("_one")
    p.add_argument("docs", type=int)
    p.add_argument("uri", help="a milvus-lite .db file or a server URI")
    p.add_argument("collection")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--text-index", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--precomputed", action="store_true", help="bypass the encoder (StoredCodes)")
    p.add_argument("--write-batch", type=int, default=2000, help="rows per write from the driver (milvus-lite)")
    p.add_argument("--write-tasks", type=int, default=None, help="Ray write tasks on a server")
    p.add_argument("--by-row", action="store_true", help="send rows as pymilvus' row dicts (bench columns)")
    args = ap.parse_args()
    if args.cmd == "corpus":
        print(make_corpus(args.docs))
    elif args.cmd == "search":
        bench_search(args.n_codes, args.bits, args.queries, args.k)
    elif args.cmd == "eval":
        bench_eval(args.n_codes, args.queries, args.k)
    elif args.cmd == "_one":
        if args.by_row:  # the write before the connector sent columns: pymilvus' public row insert
            from dhim_ray.connectors.milvus import CodeCollection

            CodeCollection._write = CodeCollection._write_rows
        print(json.dumps(run_ingest(args.docs, tiny_model(), args.uri, args.collection, args.workers,
                                    args.text_index, args.precomputed, write_batch=args.write_batch,
                                    write_tasks=args.write_tasks)))
    elif args.cmd == "pipeline":
        record(f"pipeline_{args.docs}", bench_pipeline(args.docs, args.workers, args.write_batch))
    elif args.cmd == "_bare":
        print(json.dumps(bare_insert(args.docs, args.db, args.write_batch, text_index=args.text_index)))
    elif args.cmd == "server-writers":
        server_writers(args.docs, args.workers, args.write_tasks)
    elif args.cmd == "columns":
        record(f"columns_{args.docs}", bench_columns(args.docs, args.workers))
    elif args.cmd == "ingest":
        tiny_model()
        for n in args.docs:
            make_corpus(n)
            db = CACHE / f"ingest-{n}.db"
            for f in CACHE.glob(f"ingest-{n}.db*"):
                remove(f)
            result = child([str(n), str(db), "docs", "--workers", str(args.workers)])
            record(f"ingest_tiny_{n}", {**result, **count_collection(db, "docs")})
    elif args.cmd == "write":
        record(f"write_{args.docs}_{'text' if args.text_index else 'codes'}",
               bench_write(args.docs, args.workers, args.after, args.queries, args.text_index))
    elif args.cmd == "digests":
        record("rerun_digests", bench_digests(args.rows))
    elif args.cmd == "_digests":
        print(json.dumps(_read_digests(args.db, args.way)))
    elif args.cmd == "reopen":
        record(f"reopen_{args.docs}", bench_reopen(args.docs))
    elif args.cmd == "upsert" and args.server:
        upsert_on_server(args.rows, args.probe, args.every, args.max_step_seconds)
    elif args.cmd == "upsert":
        store = (args.text_store or "file") if args.text_index else ""
        record(f"upsert_{'text_' * args.text_index}{store + '_' if store == 'file' else ''}{args.rows}",
               bench_upsert(args.rows, args.probe, args.every, text_index=args.text_index,
                            max_step_s=args.max_step_seconds, text_store=store or None))
    elif args.cmd == "hybrid":
        record(f"hybrid_{args.docs}", bench_hybrid(args.docs, args.workers, args.queries))
    elif args.cmd == "interrupt" and args.server:
        interrupt_on_server(args.docs, args.after, args.workers, args.precomputed)
    elif args.cmd == "interrupt":
        tiny_model()
        make_corpus(args.docs)
        db = CACHE / f"interrupt-{args.docs}.db"
        for f in CACHE.glob(f"interrupt-{args.docs}.db*"):
            remove(f)
        extra = ("--precomputed",) * args.precomputed + \
            (() if args.text_index is None else ("--text-index" if args.text_index else "--no-text-index",))
        record(f"interrupt_rerun_{'codes_' * args.precomputed}{args.docs}",
               interrupt_then_rerun(str(db), args.docs, args.after, args.workers, extra))
        for f in CACHE.glob(f"interrupt-{args.docs}.db*"):
            remove(f)


if __name__ == "__main__":
    main()
