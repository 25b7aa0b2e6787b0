"""The store alone at 1, 10 and 100 million 64-bit codes: milvus-lite (the embedded default)
against faiss in one process, on generated codes clustered as learned codes are.

    python -m bench store --n-codes 1000000 10000000      # -> bench/store.json
    python -m bench store --server --n-codes 1000000 10000000

For each size: load time (faiss: add; milvus-lite: insert, index, load), disk and resident
memory per code, top-10 and top-100 latency p50/p99 from 1 and 8 concurrent clients,
queries/s, recall@k against the exact scan (faiss IndexBinaryFlat), and faiss' IVF (nlist,
nprobe swept) as the index a bigger store would build. Codes are generated, not encoded: the
encoder's rate is measured elsewhere (python -m bench ingest_speed). milvus-lite keeps a
collection of id and code only here, so its figures are a floor for a dhim-ray collection,
which stores the text beside each code.

``--server``: the Milvus 2.3 standalone server of the tests (tests/milvus_server.py, the PyPI
package ``milvus``) in a network namespace of its own (the bench re-runs itself under
``unshare -n``; root and Linux), against faiss in the same run: BIN_FLAT, then BIN_IVF_FLAT
with nlist and nprobe swept; radius search (``--max-distance``) completeness against faiss'
exact range search on both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import record_key

CACHE = Path(__file__).resolve().parent / ".cache" / "store"
RESULTS = Path(__file__).resolve().parent / "store.json"
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


SERVER_NLISTS = (1024, 4096)
SERVER_NPROBES = (8, 32, 128)
SERVER_QUERIES = 200


def server_pid() -> int | None:
    """The Milvus standalone process (``milvus run standalone``)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args[0].endswith(b"milvus") and b"standalone" in args:
                return int(pid)
    return None


def radius_completeness(search_within, flat, queries: np.ndarray, radii: np.ndarray) -> float:
    """Mean over queries of (rows the store returns within R) / (rows within R by faiss' exact
    range search), R per query; the store asked for up to Milvus' 16,384 rows."""
    fractions = []
    for q, r in zip(queries, radii):
        _, dist, _ = flat.range_search(q[None], int(r) + 1)  # distance < R + 1: within R
        want = min(len(dist), 16384)
        got = search_within(q, int(r))
        fractions.append(got / want if want else 1.0)
    return round(float(np.mean(fractions)), 4)


