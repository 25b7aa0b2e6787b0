"""One ONNX graph from token ids to packed codes (``dhim-ray export MODEL --out model.onnx``):
encoder, DHIM head, threshold and bit packing in float32. Inputs ``input_ids`` and
``attention_mask`` (int64, (batch, tokens)); output ``codes`` (uint8, (batch, n_bits / 8), MSB
first), ``Hasher.encode``'s codes for an fp32 model. Beside it: the tokenizer and
``<name>.json`` (cleaning, word limit, code width). docs/serve.md shows it from other languages."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from torch import nn

from dhim_ray.corpus import text as text_rules
from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.encoding.onnx_runtime import export_graph, optimise
from dhim_ray.errors import ConfigError
from dhim_ray.hasher import Hasher
from dhim_ray.model.checkpoint import check_writable, read_checkpoint

logger = logging.getLogger(__name__)


class TokensToCodes(nn.Module):
    """Token ids and mask -> packed codes, as ``Hasher.encode`` computes them: the batch is
    padded by the head's reach (cut at the model's token limit), the encoder's last layer
    rounded through fp16 as the feature cache keeps it, [CLS]/[SEP]/[PAD] masked out."""

    def __init__(self, hasher: Hasher):
        super().__init__()
        enc = hasher.encoder
        self.encoder = enc.model
        self.head = hasher.model
        self.n_tokens = enc.config.n_tokens
        self.reach = self.n_tokens if enc.reach is None else enc.reach
        tok = enc.tokenizer
        self.pad_id = int(tok.pad_token_id or 0)
        special = sorted({i for i in (tok.sep_token_id, tok.pad_token_id, tok.cls_token_id) if i is not None})
        self.register_buffer("special", torch.tensor(special, dtype=torch.long))
        self.register_buffer("place", 2 ** torch.arange(7, -1, -1, dtype=torch.int32))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows = input_ids.shape[0]
        pad_ids = torch.full((rows, self.reach), self.pad_id, dtype=input_ids.dtype)
        ids = torch.cat([input_ids, pad_ids], 1)[:, : self.n_tokens]
        mask = torch.cat([attention_mask, torch.zeros_like(pad_ids)], 1)[:, : self.n_tokens]
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        words = mask.bool() & ~(ids[:, :, None] == self.special[None, None, :]).any(-1)
        tokens = hidden[:, 1:].to(torch.float16).to(torch.float32)
        bits = (self.head.global_logits(tokens, words[:, 1:]) > 0).to(torch.int32)
        packed = (bits.reshape(rows, -1, 8) * self.place).sum(-1)
        return packed.to(torch.uint8)


def text_spec(hasher: Hasher) -> dict:
    """What a caller does to a text before the tokenizer, and what comes out: enough to hash
    with the graph and nothing else (see docs/serve.md)."""
    cfg = hasher.config.features
    return {
        "n_bits": hasher.n_bits,
        "model_id": hasher.model_id,
        "inputs": ["input_ids", "attention_mask"],
        "output": "codes",
        "max_tokens": cfg.n_tokens,
        "pad_id": int(hasher.encoder.tokenizer.pad_token_id or 0),
        "max_words": cfg.max_words,
        "cleaning": {
            "name": cfg.cleaning,
            "normalize": "NFC" if cfg.cleaning == "unicode" else None,
            "drop": (text_rules._KEEP_UNICODE if cfg.cleaning == "unicode" else text_rules._KEEP).pattern,
            "then": [[p.pattern, r] for p, r in text_rules._RULES],
            "finally": "collapse whitespace, strip, lowercase, keep the first max_words words",
        },
    }


def check_export_path(out: Path) -> Path:
    """Fail before any work where ``out`` cannot take an export, or where writing it would
    replace what is not an export's: a model's folder (its tokenizer files would be replaced;
    ``MODEL/config.onnx`` would write its spec over the checkpoint's config.json), a spec
    path holding another file, a folder under a file or one that cannot be written."""
    if out.suffix != ".onnx":
        raise ConfigError(f"out={out}: give a file name ending in .onnx, e.g. {out.with_suffix('.onnx').name}",
                          field="out")
    if out.is_dir():
        raise ConfigError(f"out={out}: is a folder; give a file name ending in .onnx", field="out")
    folder, spec = out.parent, out.with_suffix(".json")
    if any((folder / name).exists() for name in ("model.safetensors", "pytorch_model.bin")):
        raise ConfigError(f"out={out}: {folder} holds a model, whose files the export would replace; export into "
                          "a folder of its own, e.g. out=exports/model.onnx", field="out")
    if spec.exists() and not _is_spec(spec):
        raise ConfigError(f"out={out}: its spec would overwrite {spec}, which is not an export's; pick another "
                          "out=FILE", field="out")
    check_writable(folder)  # a folder under a file, or one that cannot be written: refused, as for a checkpoint
    return out


def _is_spec(path: Path) -> bool:
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(spec, dict) and {"n_bits", "model_id", "inputs", "output"} <= set(spec)


def export_codes_graph(model_dir: str | Path, out: str | Path) -> Path:
    """Write ``out`` (an .onnx file) and, beside it, the tokenizer and ``<stem>.json``. The
    graph is written under a temporary name and renamed when complete: a failed export (a
    full disk) leaves no partial graph, and an earlier export at ``out`` stays whole."""
    out = check_export_path(Path(out))
    config = read_checkpoint(model_dir).config  # Hasher.load below checks the weights and the encoder, once
    features = config.features
    # the graph computes in float32 whatever the model encodes in (int8 runs only on ONNX
    # Runtime's own kernels, bf16/fp16 are an accelerator's): fp32 models keep every code
    encoder = FrozenEncoder(features, device="cpu", reach=config.model.pad_reach, backend="torch", precision="fp32")
    if features.precision != "fp32":
        logger.warning("%s encodes in %s; the exported graph computes in float32, so a code near a sign boundary "
                       "can differ from Hasher.encode in a bit (re-ingest with the graph's codes if that matters)",
                       model_dir, features.precision)
    hasher = Hasher.load(model_dir, encoder=encoder)
    partial, spec = out.with_name(f".{out.stem}.partial.onnx"), out.with_name(f".{out.stem}.json.partial")
    tokenizer = out.with_name(f".{out.stem}.tokenizer.partial")
    try:
        hasher.encoder.tokenizer.save_pretrained(str(tokenizer))
        beside = out.parent / "tokenizer.json"
        if beside.exists() and beside.read_bytes() != (tokenizer / "tokenizer.json").read_bytes():
            raise ConfigError(f"out={out}: {out.parent} holds another encoder's tokenizer.json (an earlier "
                              "export's), which this export would replace; export into a folder of its own", field="out")
        export_graph(TokensToCodes(hasher), hasher.encoder.model, partial, "codes", {0: "batch"})
        optimise(partial, hasher.encoder.model.config)
        for file in tokenizer.iterdir():
            file.replace(out.parent / file.name)
        spec.write_text(json.dumps(text_spec(hasher), indent=2) + "\n")
        spec.replace(out.with_suffix(".json"))
        partial.replace(out)
    finally:
        for leftover in (partial, spec):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(tokenizer, ignore_errors=True)
    return out
