"""The query service under load, against the in-process ``Searcher`` loop, on the demo
collection (the packaged BBC corpus, 64 bits, milvus-lite; built with the demo when missing).

    python -m bench.serve_load                 # writes bench/serve_load.json

1. In process: ``Searcher.run(SearchRequest([q], k=10))`` one query at a time, p50/p99, split into hash
   and Milvus; and ``dhim-ray search`` as a command (process start and model load included).
2. Over HTTP on 127.0.0.1: 1, 8 and 32 concurrent clients, each sending its share of a fixed
   number of one-text POST /search requests, with dynamic batching (32) and without (1).
   Bounded: ``--requests`` per level, every request with a 60 s timeout.
3. Mixed (``--only mixed`` runs it alone): 8 honest clients' one-text searches, alone and then
   beside 8 hostile clients each sending the largest request the service takes in a loop (256
   texts of common words at the most text work allowed, hybrid): the honest p50/p99 loaded over
   unloaded, same run.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bench.harness import HERE, device_name, write_result
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.search import SearchRequest


def percentiles(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def demo_collection(folder: Path) -> tuple[Path, MilvusTarget]:
    model, target = folder / "bbc-64", MilvusTarget(str(folder / "dhim_ray.db"), "bbc_64")
    if not (model / "config.json").exists() or not Path(target.uri).exists():
        from dhim_ray.jobs.demo import run_demo

        run_demo(folder, progress=False)
    return model, target


def in_process(model: Path, target: MilvusTarget, queries: list[str]) -> dict:
    from dhim_ray.search import Searcher

    hash_ms, milvus_ms, total_ms = [], [], []
    with Searcher(model, target) as s:
        for q in queries[:20]:  # warm-up
            s.run(SearchRequest([q], k=10))
        for q in queries:
            t0 = time.perf_counter()
            codes = s.hasher.encode([q])
            t1 = time.perf_counter()
            s.collection.search(codes, s.hasher.n_bits, 10, s.index, s.info.output_fields)
            t2 = time.perf_counter()
            hash_ms.append((t1 - t0) * 1e3)
            milvus_ms.append((t2 - t1) * 1e3)
        for q in queries:
            t0 = time.perf_counter()
            s.run(SearchRequest([q], k=10))
            total_ms.append((time.perf_counter() - t0) * 1e3)
    return {"searcher_search": {**percentiles(total_ms), "queries_per_s": round(1e3 / np.mean(total_ms), 1)},
            "hash": percentiles(hash_ms), "milvus": percentiles(milvus_ms), "queries": len(queries)}


def cli_search(model: Path, target: MilvusTarget, runs: int) -> dict:
    ms = []
    for i in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dhim_ray.cli", "-q", "search", f"query number {i} about oil prices",
                        "--model", str(model), "--uri", target.uri, "--collection", target.collection, "--json"],
                       check=True, capture_output=True, timeout=300)
        ms.append((time.perf_counter() - t0) * 1e3)
    return {**percentiles(ms), "runs": runs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(url: str, queries: list[str], clients: int, requests: int) -> dict:
    import httpx

    def client(share: list[str]) -> list[float]:
        ms = []
        with httpx.Client(timeout=60) as http:
            for q in share:
                t0 = time.perf_counter()
                r = http.post(url + "/search", json={"texts": [q], "k": 10})
                r.raise_for_status()
                ms.append((time.perf_counter() - t0) * 1e3)
        return ms

    shares = [[queries[(c + i * clients) % len(queries)] for i in range(requests // clients)] for c in range(clients)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        ms = [m for part in pool.map(client, shares) for m in part]
    seconds = time.perf_counter() - t0
    return {"clients": clients, "requests": len(ms), "queries_per_s": round(len(ms) / seconds, 1), **percentiles(ms)}


def over_http(model: Path, target: MilvusTarget, queries: list[str], requests: int, levels: list[int]) -> list[dict]:
    import httpx
    from ray import serve

    from dhim_ray.jobs.serve import ServeOptions
    from dhim_ray.jobs.service_life import start_service

    rows = []
    port = free_port()  # Serve keeps the HTTP address it first started with
    for batch in (32, 1):
        options = ServeOptions(str(model.resolve()), target.uri, target.collection, max_batch_size=batch)
        url = start_service(options, port=port)
        try:
            load(url, queries, 4, 40)  # warm-up
            for clients in levels:
                before = httpx.get(url + "/health", timeout=60).json()["encoder"]
                row = {"max_batch_size": batch, **load(url, queries, clients, requests)}
                after = httpx.get(url + "/health", timeout=60).json()["encoder"]
                passes = after["passes"] - before["passes"]
                row["requests_per_encoder_pass"] = round((after["requests"] - before["requests"]) / max(1, passes), 2)
                print(row, flush=True)
                rows.append(row)
        finally:
            serve.delete("dhim-ray")
            time.sleep(2)  # the replica lets go of the milvus-lite file
    return rows


def mixed(model: Path, target: MilvusTarget, queries: list[str], requests: int = 160) -> dict:
    """Honest one-text searches alone, then beside hostile clients sending the largest requests."""
    import threading

    import httpx
    from ray import serve

    from dhim_ray.connectors.lexical import MAX_TEXT_WORK
    from dhim_ray.jobs.serve import MAX_TEXTS, ServeOptions
    from dhim_ray.jobs.service_life import start_service

    # the most a request may ask: 256 texts of 48 words (6 distinct, each in most documents) at the
    # k that keeps texts x distinct words x k under MAX_TEXT_WORK
    words = ["the", "and", "of", "to", "in", "a"]
    hostile_body = {"texts": [" ".join(words * 8)] * MAX_TEXTS, "mode": "hybrid",
                    "k": MAX_TEXT_WORK // (MAX_TEXTS * len(words))}
    stop, done, failed = threading.Event(), [0], [0]

    def hostile() -> None:
        with httpx.Client(timeout=300) as http:
            while not stop.is_set():
                r = http.post(url + "/search", json=hostile_body)
                done[0] += r.status_code == 200
                failed[0] += r.status_code >= 500

    url = start_service(ServeOptions(str(model.resolve()), target.uri, target.collection), port=free_port())
    try:
        load(url, queries, 4, 40)  # warm-up
        alone = load(url, queries, 8, requests)
        threads = [threading.Thread(target=hostile, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(5)  # the hostile requests under way
        loaded = load(url, queries, 8, requests)
        stop.set()
        for t in threads:
            t.join(timeout=600)
    finally:
        serve.delete("dhim-ray")
        time.sleep(2)
    out = {"honest_alone": alone, "honest_beside_8_hostile": loaded, "hostile_answered": done[0],
           "hostile_5xx": failed[0], "p50_loaded_over_alone": round(loaded["p50_ms"] / alone["p50_ms"], 2),
           "p99_loaded_over_alone": round(loaded["p99_ms"] / alone["p99_ms"], 2)}
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo-dir", default=str(HERE / ".cache" / "demo"))
    ap.add_argument("--requests", type=int, default=320, help="requests per concurrency level")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--only", choices=["mixed"], help="run one part, merged into the result file")
    args = ap.parse_args()
    from dhim_ray.jobs.ray_env import init_ray

    model, target = demo_collection(Path(args.demo_dir))
    queries = load_split(CorpusSpec("bbc", "val")).texts[:200]
    queries = [" ".join(q.split()[:12]) for q in queries]  # query-length texts: a headline's first words
    if args.only == "mixed":
        import json

        init_ray(num_cpus=2)
        result = json.loads((HERE / "serve_load.json").read_text()) if (HERE / "serve_load.json").exists() else {}
        write_result("serve_load", {**result, "mixed": mixed(model, target, queries)})
        return
    result = {"device": device_name("cpu"), "collection": asdict(target) | {"token_env": None},
              "in_process": in_process(model, target, queries)}
    print(result["in_process"], flush=True)
    result["cli_search"] = cli_search(model, target, args.cli_runs)
    print(result["cli_search"], flush=True)
    init_ray(num_cpus=2)
    result["http"] = over_http(model, target, queries, args.requests, args.clients)
    by = {(r["max_batch_size"], r["clients"]): r["queries_per_s"] for r in result["http"]}
    top = max(args.clients)
    result["batching_gain_at_max_clients"] = round(by[(32, top)] / by[(1, top)], 2)
    result["mixed"] = mixed(model, target, queries)
    write_result("serve_load", result)


if __name__ == "__main__":
    main()