@contextlib.contextmanager
def tests_server(base: Path):
    """The tests' Milvus 2.3 server (tests/milvus_server.py) with its data in a fresh ``base``, for
    the ``with`` block: yields its URI; stopped and its data removed after. Run it inside a network
    namespace of its own (``in_own_network``): it listens on every interface."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from milvus_server import URI, start_server

    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    server = start_server(base, authorization=False)
    try:
        yield URI
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def bench_server(n: int, nlists: tuple[int, ...] = SERVER_NLISTS, nprobes: tuple[int, ...] = SERVER_NPROBES) -> dict:
    """One size on the Milvus server: load, memory, BIN_FLAT and BIN_IVF_FLAT latency, recall and
    radius completeness, faiss' exact scan as the truth."""
    import faiss
    from pymilvus import DataType, MilvusClient

    db = codes(n, seed=1)
    queries = codes(SERVER_QUERIES, seed=2)
    flat = faiss.IndexBinaryFlat(BITS)
    flat.add(db)
    exact = {k: flat.search(queries, k)[0] for k in (10, 100)}
    faiss_top10 = latencies(flat.search, queries, 10, 1)
    radii = exact[100][:, -1]  # each query's 100th distance: a radius holding a hundred rows or more
    out: dict = {"n_codes": n, "bits": BITS, "queries": SERVER_QUERIES, "faiss_flat_top10_1c": faiss_top10}
    with tests_server(CACHE / f"server-{n}") as uri:
        client = MilvusClient(uri, timeout=3600)
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("code", DataType.BINARY_VECTOR, dim=BITS)
        client.create_collection("store", schema=schema)
        pid = server_pid()
        rss_before = rss_of(pid) if pid else 0
        t0 = step_t0 = time.perf_counter()
        step = max(INSERT_BATCH, n // 10 // INSERT_BATCH * INSERT_BATCH)  # the rate as the collection grows
        growth = {}
        for s in range(0, n, INSERT_BATCH):
            client.insert("store", [{"id": s + i, "code": row.tobytes()} for i, row in enumerate(db[s:s + INSERT_BATCH])])
            if (s + INSERT_BATCH) % step == 0 or s + INSERT_BATCH >= n:
                held = min(n, s + INSERT_BATCH)
                growth[held] = round((held - (max(growth) if growth else 0)) / (time.perf_counter() - step_t0))
                step_t0 = time.perf_counter()
                logger.info("server: %d codes held, inserting %d rows/s", held, growth[held])
        client.flush("store")
        out["insert_rows_per_s"] = round(n / (time.perf_counter() - t0))
        out["insert_rows_per_s_as_it_grows"] = growth
        out["server_rss_after_insert_bytes_per_code"] = round((rss_of(pid) - rss_before) / n, 1) if pid else None
        out["disk_bytes_per_code"] = round(sum(f.stat().st_size for f in (CACHE / f"server-{n}").rglob("*")
                                               if f.is_file()) / n, 1)

        def index(kind: str, **params) -> float:
            client.release_collection("store")
            for name in client.list_indexes("store"):
                client.drop_index("store", name)
            spec = client.prepare_index_params()
            spec.add_index(field_name="code", index_type=kind, metric_type="HAMMING", params=params)
            t0 = time.perf_counter()
            client.create_index("store", spec)
            client.load_collection("store")
            return round(time.perf_counter() - t0, 1)

        def searcher(params: dict):
            def search(q: np.ndarray, k: int):
                return client.search("store", data=[q[0].tobytes()], anns_field="code", limit=k,
                                     search_params={"metric_type": "HAMMING", "params": params})
            return search

        def recall(search, k: int) -> float:
            got = [[h["distance"] for h in search(q[None], k)[0]] for q in queries]
            return round(float(np.mean([np.mean(np.asarray(g[:k]) <= e[k - 1]) * len(g[:k]) / k
                                        for g, e in zip(got, exact[k])])), 4)

        def within(params: dict):
            def count(q: np.ndarray, r: int) -> int:
                hits = client.search("store", data=[q.tobytes()], anns_field="code", limit=16384,
                                     search_params={"metric_type": "HAMMING",
                                                    "params": {**params, "radius": r + 1, "range_filter": 0}})[0]
                return sum(1 for h in hits if h["distance"] <= r)
            return count

        entry = {"build_and_load_s": index("BIN_FLAT")}
        entry["server_rss_bytes_per_code"] = round((rss_of(pid) - rss_before) / n, 1) if pid else None
        search = searcher({})
        for k in (10, 100):
            entry[f"recall_at_{k}"] = recall(search, k)
            for clients in (1, 8):
                entry[f"top{k}_{clients}c"] = latencies(search, queries, k, clients)
        entry["radius_completeness"] = radius_completeness(within({}), flat, queries, radii)
        out["bin_flat"] = entry
        logger.info("server BIN_FLAT at %d: %s", n, entry)
        for nlist in nlists:
            entry = {"build_and_load_s": index("BIN_IVF_FLAT", nlist=nlist)}
            for nprobe in (p for p in nprobes if p <= nlist):
                search = searcher({"nprobe": nprobe})
                entry[f"nprobe{nprobe}"] = {"recall_at_100": recall(search, 100), **latencies(search, queries, 100, 1),
                                            "top100_8c": latencies(search, queries, 100, 8)}
            entry["radius_completeness_nprobe_nlist"] = radius_completeness(
                within({"nprobe": nlist}), flat, queries[:50], radii[:50])
            out[f"bin_ivf_flat{nlist}"] = entry
            logger.info("server BIN_IVF_FLAT nlist %d at %d: %s", nlist, n, entry)
        client.close()
    return out


def in_own_network(args: list[str], bench: str = "store") -> int:
    """Run ``python -m bench BENCH`` with ``args`` inside a network namespace of its own (the server
    listens on every interface; a fresh namespace for each size, so no port of the last server lingers)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise SystemExit("--server needs Linux, root, unshare and ip: the server runs in a network namespace")
    inner = f"ip link set lo up && DHIM_BENCH_NETNS=1 exec {sys.executable} -m bench {bench} " + " ".join(args)
    return subprocess.call(["unshare", "-n", "sh", "-c", inner], cwd=Path(__file__).resolve().parents[1])


def ensure_own_network(bench: str) -> None:
    """Return where this process already runs inside its own network namespace; else run this
    same bench command inside one (``in_own_network``) and exit with its status."""
    if os.environ.get("DHIM_BENCH_NETNS") != "1":
        raise SystemExit(in_own_network(sys.argv[1:], bench=bench))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench store", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-codes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--server", action="store_true", help="the Milvus 2.3 server of the tests, not milvus-lite")
    ap.add_argument("--nlist", type=int, nargs="+", default=list(SERVER_NLISTS), help="BIN_IVF_FLAT sizes (--server)")
    ap.add_argument("--nprobe", type=int, nargs="+", default=list(SERVER_NPROBES), help="lists probed (--server)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.server and os.environ.get("DHIM_BENCH_NETNS") != "1":
        for n in args.n_codes:
            if in_own_network(["--server", "--n-codes", str(n), "--nlist", *map(str, args.nlist),
                               "--nprobe", *map(str, args.nprobe)]):
                raise SystemExit(1)
        return
    for n in args.n_codes:
        key = f"{'server' if args.server else 'lite'}_vs_faiss_{n}"
        if args.server:  # IVF sizes measured in an earlier run stay beside this run's
            earlier = json.loads(RESULTS.read_text()).get(key, {}) if RESULTS.exists() else {}
            result = {**{k: v for k, v in earlier.items() if k.startswith("bin_ivf_flat")}, **bench_server(n, tuple(args.nlist), tuple(args.nprobe))}
        else:
            result = bench_size(n)
        record_key("store", key, result)
        logger.info("%s", result)


if __name__ == "__main__":
    main()
