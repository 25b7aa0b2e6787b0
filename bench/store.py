"""The store alone at 1, 10 and 100 million 64-bit codes: milvus-lite (the embedded default)
against faiss in one process, on generated codes clustered as learned codes are.

    python -m bench store --n-codes 1000000 10000000      # -> bench/store.json

For each size: load time (faiss: add; milvus-lite: insert, index, load), disk and resident
memory per code, top-10 and top-100 latency p50/p99 from 1 and 8 concurrent clients,
queries/s, recall@k against the exact scan (faiss IndexBinaryFlat), and faiss' IVF (nlist,
nprobe swept) as the index a bigger store would build. Codes are generated, not encoded: the
encoder's rate is measured elsewhere (python -m bench ingest_speed). milvus-lite keeps a
collection of id and code only here, so its figures are a floor for a dhim-ray collection,
which stores the text beside each code.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import record_key

CACHE = Path(__file__).resolve().parent / ".cache" / "store"
BITS = 64
CENTRES = 65536
NOISE = 0.06
QUERIES = 400
LITE_QUERIES = 100  # single searches of a brute-force scan: 10M codes take a while each
INSERT_BATCH = 50_000
logger = logging.getLogger("bench.store")


def codes(n: int, seed: int) -> np.ndarray:
    """``n`` packed codes drawn around 65,536 seeded centres, 6% of bits flipped: the top-100
    has real ties and real neighbours, as DHIM codes do."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).integers(0, 256, (CENTRES, BITS // 8), dtype=np.uint8)
    out = np.empty((n, BITS // 8), np.uint8)
    for s in range(0, n, 1_000_000):
        m = min(1_000_000, n - s)
        noise = np.packbits(rng.random((m, BITS)) < NOISE, axis=1)
        out[s:s + m] = centres[rng.integers(0, CENTRES, m)] ^ noise
    return out


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def lite_server_pid(uri: str) -> int | None:
    """The milvus-lite server process serving the file ``uri`` (its command line names it)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if b"milvus" in args[0] and any(Path(uri).name.encode() in a for a in args[1:]):
                return int(pid)
    return None


def latencies(search, queries: np.ndarray, k: int, clients: int) -> dict:
    """p50/p99 of single-query searches from ``clients`` threads, and queries/s overall."""
    took: list[float] = []
    lock = threading.Lock()

    def worker(part: np.ndarray) -> None:
        for q in part:
            t0 = time.perf_counter()
            search(q[None], k)
            with lock:
                took.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(p,)) for p in np.array_split(queries, clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = np.array(took) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "qps": round(len(queries) / wall, 1)}


def bench_size(n: int) -> dict:
    import faiss

    db = codes(n, seed=1)
    queries = codes(QUERIES, seed=2)
    out: dict = {"n_codes": n, "bits": BITS, "queries": QUERIES}

    t0 = time.perf_counter()
    flat = faiss.IndexBinaryFlat(BITS)
    flat.add(db)
    out["faiss_flat"] = {"load_s": round(time.perf_counter() - t0, 2), "bytes_per_code": BITS // 8}
    exact = {k: flat.search(queries, k)[0] for k in (10, 100)}
    for k in (10, 100):
        for clients in (1, 8):
            out["faiss_flat"][f"top{k}_{clients}c"] = latencies(flat.search, queries, k, clients)

    for nlist in (1024, 4096):
        t0 = time.perf_counter()
        ivf = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(BITS), BITS, nlist)
        ivf.train(db[np.random.default_rng(3).choice(n, min(n, nlist * 64), replace=False)])
        ivf.add(db)
        entry = {"build_s": round(time.perf_counter() - t0, 2)}
        for nprobe in (8, 32, 128):
            ivf.nprobe = nprobe
            dist, _ = ivf.search(queries, 100)
            within = (dist <= exact[100][:, -1:]).sum(1) / 100
            entry[f"nprobe{nprobe}"] = {"recall_at_100": round(float(np.mean(np.minimum(within, 1))), 4),
                                        **latencies(ivf.search, queries, 100, 1)}
        out[f"faiss_ivf{nlist}"] = entry

    out["milvus_lite"] = bench_lite(db, queries, exact)
    return out


def bench_lite(db: np.ndarray, queries: np.ndarray, exact: dict) -> dict:
    from pymilvus import DataType, MilvusClient

    folder = CACHE / f"lite-{len(db)}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    uri = str(folder / "store.db")
    client = MilvusClient(uri)
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("code", DataType.BINARY_VECTOR, dim=BITS)
    index = client.prepare_index_params()
    index.add_index(field_name="code", index_type="BIN_FLAT", metric_type="HAMMING")
    client.create_collection("store", schema=schema, index_params=index)
    pid = lite_server_pid(uri)
    rss_before = rss_of(pid) if pid else 0
    t0 = time.perf_counter()
    for s in range(0, len(db), INSERT_BATCH):
        part = db[s:s + INSERT_BATCH]
        client.insert("store", [{"id": s + i, "code": row.tobytes()} for i, row in enumerate(part)])
    insert_s = time.perf_counter() - t0
    client.load_collection("store")
    load_s = time.perf_counter() - t0
    out = {"insert_rows_per_s": round(len(db) / insert_s), "load_s": round(load_s, 1),
           "disk_bytes_per_code": round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / len(db), 1),
           # what the server process grew by, holding the loaded collection
           "server_rss_bytes_per_code": round((rss_of(pid) - rss_before) / len(db), 1) if pid else None,
           "queries": LITE_QUERIES}
    queries = queries[:LITE_QUERIES]

    def search(q: np.ndarray, k: int):
        return client.search("store", data=[q[0].tobytes()], anns_field="code", limit=k,
                             search_params={"metric_type": "HAMMING"})

    for k in (10, 100):
        got = [[h["distance"] for h in search(q[None], k)[0]] for q in queries]
        out[f"recall_at_{k}"] = round(float(np.mean([np.mean(np.sort(g)[:k] <= e[k - 1]) if len(g) == k else
                                                       len(g) / k for g, e in zip(got, exact[k])])), 4)
        for clients in (1, 8):
            out[f"top{k}_{clients}c"] = latencies(search, queries, k, clients)
    client.close()
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench store", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-codes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for n in args.n_codes:
        result = bench_size(n)
        record_key("store", f"lite_vs_faiss_{n}", result)
        logger.info("%s", result)


if __name__ == "__main__":
    main()
