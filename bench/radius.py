"""Hamming radius search (``search --max-distance R``) on a Milvus server with BIN_IVF_FLAT, against
an exact scan: 1,000,000 generated 64-bit codes, recall of the set within R bits.

    python -m bench.radius                     # writes bench/radius.json

The codes are clustered as learned codes are (2,000 random centres, each code its centre with
every bit flipped with probability 0.08: about 5 bits from it), so a radius holds neighbours;
the 200 queries are database codes with 2 more bits flipped. The server (the PyPI ``milvus``
package, as the server tests use it) runs in a network namespace of its own (``unshare -n``).
Recall: the share of the rows within R bits (numpy scan) that the range search returned; the
returned rows are checked to be within R, and in the order the rest of dhim-ray uses (distance,
then id). IVF probes ``nprobe`` of ``nlist`` clusters, so it may miss rows in the others;
nprobe = nlist probes all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
N_BITS = 64


def generated_codes(n: int, centres: int = 2000, flip: float = 0.08, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centre_bits = rng.random((centres, N_BITS)) < 0.5
    bits = centre_bits[rng.integers(0, centres, n)] ^ (rng.random((n, N_BITS)) < flip)
    return np.packbits(bits, axis=1)


def inside(args) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from milvus_server import URI, start_server

    from dhim_ray.connectors.milvus import IndexSpec, MilvusTarget, document_ids, make_rows

    codes = generated_codes(args.codes)
    rng = np.random.default_rng(1)
    picked = rng.choice(len(codes), args.queries, replace=False)
    q_bits = np.unpackbits(codes[picked], axis=1)
    for row in q_bits:
        row[rng.choice(N_BITS, 2, replace=False)] ^= 1
    queries = np.packbits(q_bits, axis=1)
    server = start_server(HERE / ".cache" / "radius-server", authorization=False)
    out = {"codes": args.codes, "queries": args.queries, "nlist": args.nlist, "cells": []}
    try:
        target = MilvusTarget(URI, "radius64", timeout=600)
        ids = document_ids("radius", np.arange(len(codes)))
        t0 = time.perf_counter()
        with target.open() as coll:
            coll.ensure(N_BITS, "generated", IndexSpec("BIN_IVF_FLAT", nlist=args.nlist), overwrite=True)
            for start in range(0, len(codes), 20_000):
                stop = start + 20_000
                rows = np.arange(start, min(stop, len(codes)))
                coll.upsert(make_rows(ids[rows], codes[rows], N_BITS, None, [""] * len(rows), "radius", rows))
            coll.client.flush(coll.name)
            out["insert_seconds"] = round(time.perf_counter() - t0, 1)
            assert coll.count() == len(codes)
            distances = np.stack([np.bitwise_count(codes ^ q).sum(1, dtype=np.uint8) for q in queries])  # (queries, codes)
            for radius in args.radii:
                for nprobe in args.nprobe:
                    index = IndexSpec("BIN_IVF_FLAT", nlist=args.nlist, nprobe=min(nprobe, args.nlist))
                    t = time.perf_counter()
                    hits = coll.search(queries, N_BITS, args.limit, index=index, output_fields=(),
                                       max_distance=radius, batch_size=10)
                    seconds = time.perf_counter() - t
                    found = want = capped = 0
                    ordered = within = True
                    for qi, h in enumerate(hits):
                        exact = set(ids[distances[qi] <= radius].tolist())
                        got = [x["id"] for x in h]
                        within &= all(x["distance"] <= radius for x in h)
                        ordered &= [(x["distance"], x["id"]) for x in h] == sorted((x["distance"], x["id"]) for x in h)
                        if len(exact) > args.limit:
                            capped += 1
                            continue
                        found += len(exact & set(got))
                        want += len(exact)
                    strong = 0
                    params = {"metric_type": "HAMMING", "params": {"nprobe": min(nprobe, args.nlist),
                                                                   "radius": radius + 1, "range_filter": 0}}
                    for start in range(0, len(queries), 10):
                        res = coll.client.search(coll.name, data=[q.tobytes() for q in queries[start:start + 10]],
                                                 anns_field="code", search_params=params, limit=args.limit,
                                                 consistency_level="Strong", timeout=600)
                        for qi, h in enumerate(res, start):
                            exact = set(ids[distances[qi] <= radius].tolist())
                            if len(exact) <= args.limit:
                                strong += len(exact & {x["id"] for x in h})
                    knn = coll.search(queries, N_BITS, 10, index=index, output_fields=())
                    knn_found = sum(len({x["id"] for x in h} & set(ids[np.argsort(distances[qi], kind="stable")[:10]].tolist()))
                                    for qi, h in enumerate(knn)) / (10 * len(queries))
                    cell = {"radius": radius, "nprobe": min(nprobe, args.nlist), "recall": round(found / max(want, 1), 5),
                            "recall_strong": round(strong / max(want, 1), 5), "knn_recall_at_10": round(knn_found, 4),
                            "rows_within_mean": round(want / max(len(queries) - capped, 1), 1), "capped_queries": capped,
                            "all_within_radius": bool(within), "ordered": bool(ordered),
                            "queries_per_s": round(len(queries) / seconds, 1)}
                    print(cell, flush=True)
                    out["cells"].append(cell)
    finally:
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codes", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--nlist", type=int, default=128)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--radii", type=int, nargs="+", default=[2, 4, 6, 8])
    ap.add_argument("--limit", type=int, default=16384)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        result = inside(args)
        (HERE / "radius.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    cmd = f"ip link set lo up && exec {sys.executable} -m bench.radius --inside " + " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in
        (("codes", args.codes), ("queries", args.queries), ("nlist", args.nlist), ("nprobe", args.nprobe),
         ("radii", args.radii), ("limit", args.limit)))
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env.pop("MILVUS_TOKEN", None)
    subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    main()
