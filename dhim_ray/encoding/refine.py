"""SG-OPT: self-guided contrastive fine-tuning of a BERT-family encoder (torch + transformers; no Ray).

Kim, Yoo and Lee, "Self-Guided Contrastive Learning for BERT Sentence Representations"
(ACL 2021). Two copies of the encoder start equal:

- BERT_F stays frozen; each of its layers' hidden states is max-pooled over the
  document's tokens: one guide vector h_i^l per layer l (the paper's sampler, given
  every layer, as in its final SG-OPT form).
- BERT_T is trained; its [CLS] vector c_i is the sentence vector.

Both go through one projection head g (an MLP) and are compared by cosine / tau. The
redesigned NT-Xent keeps only the terms anchored on c_i: for each layer l,

    -log exp(s(c_i, h_i^l)) / (exp(s(c_i, h_i^l)) + sum_{j != i} exp(s(c_i, c_j)) + exp(s(c_i, h_j^l)))

averaged over documents and layers, plus lambda x ||theta_T - theta_T(start)||^2, which
keeps BERT_T near where it began. No labels, no augmentation. The result is a
Hugging Face folder that ``--encoder`` takes like any other encoder.

Hyperparameters are the paper's where they fit MiniLM (batch 16, tau 0.01, lambda 0.1,
one epoch); the learning rate is BENCHMARKS.md's choice for MiniLM.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from dhim_ray.config import DEFAULT_ENCODER, check_seed
from dhim_ray.corpus.text import CLEANINGS, clean_and_truncate
from dhim_ray.encoding.encoder import _load, resolve_encoder
from dhim_ray.errors import CheckpointError, ConfigError, DataError, TrainingInterrupted
from dhim_ray.folders import removed_unless_kept

logger = logging.getLogger(__name__)

METHODS = ("sg-opt",)
STATE_DIR = "refine-state"  # inside OUT.partial: what --resume needs
RECORD = "refine.json"  # inside the finished folder: how it was made


@dataclass(frozen=True)
class RefineConfig:
    """How an encoder is refined (saved as refine.json beside the weights)."""

    method: str = "sg-opt"
    encoder: str = DEFAULT_ENCODER  # what BERT_T and BERT_F start from
    epochs: int = 1  # paper: 1
    batch_size: int = 16  # paper: 16
    lr: float = 1e-5
    temperature: float = 0.01  # paper: tau = 0.01
    lam: float = 0.1  # paper: lambda = 0.1, the weight of ||theta_T - theta_start||^2
    head_hidden: int = 4096  # the projection head's hidden width (paper: an MLP with GELU)
    max_words: int = 50
    cleaning: str = "unicode"
    max_steps: int = 0  # stop after this many steps in all (0 = every batch of every epoch)
    save_every: int = 200  # steps between resumable states
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if self.method not in METHODS:
            raise ConfigError(f"method={self.method!r}: choose one of {', '.join(METHODS)}")
        if self.epochs < 1:
            raise ConfigError(f"epochs={self.epochs}: must be >= 1")
        if self.batch_size < 2:
            raise ConfigError(f"batch_size={self.batch_size}: must be >= 2 (the loss needs negatives), e.g. 16")
        if not 0 < self.lr < 1:
            raise ConfigError(f"lr={self.lr}: must be in (0, 1), e.g. 1e-5")
        if not 0 < self.temperature < math.inf:
            raise ConfigError(f"temperature={self.temperature}: must be a finite number > 0, e.g. 0.01")
        if not 0 <= self.lam < math.inf:
            raise ConfigError(f"lam={self.lam}: must be a finite number >= 0, e.g. 0.1")
        if self.head_hidden < 1 or self.max_words < 1 or self.max_steps < 0 or self.save_every < 1:
            raise ConfigError("head_hidden, max_words and save_every must be positive; max_steps >= 0")
        if self.cleaning not in CLEANINGS:
            raise ConfigError(f"cleaning {self.cleaning!r}: choose {' or '.join(CLEANINGS)}")


def max_pool_layers(hidden_states: tuple[torch.Tensor, ...], attention: torch.Tensor) -> torch.Tensor:
    """Every transformer layer's hidden states (embeddings excluded) max-pooled over the
    attended tokens: (layers, B, H)."""
    pad = ~attention.bool()[None, :, :, None]
    stacked = torch.stack(hidden_states[1:])  # (L, B, T, H)
    return stacked.masked_fill(pad, float("-inf")).amax(dim=2)


def sg_opt_loss(c: torch.Tensor, h: torch.Tensor, temperature: float) -> torch.Tensor:
    """SG-OPT's contrastive term. c: (B, D) projected [CLS] of BERT_T; h: (L, B, D)
    projected guides of BERT_F. Anchors are the c_i only; each layer's h_i^l is c_i's
    positive, every other document's c_j and h_j^l its negatives."""
    c = F.normalize(c, dim=-1)
    h = F.normalize(h, dim=-1)
    b = len(c)
    eye = torch.eye(b, dtype=torch.bool, device=c.device)
    cc = (c @ c.T / temperature).masked_fill(eye, float("-inf"))  # c_i vs c_j, j != i
    target = torch.arange(b, device=c.device)
    losses = [F.cross_entropy(torch.cat([c @ h_l.T / temperature, cc], dim=1), target) for h_l in h]
    return torch.stack(losses).mean()


