"""Time to quality: `dhim-ray train` (cached features, shipped recipe) against the paper's
reference loop (the encoder re-run on every batch, in train mode as the reference code
leaves it, with the reference run's hyperparameters), on the same split, encoder and device.

    python -m bench.time_to_quality --corpus dbpedia --bits 64 [--device cuda] [--epochs 100]

Both select their epoch by tie-aware val P@100 with patience 6 (the reference code's
rule), and both report the wall time to their best epoch with the frozen features
included: dhim-ray computes them once; the reference loop pays an encoder forward per
training batch and re-encodes the database and the queries for every validation.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import DATA

logger = logging.getLogger("bench.time_to_quality")


def reference_loop(corpus, bits: int, device: str, max_epochs: int, patience: int = 6, seed: int = 0,
                   budget_seconds: float | None = None, on_epoch=None) -> dict:
    """The reference code's training loop, on this library's model in the paper formulation.

    ``budget_seconds``: stop after the first epoch that ends past this wall time (marked
    ``budget_stopped``); its best epoch so far is then a lower bound on its time to quality,
    since a later best can only come later. ``on_epoch(result)`` gets the result so far after
    every epoch (the bench writes it out, so an interrupted run keeps its epochs)."""
    import torch

    from dhim_ray.config import as_published, config_for_bits
    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.model.inference import hash_features, to_tensors
    from dhim_ray.retrieval.metrics import precision_at_k
    from dhim_ray.training.loop import build_model, train_step
    from dhim_ray.training.pipeline import load_train_val
    from dhim_ray.training.schedule import EarlyStopping

    t0 = time.perf_counter()
    cfg = config_for_bits(bits, train={"seed": seed})
    enc = FrozenEncoder(as_published(cfg).features, device=device)
    cfg = as_published(cfg.replace(model={"hidden_size": enc.hidden_size}))
    train, val, _ = load_train_val(corpus, cfg)
    model = build_model(cfg, torch.device(device))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    rng = np.random.default_rng(seed)
    stopper, history = EarlyStopping(patience), []
    texts = np.array(train.texts, dtype=object)
    for epoch in range(max_epochs):
        t_epoch = time.perf_counter()
        order = rng.permutation(len(texts))
        losses = []
        for start in range(0, len(order), cfg.train.batch_size):
            idx = order[start : start + cfg.train.batch_size]
            if len(idx) < 2:
                continue
            enc.model.train()  # the reference code leaves BERT in train mode: dropout on, no gradients
            feats = enc.encode_batch(list(texts[idx]))
            tokens, mask, target = to_tensors(feats, np.arange(len(idx)), cfg.model.regulariser, torch.device(device))
            losses.append(train_step(model, opt, tokens, mask, target, cfg.train)["loss"])
        enc.model.eval()
        db = hash_features(model, enc.features(train.texts, batch_size=256), device=torch.device(device))
        q = hash_features(model, enc.features(val.texts, batch_size=256), device=torch.device(device))
        p = precision_at_k(db, train.labels, q, val.labels, 100).precision_at_k_tie_aware
        stopper.update(p, epoch)
        history.append({"epoch": epoch, "loss": float(np.mean(losses)), "val_precision": p,
                        "seconds": time.perf_counter() - t_epoch, "wall": time.perf_counter() - t0})
        logger.info("reference epoch %d: loss %.4f P@100 %.4f (%.1f s)", epoch, history[-1]["loss"], p,
                     history[-1]["seconds"])
        budget_stopped = (budget_seconds is not None and history[-1]["wall"] > budget_seconds
                          and not stopper.should_stop)
        result = _reference_result(stopper, history, t0, budget_stopped)
        if on_epoch is not None:
            on_epoch(result)
        if stopper.should_stop or budget_stopped:
            break
    return result


def _reference_result(stopper, history: list[dict], t0: float, budget_stopped: bool) -> dict:
    best = stopper.best_epoch
    return {"best_epoch": best, "best_val_precision_at_k_tie_aware": stopper.best, "epochs_run": len(history),
            "wall_to_best_epoch_seconds": history[best]["wall"], "wall_seconds": time.perf_counter() - t0,
            "mean_epoch_seconds": float(np.mean([h["seconds"] for h in history])),
            "stopped_by_itself": stopper.should_stop, "budget_stopped": budget_stopped, "history": history}


def shipped_run(corpus, bits: int, device: str, max_epochs: int) -> dict:
    from dhim_ray.config import config_for_bits
    from dhim_ray.training.pipeline import train_corpus

    cfg = config_for_bits(bits, train={"max_epochs": max_epochs})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        _, s = train_corpus(corpus, cfg, Path(tmp) / "m", progress=False, device=device)
        wall = time.perf_counter() - t0
    epochs = [h["seconds"] for h in s["history"]]
    return {k: v for k, v in s.items() if k not in ("history",)} | {
        "wall_seconds": wall, "wall_to_best_epoch_seconds": wall - sum(epochs[s["best_epoch"] + 1:]),
        "history": s["history"]}


def wall_to_reach(run: dict, target: float) -> tuple[int, float] | None:
    """(epoch, wall seconds at its end) of the first epoch of a shipped run whose val P@100
    reaches ``target``, features and start-up included; None if none does."""
    hist = run["history"]
    for i, h in enumerate(hist):
        if h.get("val_precision") is not None and h["val_precision"] >= target:
            return h["epoch"], run["wall_seconds"] - sum(x["seconds"] for x in hist[i + 1:])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="dbpedia")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--reference-epochs", type=int, default=None,
                    help="Cap the reference loop (its epochs cost minutes on a CPU); with --reference-best-epoch "
                         "its wall time to that epoch is then estimated from its measured epoch time")
    ap.add_argument("--reference-best-epoch", type=int, default=None,
                    help="The reference loop's best epoch from an uncapped run (e.g. on a GPU)")
    ap.add_argument("--reference-budget", type=float, default=None, metavar="SECONDS",
                    help="Stop the reference loop after the first epoch that ends past this wall time; its time "
                         "to its best epoch so far is then a lower bound (a later best comes later)")
    ap.add_argument("--out", default="bench/time_to_quality.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    from dhim_ray.corpus.spec import CorpusSpec

    corpus = CorpusSpec(str(Path(args.data) / args.corpus))
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    shipped = shipped_run(corpus, args.bits, args.device, args.epochs)
    print(json.dumps({k: v for k, v in shipped.items() if k != "history"}), flush=True)
    head = {"corpus": args.corpus, "bits": args.bits, "device": args.device, "device_name": device_name,
            "torch_threads": torch.get_num_threads(), "reference_budget_seconds": args.reference_budget,
            "shipped": shipped}

    def with_ratios(reference: dict) -> dict:
        return head | {"reference": reference,
                       "time_ratio": shipped["wall_to_best_epoch_seconds"] / reference["wall_to_best_epoch_seconds"],
                       "precision_diff": shipped["best_val_precision_at_k_tie_aware"]
                       - reference["best_val_precision_at_k_tie_aware"],
                       "shipped_reaches_reference_best": wall_to_reach(
                           shipped, reference["best_val_precision_at_k_tie_aware"])}

    def keep(partial: dict) -> None:  # an interrupted run keeps its epochs
        Path(args.out).write_text(json.dumps(with_ratios(partial) | {"partial": True}, indent=1))

    reference = reference_loop(corpus, args.bits, args.device, args.reference_epochs or args.epochs,
                               budget_seconds=args.reference_budget, on_epoch=keep)
    if args.reference_epochs and args.reference_best_epoch is not None:
        h = reference["history"]
        startup = h[0]["wall"] - h[0]["seconds"]  # corpus, encoder and model loading
        reference["estimated"] = True
        reference["best_epoch"] = args.reference_best_epoch
        reference["wall_to_best_epoch_seconds"] = startup + reference["mean_epoch_seconds"] * (
            args.reference_best_epoch + 1)
    print(json.dumps({k: v for k, v in reference.items() if k != "history"}), flush=True)
    out = with_ratios(reference)
    print(json.dumps({k: v for k, v in out.items() if k not in ("shipped", "reference")}), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
