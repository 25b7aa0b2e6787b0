"""The eval command's request (``EvalRequest``, checked when made) and its one entry point.

    >>> request = EvalRequest("runs/bbc-64", database=CorpusSpec.parse("bbc:train"),
    ...                       queries=CorpusSpec.parse("bbc:val"), baselines=("itq",))
    >>> [r["precision_at_k"] for r in evaluate(request)]   # the model's, then ITQ's"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dhim_ray.config import DEFAULT_ENCODER, FeatureConfig
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError
from dhim_ray.eval_in_memory import WindowSpec
from dhim_ray.retrieval.baselines import FLOAT_BASELINES
from dhim_ray.retrieval.fusion import Fusion, check_mode
from dhim_ray.retrieval.rerank import check_rerank

logger = logging.getLogger(__name__)

TASKS = ("topic", "known-item")
#: A hashing baseline's width when none is given (ubinary: the encoder's own).
BASELINE_BITS = 64
BASELINE_WORDS = 50


def _shown(spec: CorpusSpec) -> str:
    return f"{spec.name}:{spec.split}" if spec.split else spec.name


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: a ``model_dir`` and/or ``baselines``, scored against a ``database`` corpus
    (in memory) or a Milvus ``collection``, on ``task`` topic (precision@k; cosine-neighbour
    recall without labels) or known-item (``windows`` cut from documents). ``bits``, ``encoder``,
    ``max_words`` apply to baselines; ``nprobe``, ``mode``, ``fusion`` to a collection; ``rerank`` m
    re-ranks k x m candidates; ``curves`` gives precision at every k. See docs/evaluation.md."""

    model_dir: str | Path | None = None
    baselines: tuple[str, ...] = ()
    database: CorpusSpec | None = None
    queries: CorpusSpec | None = None
    collection: MilvusTarget | None = None
    task: str = "topic"
    k: int = 100
    rerank: int = 1
    bits: int | None = None
    encoder: str | None = None
    max_words: int | None = None
    nprobe: int | None = None
    mode: str | None = None
    fusion: Fusion | None = None
    windows: WindowSpec = WindowSpec()
    cache_dir: str | Path | None = None
    curves: bool = False

    def __post_init__(self):
        object.__setattr__(self, "baselines", tuple(dict.fromkeys(self.baselines or ())))
        check_rerank(self.rerank)
        if self.task not in TASKS:
            raise ConfigError(f"task={self.task!r}: choose topic or known-item", field="task")
        if self.mode is not None:
            check_mode(self.mode)
        self._check_methods()
        self._check_place()
        if self.cache_dir is not None:
            from dhim_ray.encoding.feature_store import check_cache_dir

            check_cache_dir(self.cache_dir)

    def _check_methods(self) -> None:
        """A model, baselines or both, and the options each takes."""
        if self.model_dir is None and not self.baselines:
            raise ConfigError("give a model folder, baseline=NAME, or both to compare them")
        if self.rerank > 1 and self.model_dir is None:
            raise ConfigError(f"rerank={self.rerank} with baseline={self.baselines[0]}: re-ranking needs a DHIM "
                              "model's scores; drop one", field="rerank")
        if not self.baselines:  # options a model does not take are refused, never ignored
            for name in ("bits", "encoder", "max_words"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name}={getattr(self, name)}: applies to baseline=NAME only; a model uses the "
                                      "width, encoder and words it was trained with, drop it")
        elif self.bits is not None and all(b in FLOAT_BASELINES for b in self.baselines):
            raise ConfigError(f"bits={self.bits}: baseline={self.baselines[0]} searches the float vectors, not codes; "
                              "drop it", field="bits")

    def _check_place(self) -> None:
        """In memory (a database corpus) or in Milvus (a collection), and what each needs."""
        if self.collection is None:
            for name in ("nprobe", "mode", "fusion"):
                if (value := getattr(self, name)) is not None:
                    raise ConfigError(f"{name}={getattr(value, 'method', value)}: applies to a Milvus collection=NAME only "
                                      "(in-memory eval searches the codes exactly); drop it or add collection=NAME")
            if self.database is None:
                raise ConfigError("eval needs database=CORPUS:SPLIT (or collection=NAME to search Milvus)")
        else:
            name = self.collection.collection
            if self.database is not None:
                raise ConfigError(f"database={_shown(self.database)} and collection={name} both given; the "
                                  "collection is the database, drop one", field="database")
            if self.model_dir is None:
                raise ConfigError(f"collection={name}: give the model folder the collection was ingested with", field="collection")
            if self.baselines:
                raise ConfigError(f"collection={name} searches the model's codes in Milvus; baseline="
                                  f"{self.baselines[0]} is evaluated in memory against database=CORPUS: drop one", field="collection")
            if self.curves:
                raise ConfigError(f"collection={name}: curves are drawn from in-memory evaluations "
                                  "(database=CORPUS); drop collection=NAME or the plot", field="collection")
            if self.task == "known-item" and self.queries is not None:
                raise ConfigError(f"queries={_shown(self.queries)}: known-item windows in a collection are cut from "
                                  "its own texts; drop it", field="queries")
        if self.task == "topic" and self.queries is None:
            raise ConfigError("eval needs queries=CORPUS:SPLIT, e.g. queries=bbc:test")

    def baseline_bits(self, name: str, model_bits: int | None = None) -> int | None:
        """A hashing baseline's width: ``bits``, else the model's beside it, else 64 (ubinary:
        its encoder's)."""
        if self.bits is not None or name == "ubinary":
            return self.bits
        return BASELINE_BITS if model_bits is None else model_bits

    def baseline_features(self, model: FeatureConfig | None = None) -> FeatureConfig:
        """The features the baselines hash: ``encoder`` and ``max_words`` where given, else the
        model's beside them (the same encoder pass: the corpus is encoded once), else the
        packaged encoder and 50 words."""
        if model is None:
            return FeatureConfig(DEFAULT_ENCODER if self.encoder is None else self.encoder,
                                 BASELINE_WORDS if self.max_words is None else self.max_words)
        if self.encoder is None and self.max_words is None:
            return model
        return FeatureConfig(model.encoder if self.encoder is None else self.encoder,
                             model.max_words if self.max_words is None else self.max_words)