class SGOPT(nn.Module):
    """BERT_T (trained), BERT_F (frozen) and the projection head g."""

    def __init__(self, model: nn.Module, head_hidden: int):
        super().__init__()
        self.student = model  # BERT_T
        self.guide = copy.deepcopy(model).eval()  # BERT_F
        for p in self.guide.parameters():
            p.requires_grad_(False)
        hidden = int(model.config.hidden_size)
        self.head = nn.Sequential(nn.Linear(hidden, head_hidden), nn.GELU(), nn.Linear(head_hidden, hidden))
        self.start = {name: p.detach().clone() for name, p in self.student.named_parameters()}

    def regulariser(self) -> torch.Tensor:
        """||theta_T - theta_T(start)||^2 over BERT_T's weights."""
        return sum(((p - self.start[name].to(p.device)) ** 2).sum() for name, p in self.student.named_parameters())

    def loss(self, batch: dict[str, torch.Tensor], config: RefineConfig) -> tuple[torch.Tensor, float, float]:
        with torch.no_grad():
            guide = self.guide(**batch, output_hidden_states=True).hidden_states
            h = max_pool_layers(guide, batch["attention_mask"])  # (L, B, H)
        c = self.student(**batch).last_hidden_state[:, 0]  # [CLS] of BERT_T
        contrastive = sg_opt_loss(self.head(c), self.head(h), config.temperature)
        reg = self.regulariser()
        return contrastive + config.lam * reg, contrastive.item(), reg.item()


def _save_state(folder: Path, sg: SGOPT, optimizer: torch.optim.Optimizer, step: int, history: list,
                run: dict | None = None) -> None:
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trained = {f"student.{k}": v for k, v in sg.student.state_dict().items()}
    trained.update({f"head.{k}": v for k, v in sg.head.state_dict().items()})
    save_file({k: v.detach().cpu().contiguous() for k, v in trained.items()}, str(tmp / "weights.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "progress.json").write_text(json.dumps({"step": step, "history": history, "run": run or {}}))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def _load_state(folder: Path, sg: SGOPT, optimizer: torch.optim.Optimizer, run: dict | None = None) -> tuple[int, list]:
    from safetensors.torch import load_file

    try:
        weights = load_file(str(folder / "weights.safetensors"))
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        progress = json.loads((folder / "progress.json").read_text())
    except Exception as exc:  # truncated or foreign files fail in many ways
        raise CheckpointError(f"resume: the refine state in {folder} is unreadable ({type(exc).__name__}); "
                              "start again without --resume") from exc
    _check_same_run(folder, progress.get("run") or {}, run or {})
    sg.student.load_state_dict({k[8:]: v for k, v in weights.items() if k.startswith("student.")})
    sg.head.load_state_dict({k[5:]: v for k, v in weights.items() if k.startswith("head.")})
    return int(progress["step"]), list(progress["history"])


def _run_identity(config: RefineConfig, docs: list[str]) -> dict:
    """What a resumed refine must share with the run it continues: its settings (but how often
    it saves) and its documents."""
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.encode("utf-8", "surrogatepass") + b"\0")
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k != "save_every"}
    return {"config": settings, "documents": f"{len(docs)}:{digest.hexdigest()[:16]}"}


def _check_same_run(folder: Path, started: dict, now: dict) -> None:
    if not started or not now:  # a state saved before runs were recorded: not checked
        return
    if started.get("documents") != now.get("documents"):
        raise CheckpointError(f"resume: the refine in {folder} ran on other documents "
                              f"({started.get('documents')} against {now.get('documents')}); resume it with its own "
                              "corpus, or start again without --resume")
    for key, value in now.get("config", {}).items():
        before = started.get("config", {}).get(key)
        if before != value:
            raise CheckpointError(f"resume: the refine in {folder} was started with {key}={before!r}, this command "
                                  f"asks for {value!r}; resume with the settings it was started with")


