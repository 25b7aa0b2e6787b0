"""dhim-ray: semantic hashing of documents with DHIM (Deep Hash InfoMax). Names are imported lazily
(``import dhim_ray`` loads neither torch nor pymilvus); the layers are in CONTRIBUTING.md.

    >>> from dhim_ray import Hasher, Searcher
    >>> codes = Hasher.load("runs/bbc-64").encode(["a document"])   # np.uint8 (1, 8), MSB first"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# grpcio's fork support (on by default) restarts its poller thread in every forked child; while a
# pymilvus channel is open, some children then abort between fork and exec (grpc/grpc#43055;
# bench ray_start). Ray starts its GCS and raylet that way, so such a start waited its fixed 30 s
# and began again. Read when grpc is first imported: set here, before pymilvus or Ray load it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

_LAZY = {
    "Hasher": "dhim_ray.hasher",
    "Searcher": "dhim_ray.search",
    "SearchRequest": "dhim_ray.search",
    "DHIMEmbeddingFunction": "dhim_ray.embedding",
    "CorpusSpec": "dhim_ray.corpus.spec",
    "DHIM": "dhim_ray.model.dhim",
    "DHIMConfig": "dhim_ray.config",
    "FeatureConfig": "dhim_ray.config",
    "ModelConfig": "dhim_ray.config",
    "TrainConfig": "dhim_ray.config",
    "config_for_bits": "dhim_ray.config",
    "FrozenEncoder": "dhim_ray.encoding.encoder",
    "load_corpus": "dhim_ray.corpus.data",
    "load_split": "dhim_ray.corpus.data",
    "load_checkpoint": "dhim_ray.model.checkpoint",
    "save_checkpoint": "dhim_ray.model.checkpoint",
    "fit": "dhim_ray.training.loop",
    "train_corpus": "dhim_ray.training.pipeline",
    "pack_codes": "dhim_ray.codes",
    "unpack_codes": "dhim_ray.codes",
    "check_codes": "dhim_ray.codes",
    "hamming_topk": "dhim_ray.retrieval.metrics",
    "precision_at_k": "dhim_ray.retrieval.metrics",
    "make_baseline": "dhim_ray.retrieval.baselines",
    "DHIMRayError": "dhim_ray.errors",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dhim_ray' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from dhim_ray.hasher import Hasher  # noqa: F401
