"""BIN_FLAT vs BIN_IVF_FLAT on a Milvus server, on learned codes: q/s and tie-aware
recall@100 against exact search, for each nlist and nprobe, 1 and 8 clients.

    python -m bench.million hash --layers 1           # first: the 1M learned codes it reads
    python -m bench.ivf_curve                          # both query sets: val, generated

The database is the 1M generated documents hashed by a trained DHIM model
(``--model``, a folder under bench/.cache/million; the default is bench.million's
DHIM on all-MiniLM-L6-v2's first layer); the queries (see export_codes) are hashed by
the same model. The server (the PyPI ``milvus`` package, as the
server tests use it) runs inside a network namespace of its own (``unshare -n``).
Tie-aware recall@k: a returned code counts when it is strictly closer than the exact
k-th distance, and codes at exactly that distance count up to the slots left, so any
tie-break of the exact top-k scores 1.0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache" / "million"
logger = logging.getLogger("bench.ivf_curve")


def export_codes(n_docs: int, queries_from: str, model_name: str) -> tuple[Path, Path]:
    """The database codes (by row; bench.million hashes the generated corpus) and 1,000
    query codes, as .npy files. Queries are generated documents (``generated``: shuffled
    dev documents, like the database, so their neighbours are near-duplicates) or real
    held-out documents (``val``: 250 from each dev corpus' val.csv, which no database
    document was made from)."""
    from bench.million import hash_corpus, make_corpus
    from dhim_ray.hasher import Hasher

    model = CACHE / model_name
    if not (model / "config.json").exists():
        raise SystemExit(f"{model} is missing: build it with python -m bench.million hash")
    make_corpus(n_docs)
    db_path = hash_corpus(model, n_docs)
    q_path = CACHE / f"queries-{model_name}-{queries_from}-1000.npy"
    if not q_path.exists():
        hasher = Hasher.load(model)
        if queries_from == "generated":
            import pyarrow.parquet as pq

            texts = pq.read_table(make_corpus(5000) / "train" / "part-00000.parquet").column("text").to_pylist()
            np.save(q_path, hasher.encode(texts[:1000]))
        else:
            from dhim_ray.corpus.spec import CorpusSpec

            data = HERE.parents[1] / "shared" / "data"
            texts = [t for name in ("dbpedia", "agnews", "20ng", "r8")
                     for t in CorpusSpec(str(data / name), "val").load_split().texts[:250]]
            np.save(q_path, hasher.encode(texts))
    return db_path, q_path


def tie_aware_recall(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """found, exact: (queries, k) distances; see the module doc."""
    kth = exact[:, -1:]
    n_lt = (exact < kth).sum(1)
    closer = (found < kth).sum(1)
    tied = np.minimum((found == kth).sum(1), k - n_lt)
    return float(np.mean((closer + tied) / k))


def inner(args) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from milvus_server import URI, start_server

    from dhim_ray.connectors.milvus import CodeCollection, IndexSpec, MilvusTarget, make_rows
    from dhim_ray.retrieval.metrics import hamming_topk

    os.environ["MILVUS_TOKEN"] = "root:Milvus"
    db, k = np.load(args.codes), 100
    n_bits = db.shape[1] * 8
    sets = []  # one per query file: its queries, exact distances, code profile and rows
    for path, out in zip(args.queries, args.out):
        q = np.load(path)
        _, exact = hamming_topk(db, q, k)
        profile = {"distinct_codes": int(len(np.unique(db.view(f"V{db.shape[1]}")))),
                   "nearest_distance_mean": float(exact[:, 0].mean()), "kth_distance_mean": float(exact[:, -1].mean()),
                   "queries_with_ties_at_kth": float(np.mean((exact == exact[:, -1:]).sum(1) > 1))}
        logger.info("%s: %s", Path(path).stem, json.dumps(profile))
        sets.append({"q": q, "exact": exact, "profile": profile, "rows": [], "path": path, "out": out})
    server = start_server(CACHE / "server", authorization=True)
    try:
        target = MilvusTarget(URI, "curve", timeout=600)
        client = target.connect()
        CodeCollection(client, "curve", 600).ensure(n_bits, "bench", IndexSpec("BIN_FLAT"), overwrite=True)
        t0 = time.perf_counter()
        for s in range(0, len(db), 20_000):
            rows = make_rows(np.arange(s, s + len(db[s:s + 20_000])), db[s:s + 20_000], n_bits, None,
                             [""] * len(db[s:s + 20_000]), "bench", np.arange(s, s + len(db[s:s + 20_000])))
            client.insert("curve", rows, timeout=600)
        client.flush("curve", timeout=600)
        logger.info("inserted %d codes in %.0f s", len(db), time.perf_counter() - t0)
        specs = [IndexSpec("BIN_FLAT")] + [IndexSpec("BIN_IVF_FLAT", nlist=n, nprobe=1) for n in args.nlist]
        for spec in specs:
            client.release_collection("curve")
            client.drop_index("curve", "code")
            params = client.prepare_index_params()
            params.add_index(field_name="code", index_type=spec.index_type, metric_type="HAMMING", params=spec.params())
            t0 = time.perf_counter()
            client.create_index("curve", params, timeout=1200)
            client.load_collection("curve", timeout=1200)
            build = time.perf_counter() - t0
            probes = [0] if spec.index_type == "BIN_FLAT" else [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256)
                                                                 if p <= spec.nlist]
            for nprobe in probes:
                search = spec if not nprobe else IndexSpec(spec.index_type, nlist=spec.nlist, nprobe=nprobe)
                for qs in sets:
                    q = qs["q"]
                    CodeCollection(client, "curve", 600).search(q[:20], n_bits, k, search, output_fields=())  # warm
                    t0 = time.perf_counter()
                    hits = CodeCollection(client, "curve", 600).search(q, n_bits, k, search, output_fields=(),
                                                                       batch_size=100)
                    qps1 = len(q) / (time.perf_counter() - t0)
                    # IVF may return fewer than k (probed clusters too small): the missing count as misses.
                    found = np.full((len(q), k), n_bits + 1)
                    for i, r in enumerate(hits):
                        found[i, : len(r)] = [h["distance"] for h in r]
                    qps8 = concurrent_qps(target, q, n_bits, k, search, clients=8)
                    row = {"index": spec.index_type, "nlist": spec.nlist if nprobe else 0, "nprobe": nprobe,
                           "build_s": build, "qps_1_client": qps1, "qps_8_clients": qps8,
                           "recall_tie_aware": tie_aware_recall(found, qs["exact"], k)}
                    qs["rows"].append(row)
                    logger.info("%s %s", Path(qs["path"]).stem, json.dumps(row))
        client.close()
    finally:
        server.stop()
    for qs in sets:
        Path(qs["out"]).write_text(json.dumps({"n_codes": len(db), "bits": n_bits, "queries": len(qs["q"]), "k": k,
                                               "queries_from": Path(qs["path"]).stem, "model": args.model,
                                               **qs["profile"], "rows": qs["rows"]}, indent=1) + "\n")


def concurrent_qps(target, q: np.ndarray, n_bits: int, k: int, spec, clients: int) -> float:
    """Each of ``clients`` threads (own connection) sends every query, 1 per request."""
    from dhim_ray.connectors.milvus import CodeCollection

    conns = [target.connect() for _ in range(clients)]
    per = q[: max(clients, len(q) // 4)]

    def work(c):
        CodeCollection(c, "curve", 600).search(per, n_bits, k, spec, output_fields=(), batch_size=10)

    threads = [threading.Thread(target=work, args=(c,)) for c in conns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for c in conns:
        c.close()
    return clients * len(per) / seconds


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--nlist", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--queries-from", nargs="+", choices=("generated", "val"), default=["val", "generated"],
                    help="query sets, each searched against the same index builds")
    ap.add_argument("--model", default="minilm-l1-dhim-64", help="a trained model folder under bench/.cache/million")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--codes", help=argparse.SUPPRESS)
    ap.add_argument("--queries", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args)
        return
    paths = [export_codes(args.docs, name, args.model) for name in args.queries_from]
    outs = [str(HERE / f"ivf_curve_{name}.json") for name in args.queries_from]
    cmd = (f"ip link set lo up && exec {sys.executable} -m bench.ivf_curve --inner --codes {paths[0][0]} "
           f"--queries {' '.join(str(q) for _, q in paths)} --out {' '.join(outs)} --model {args.model} "
           f"--nlist {' '.join(map(str, args.nlist))}")
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    main()
