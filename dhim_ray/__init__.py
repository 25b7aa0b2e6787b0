"""dhim-ray: semantic hashing of documents with DHIM (Deep Hash InfoMax).

The library (this package) imports neither Ray nor pymilvus. Public API:

    >>> from dhim_ray import Hasher
    >>> hasher = Hasher.load("runs/bbc-64")
    >>> codes = hasher.encode(["a document"])   # np.uint8 (1, 8), MSB first

Names are imported lazily so that ``import dhim_ray.codes`` (used by the Milvus
connector) does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "Hasher": "dhim_ray.hasher",
    "DHIM": "dhim_ray.model",
    "DHIMConfig": "dhim_ray.config",
    "FeatureConfig": "dhim_ray.config",
    "ModelConfig": "dhim_ray.config",
    "TrainConfig": "dhim_ray.config",
    "config_for_bits": "dhim_ray.config",
    "FrozenEncoder": "dhim_ray.encoder",
    "load_corpus": "dhim_ray.data",
    "load_checkpoint": "dhim_ray.checkpoint",
    "save_checkpoint": "dhim_ray.checkpoint",
    "fit": "dhim_ray.training",
    "train_corpus": "dhim_ray.pipeline",
    "pack_codes": "dhim_ray.codes",
    "unpack_codes": "dhim_ray.codes",
    "check_codes": "dhim_ray.codes",
    "hamming_topk": "dhim_ray.metrics",
    "precision_at_k": "dhim_ray.metrics",
    "make_baseline": "dhim_ray.baselines",
    "DHIMRayError": "dhim_ray.errors",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dhim_ray' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .hasher import Hasher  # noqa: F401
