"""One evaluation of several methods against the same methods evaluated one at a time: the
model and three baselines (itq, lsh, cosine) on the packaged BBC corpus (train against test),
in this process, alternated, best of ``--repeats`` each. One evaluation encodes the corpus once
for all its methods (dhim_ray.encoding.encoder.shared_features); one at a time, each method
encodes it again. Their figures must be the same.

    python -m bench eval_methods [--model DIR]   # writes bench/eval_methods.json; without --model,
                                                 # trains a 64-bit model on bbc first (2 epochs)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness import device_name, write_result
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.evaluation import EvalRequest, evaluate

BASELINES = ("itq", "lsh", "cosine")


def _timed(requests: list[EvalRequest]) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    results = [r for request in requests for r in evaluate(request, progress=False)]
    return time.perf_counter() - t0, [{k: v for k, v in r.items() if k != "seconds"} for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a checkpoint trained on bbc [a 64-bit one, trained first]")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from dhim_ray.config import config_for_bits
            from dhim_ray.training.pipeline import train_corpus

            model = Path(tmp) / "bbc-64"
            train_corpus(CorpusSpec("bbc"), config_for_bits(64, train={"max_epochs": 2}), model, progress=False)
        db, q = CorpusSpec("bbc", "train"), CorpusSpec("bbc", "test")
        together = [EvalRequest(model, BASELINES, db, q)]
        apart = [EvalRequest(model, (), db, q)] + [EvalRequest(None, (b,), db, q) for b in BASELINES]
        times: dict[str, list[float]] = {"together": [], "apart": []}
        figures = {}
        for _ in range(args.repeats):
            for name, requests in (("together", together), ("apart", apart)):
                seconds, figures[name] = _timed(requests)
                times[name].append(seconds)
                print(f"{name}: {seconds:.1f} s", flush=True)
    result = {"corpus": "bbc:train vs bbc:test", "methods": ["dhim", *BASELINES], "repeats": args.repeats,
              "together_s": min(times["together"]), "apart_s": min(times["apart"]),
              "ratio": min(times["apart"]) / min(times["together"]),
              "same_figures": figures["together"] == figures["apart"], "device": device_name("cpu")}
    print(result)
    write_result("eval_methods", result)


if __name__ == "__main__":
    main()