def evaluate(request: EvalRequest, progress: bool = True) -> list[dict[str, Any]]:
    """Every method of ``request`` measured, the model first: one result dict each (the
    figures of its task, ``method``, ``n_queries``, ``n_database``; ``curve`` where asked)."""
    from dhim_ray.encoding.encoder import shared_features
    from dhim_ray.eval_in_memory import Baseline, Model

    r = request
    with shared_features():  # every method encodes the same texts: once, where the settings agree
        methods: list[Model | Baseline] = [] if r.model_dir is None else [Model(r.model_dir)]
        if r.collection is not None:
            from dhim_ray.eval_in_milvus import InMilvus

            with InMilvus.open(methods[0], r.collection, r.nprobe, mode=r.mode, fusion=r.fusion,
                               rerank=r.rerank) as place:
                return [_task(r, methods[0], place, progress)]
        model = methods[0].hasher if methods else None  # baselines beside a model: its features and width
        features = r.baseline_features(None if model is None else model.config.features)
        methods += [Baseline(name, r.baseline_bits(name, None if model is None else model.n_bits), features)
                    for name in r.baselines]
        return [_task(r, m, r.database, progress) for m in methods]


def _task(r: EvalRequest, method, database, progress: bool) -> dict[str, Any]:
    from dhim_ray.eval_in_memory import known_item_task, topic

    common = {"rerank": r.rerank, "progress": progress, "cache_dir": r.cache_dir, "curve": r.curves}
    if r.task == "known-item":
        return known_item_task(method, database, r.queries, r.windows, **common)
    return topic(method, database, r.queries, r.k, **common)