def epoch_order(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches of one epoch: a shuffle fixed by (seed, epoch), so a resumed run
    sees the same batches; a last batch of one document (no negatives) is dropped."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size) if len(order[i : i + batch_size]) >= 2]


def refine_encoder(texts: list[str], out: str | Path, config: RefineConfig, *, device: str = "cpu",
                   resume: bool = False, progress: bool = True, context: dict | None = None) -> dict:
    """Fine-tune ``config.encoder`` on ``texts`` with SG-OPT and write a Hugging Face
    folder (model + tokenizer + refine.json) at ``out``.

    Work goes to ``OUT.partial`` (a resumable state every ``save_every`` steps and on
    Ctrl-C); ``out`` appears only when the run is complete. ``resume=True`` continues
    from the last saved state. Returns the summary written to refine.json.
    """
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    state_dir = partial / STATE_DIR
    if out.exists():
        raise ConfigError(f"out={out} exists; refine writes a new folder, pick another --out or remove it")
    if resume and not (state_dir / "progress.json").exists():
        raise CheckpointError(f"resume: no unfinished refine of {out} (no {state_dir}); start without --resume")
    if not resume and partial.exists():
        raise CheckpointError(f"out={out}: an unfinished refine is in {partial}; continue it with --resume "
                              "or remove that folder")
    docs = [clean_and_truncate(t, config.max_words, config.cleaning) for t in texts]
    docs = [d for d in docs if d]
    if len(docs) < config.batch_size:
        raise DataError(f"{len(docs)} non-empty documents: SG-OPT needs at least batch_size={config.batch_size}")
    torch.manual_seed(config.seed)
    model, tokenizer = _load(resolve_encoder(config.encoder), config.encoder)  # a bad encoder fails before any folder
    with removed_unless_kept(partial, lambda folder: (folder / STATE_DIR / "progress.json").exists()):
        partial.mkdir(parents=True, exist_ok=True)
        return _refine(model, tokenizer, docs, out, partial, config, device, resume, progress, context)


def _refine(model, tokenizer, docs: list[str], out: Path, partial: Path, config: RefineConfig, device: str,
            resume: bool, progress: bool, context: dict | None) -> dict:
    state_dir = partial / STATE_DIR
    sg = SGOPT(model, config.head_hidden).to(device)
    sg.student.train()  # dropout on, as in fine-tuning
    params = [*sg.student.parameters(), *sg.head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    run = _run_identity(config, docs)
    step, history = (_load_state(state_dir, sg, optimizer, run) if resume else (0, []))
    batches = [b for e in range(config.epochs) for b in epoch_order(len(docs), config.batch_size, config.seed, e)]
    total = min(len(batches), config.max_steps) if config.max_steps else len(batches)
    if resume:
        logger.info("resuming SG-OPT at step %d of %d from %s", step, total, state_dir)
    n_tokens = config.max_words + 2  # words, [CLS] and [SEP]
    t0 = time.perf_counter()
    bar = tqdm(total=total, initial=step, desc="refine sg-opt", unit="step", disable=not progress)
    try:
        while step < total:
            texts_b = [docs[i] for i in batches[step]]
            batch = tokenizer(texts_b, padding=True, truncation=True, max_length=n_tokens,
                              return_tensors="pt").to(device)
            batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            loss, contrastive, reg = sg.loss(batch, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            history.append([round(contrastive, 5), reg])
            bar.update(1)
            bar.set_postfix(loss=f"{contrastive:.3f}")
            if step % config.save_every == 0 and step < total:
                _save_state(state_dir, sg, optimizer, step, history, run)
    except KeyboardInterrupt:
        _save_state(state_dir, sg, optimizer, step, history, run)
        raise TrainingInterrupted(f"interrupted at step {step} of {total}; the state is in {state_dir}: "
                                  "continue with the same command and --resume") from None
    finally:
        bar.close()
    tmp = partial / "encoder"
    shutil.rmtree(tmp, ignore_errors=True)
    sg.student.eval().save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    losses = [h[0] for h in history]
    summary = {
        **(context or {}), "config": asdict(config), "steps": step, "documents": len(docs),
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-20:])) if losses else None,
        "last_regulariser": history[-1][1] if history else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / RECORD).write_text(json.dumps(summary, indent=2))
    os.replace(tmp, out)
    shutil.rmtree(partial, ignore_errors=True)
    logger.info("refined encoder written to %s (%d steps, loss %.3f -> %.3f)", out, step,
                summary["first_loss"] or 0.0, summary["last_loss"] or 0.0)
    return summary
