"""A trained model ready to hash text: ``Hasher.load(dir).encode(texts)``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tqdm.auto import tqdm

from dhim_ray.codes import TextHasher
from dhim_ray.config import DHIMConfig
from dhim_ray.corpus.text import check_texts
from dhim_ray.encoding.encoder import DIGEST_FIELD, Features, FrozenEncoder, encoder_identity
from dhim_ray.errors import EncoderMismatchError
from dhim_ray.model.checkpoint import CheckpointInfo, load_checkpoint, read_checkpoint, verify_weights
from dhim_ray.model.dhim import DHIM
from dhim_ray.model.inference import hash_features, score_features

log = logging.getLogger(__name__)


def _fingerprint_body(fingerprint: str) -> str:
    # The first field is the encoder's name or path, which may differ between
    # machines for the same model; the rest describes the model and tokenisation,
    # and for a local folder its weights.
    return fingerprint.split("|", 1)[-1]


def same_encoder(trained: str, loaded: str) -> bool:
    """Whether an encoder with fingerprint ``loaded`` is the one a checkpoint was trained on.

    A checkpoint written before local folders carried a weights digest matches its folder
    by name (its weights cannot be checked, as before); otherwise the architecture, the
    token settings and, for a folder, the weights must agree, wherever the folder lies.
    """
    if _fingerprint_body(trained) == _fingerprint_body(loaded):
        return True
    undigested, _, digest = loaded.rpartition("|")
    legacy = digest.startswith(DIGEST_FIELD) and trained == undigested
    if legacy:  # the same name and body: the folder it was trained on, its weights unchecked
        log.warning("checkpoint predates encoder weight digests: its encoder '%s' is matched by name only",
                    undigested.split("|", 1)[0])
    return legacy


class Encoded(NamedTuple):
    """``Hasher.encode(..., scores=True, vectors=True)``: what was asked for, else None."""

    codes: np.ndarray
    scores: np.ndarray | None
    vectors: np.ndarray | None


def check_encoder(info: CheckpointInfo, encoder: str, fingerprint: str, hidden_size: int) -> None:
    """Raise EncoderMismatchError unless an encoder of this ``fingerprint`` and width is the
    one the checkpoint was trained on."""
    width = info.config.model.hidden_size
    if hidden_size != width:
        raise EncoderMismatchError(
            f"checkpoint {info.path} was trained on {info.encoder_name} (width {width}) "
            f"but encoder {encoder} has width {hidden_size}; use the training encoder"
        )
    trained = info.encoder_fingerprint
    if trained and not same_encoder(trained, fingerprint):
        raise EncoderMismatchError(
            f"checkpoint {info.path} was trained on encoder '{trained}' but '{fingerprint}' was loaded; "
            "use the encoder (the same weights) and max_words it was trained with"
        )


class Hasher(TextHasher):
    """Text -> packed binary codes with a trained DHIM model and its frozen encoder.

        >>> hasher = Hasher.load("runs/dbpedia-64")
        >>> codes = hasher.encode(["a query"])      # uint8 (1, 8)
        >>> hasher.encode_bytes(["a query"])         # [b'...'] for MilvusClient.search"""

    def __init__(self, model: DHIM, config: DHIMConfig, encoder: FrozenEncoder, info: CheckpointInfo | None = None):
        self.model = model.eval()
        self.config = config
        self.encoder = encoder
        self.info = info

    @property
    def model_id(self) -> str:
        """The id stamped on collections ingested with this model ("" if not loaded from a folder)."""
        return self.info.model_id if self.info is not None else ""

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", encoder: FrozenEncoder | None = None,
             backend: str | None = None) -> Hasher:
        """Load a checkpoint folder and its encoder (run by ``backend``, default the checkpoint's
        ``features.backend``: "auto"). Raises CheckpointError or EncoderMismatchError when the
        encoder differs from the one trained on."""
        model, config, info = load_checkpoint(path)
        if encoder is None:
            encoder = FrozenEncoder(config.features, device=device, reach=config.model.pad_reach, backend=backend)
        elif encoder.reach is not None and (config.model.pad_reach is None or encoder.reach < config.model.pad_reach):
            encoder.reach = config.model.pad_reach  # the head reads further past a document's end
        check_encoder(info, encoder.config.encoder, encoder.fingerprint, encoder.hidden_size)
        return cls(model.to(encoder.device), config, encoder, info)

    @staticmethod
    def check(path: str | Path) -> CheckpointInfo:
        """What ``load`` checks, without loading weights: the checkpoint folder, its weights'
        digest, and that its encoder is there and is the one it was trained on (from the
        encoder's config.json and weights' digest). For a driver that only needs the model's
        fields (code width, id, feature settings) before workers load it."""
        info = read_checkpoint(path)
        verify_weights(info)
        features = info.config.features
        check_encoder(info, features.encoder, *encoder_identity(features))
        return info

    def _batches(self, texts: list[str] | str, batch_size: int,
                 prepared: bool = False) -> tuple[int, Iterator[tuple[np.ndarray, Features]]]:
        """(number of texts, (row indices, features) per encoder pass); texts checked unless ``prepared``."""
        if isinstance(texts, str):
            texts = [texts]
        if not prepared:
            texts = check_texts(texts, self.config.features)  # cleaned once, here
        return len(texts), self.encoder.iter_batches(texts, batch_size, on_device=True, prepared=True)

    def encode(self, texts: list[str] | str, batch_size: int = 64, progress: bool = False, scores: bool = False,
               vectors: bool = False, prepared: bool = False) -> np.ndarray | Encoded:
        """Texts -> packed codes, uint8 (n, n_bits // 8), most significant bit first (``prepared``: texts
        already ``check_texts``' output). With ``scores`` and/or ``vectors``: an ``Encoded`` (codes,
        scores: the pre-threshold (n, n_bits) float32 in (-1, 1) that ``retrieval.rerank`` uses,
        vectors: the encoder's mean-pooled (n, width) float32); what was not asked for is None."""
        n, batches = self._batches(texts, batch_size, prepared)
        codes = np.empty((n, self.n_bytes), dtype=np.uint8)
        bit_scores = np.empty((n, self.n_bits), dtype=np.float32) if scores else None
        means = np.empty((n, self.encoder.hidden_size), dtype=np.float32) if vectors else None
        with tqdm(total=n, desc="hashing", unit="doc", disable=not progress, leave=False) as bar:
            for rows, feats in batches:
                if bit_scores is not None:
                    codes[rows], bit_scores[rows] = self.score_features(feats)
                else:
                    codes[rows] = self.hash_features(feats)
                if means is not None:
                    means[rows] = feats.mean
                bar.update(len(rows))
        return Encoded(codes, bit_scores, means) if scores or vectors else codes

    def hash_features(self, feats: Features) -> np.ndarray:
        return hash_features(self.model, feats, device=self.encoder.device)

    def score_features(self, feats: Features) -> tuple[np.ndarray, np.ndarray]:
        """(packed codes, pre-threshold scores) of cached features: see ``encode(..., scores=True)``."""
        return score_features(self.model, feats, device=self.encoder.device)
