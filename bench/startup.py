"""A process's start-up with a model: what `dhim-ray search`, each ingest's encoding actors and
each service replica pay before their first query. On the CPU the encoder runs an ONNX graph
cached once per model and machine, keyed by the encoder folder's weight files, so a process
loads the torch encoder only when something asks for it (a torch pass, an export); a local
encoder never asks the hub (which, unreachable, made the offline guard import `datasets`).

    python -m bench startup [--repeats 5]     # writes bench/startup.json

The ways are measured in the same run, each a fresh process, alternating, best of
``--repeats``: 'shipped' is this version; 'eager' is the same code made to do what it did
before (touch ``encoder.model``, so the torch weights load, and import `datasets`). 'library'
is ``Hasher.load`` and one ``encode``, shipped against eager; 'search' is the whole `dhim-ray search` command on a
milvus-lite collection of 200 BBC documents (the model: 64 bits, 2 epochs on 300 BBC documents).
A search hashes its query through the model's query graph (ONNX Runtime, no torch imported);
'torch' is the same command hashing with the torch ``Hasher``, as it did before the graph.

'ingest' is the whole `dhim-ray ingest` of 100 BBC documents into a new milvus-lite file, Ray's
start included: 'shipped' creates a new collection's indexes and loads it, 'waited' makes it as
pymilvus' ``create_collection(index_params=...)`` does, which sleeps 0.5 s before its first look
at each index's state (the collection's two and the ingest ledger's one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import device_name, write_result

#: Run before the measured code in the 'eager' processes: what start-up did before.
EAGER = ("import datasets\n"
         "from dhim_ray.encoding import encoder as _e\n"
         "_init = _e.FrozenEncoder.__init__\n"
         "def _eager(self, *a, **k):\n"
         "    _init(self, *a, **k)\n"
         "    self._torch()\n"
         "_e.FrozenEncoder.__init__ = _eager\n")
LIBRARY = ("import time; t0 = time.perf_counter()\n"
           "from dhim_ray.hasher import Hasher\n"
           "Hasher.load({model!r}).encode(['oil prices rise as markets fall'])\n"
           "print(time.perf_counter() - t0)\n")
#: Run before the measured search in the 'torch' processes: the query hashed by the torch Hasher.
TORCH = ("from dhim_ray import graph_hasher as _g\n"
         "from dhim_ray.hasher import Hasher as _H\n"
         "_g.load_query_hasher = _H.load\n")
WAITED = ("from dhim_ray.connectors import ledger as _l, milvus as _m\n"
          "def _waited(client, name, schema, index_params, timeout):\n"
          "    client.create_collection(name, schema=schema, index_params=index_params, timeout=timeout)\n"
          "_m.create_loaded = _l.create_loaded = _waited\n")
INGEST = ("import sys; sys.argv = ['dhim-ray', '-q', 'ingest', 'bbc', '--model', {model!r}, '--limit', '100',"
          " '--uri', {db!r}, '--collection', 'bbc']\n"
          "from dhim_ray.cli import main\n"
          "main()\n")
SEARCH = ("import sys; sys.argv = ['dhim-ray', 'search', 'oil prices rise', '--model', {model!r}, '--uri', {db!r},"
          " '--collection', 'bbc', '-k', '5', '--json']\n"
          "from dhim_ray.cli import main\n"
          "main()\n")


def _run(code: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"a start-up run failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, db = str(Path(tmp) / "bbc-64"), str(Path(tmp) / "dhim_ray.db")
        for step in (["train", "bbc", "--limit", "300", "--bits", "64", "--epochs", "2", "--out", model],
                     ["ingest", "bbc", "--model", model, "--limit", "200", "--uri", db, "--collection", "bbc"]):
            subprocess.run(["dhim-ray", "-q", *step], check=True, capture_output=True)
        _run(LIBRARY.format(model=model))  # the ONNX graph of this encoder, exported once (as on a first run)
        _run(SEARCH.format(model=model, db=db))  # and the model's query graph
        times: dict[str, dict[str, list[float]]] = {"library": {"shipped": [], "eager": []},
                                                    "search": {"shipped": [], "torch": []}}
        ways = {"shipped": "", "eager": EAGER, "torch": TORCH}
        for _ in range(args.repeats):
            for what, code in (("library", LIBRARY), ("search", SEARCH)):
                for way in times[what]:
                    times[what][way].append(_run(ways[way] + code.format(model=model, db=db)))
        times["ingest"] = {"shipped": [], "waited": []}
        for i in range(args.repeats):
            for way, prefix in (("shipped", ""), ("waited", WAITED)):
                db_i = str(Path(tmp) / f"ingest-{way}-{i}.db")  # a new file: the collection and ledger are new
                times["ingest"][way].append(_run(prefix + INGEST.format(model=model, db=db_i)))
        print(json.dumps(times))
    best = {what: {way: min(t) for way, t in ways.items()} for what, ways in times.items()}
    before = {"library": "eager", "search": "torch", "ingest": "waited"}
    result = {what: {**b, "ratio": b[before[what]] / b["shipped"]} for what, b in best.items()}
    result.update(repeats=args.repeats, device=device_name("cpu"), python=sys.version.split()[0])
    print(json.dumps(result, indent=1))
    write_result("startup", result)


if __name__ == "__main__":
    main()
