"""Shared fixtures: a tiny random BERT built in the test (no download) and a
small topical toy corpus it can tell apart."""

from __future__ import annotations

import csv
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

import dhim_ray  # noqa: F401  (first: it turns grpcio's fork support off before a test loads pymilvus or Ray)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Exported ONNX graphs of the tests' encoders go to a folder of this run, not the user's cache.
os.environ.setdefault("DHIM_RAY_CACHE", tempfile.mkdtemp(prefix="dhim-ray-test-cache-"))

# tests/server runs only inside its own network namespace (see test_milvus_server.py).
collect_ignore = [] if os.environ.get("DHIM_RAY_NETNS") == "1" else ["server"]

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOPICS = {
    0: "football match goal striker league season coach stadium team player score win",
    1: "election vote parliament minister party government policy campaign law senate",
    2: "computer software chip internet network data code server processor digital",
    3: "film actor music album concert movie director song festival award singer",
}


def make_toy_corpus(n_per_topic: int, seed: int = 0, words: int = 12) -> list[tuple[int, str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for label, vocab in TOPICS.items():
        vocab = vocab.split()
        for _ in range(n_per_topic):
            rows.append((label, " ".join(rng.choice(vocab, size=words))))
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def write_csv(path: Path, rows, header: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        if header:
            w.writerow(["label", "text"])
        w.writerows(rows)
    return path


def build_tiny_bert(folder: Path, hidden_size: int = 32, seed: int = 0) -> Path:
    """A random 2-layer BERT and a WordPiece tokenizer over the toy vocabulary."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    words = sorted({w for text in TOPICS.values() for w in text.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz") + words
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 reads the vocabulary from vocab= (vocab_file= is ignored there, leaving a
    # tokenizer that maps every word to [UNK] and a BERT that gives every text the same vector)
    tok = BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    ids = tok(" ".join(words), add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and len(ids) == len(words), "the tiny BERT's tokenizer lost its vocabulary"
    tok.save_pretrained(folder)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=2 * hidden_size, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(folder)
    return folder


_LOGGER = logging.getLogger("dhim_ray")
_LOGGER_AT_START = (_LOGGER.handlers[:], _LOGGER.level, _LOGGER.propagate)


@pytest.fixture(autouse=True)
def _dhim_ray_logger_as_at_start():
    """The CLI, run in-process by many tests and by module-scoped fixtures (which run before this
    one), sets the dhim_ray logger up for a terminal: its own handler, no propagation. Each test
    starts and ends with the logger as it was before any test, so caplog sees its lines."""
    _LOGGER.handlers[:], _LOGGER.level, _LOGGER.propagate = _LOGGER_AT_START
    yield
    _LOGGER.handlers[:], _LOGGER.level, _LOGGER.propagate = _LOGGER_AT_START


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


@pytest.fixture(scope="session")
def toy_folder(tmp_path_factory) -> Path:
    """A local corpus folder like ../shared/data: headerless train.csv and val.csv."""
    root = tmp_path_factory.mktemp("toy")
    write_csv(root / "train.csv", make_toy_corpus(40, seed=1))
    write_csv(root / "val.csv", make_toy_corpus(10, seed=2))
    return root


@pytest.fixture(scope="session")
def tiny_config(tiny_bert):
    from dhim_ray.config import config_for_bits

    return config_for_bits(
        16,
        features={"encoder": tiny_bert, "max_words": 12},
        model={"n_filters": 16, "alpha": 0.3, "hidden_size": 32},
        train={"batch_size": 32, "lr": 3e-3, "max_epochs": 3, "patience": 3, "beta": 0.3},
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, toy_folder, tiny_config) -> Path:
    """A 16-bit model of the tiny BERT trained one epoch on the toy corpus (seconds): for tests
    whose point is not the codes' quality."""
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.training.pipeline import train_corpus

    out = tmp_path_factory.mktemp("tiny-model") / "m"
    train_corpus(CorpusSpec(str(toy_folder)), tiny_config.replace(train={"max_epochs": 1}), out, progress=False)
    return out


def train_bbc16(folder: Path, n: int) -> Path:
    """A 16-bit model trained 2 epochs on the first ``n`` documents of the packaged BBC
    corpus (the real packaged encoder), written to ``folder``: what the ingest tests hash with."""
    from dhim_ray.config import config_for_bits
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.training.pipeline import train_corpus

    cfg = config_for_bits(16, train={"max_epochs": 2, "batch_size": 64})
    train_corpus(CorpusSpec("bbc", limit=n), cfg, folder, progress=False)
    return folder


@pytest.fixture(scope="session")
def bbc16(tmp_path_factory) -> Path:
    """The 16-bit BBC model the ingest, hybrid, column and service tests hash with, trained once
    a session (on BBC's first 240 training documents); a test that changes a model copies it."""
    return train_bbc16(tmp_path_factory.mktemp("bbc16") / "bbc-16", 240)


#: BBC training documents in the session's collection (bbc16_collection).
BBC16_DOCS = 240


@pytest.fixture(scope="session")
def bbc16_collection(ray_session, bbc16, tmp_path_factory):
    """(target, IngestResult): BBC's first BBC16_DOCS training documents ingested with bbc16 into a
    milvus-lite file once a session. The ingest, hybrid and service tests search it; a test
    that changes its rows ingests a collection of its own."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    target = MilvusTarget(str(tmp_path_factory.mktemp("bbc16-db") / "codes.db"), "bbc16")
    return target, run_ingest(IngestRequest(CorpusSpec("bbc", "train", limit=BBC16_DOCS), bbc16, target, workers=2), progress=False)


def shared_corpus(name: str) -> Path:
    """A dev corpus from ../shared/data. Missing, it FAILS the test with how to get it
    (never a silent skip); deselect such tests with -m "not shared_data"."""
    path = SHARED_DATA / name
    if not (path / "train.csv").exists():
        pytest.fail(f"{path} is missing: these tests read the dev corpora in ../shared/data beside the checkout; "
                    "put them there, or run pytest -m 'not shared_data'", pytrace=False)
    return path


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray (2 CPUs) for every integration test: restarting Ray between
    modules has broken a milvus-lite server started afterwards in the same process."""
    import ray

    from dhim_ray.jobs.ray_env import init_ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


#: Modules by the time they take, longest first. The suite runs on two workers (pytest-xdist,
#: a module to a worker, pyproject.toml's addopts); the longest start first, so that both end together.
LONGEST_FIRST = ("test_ray_cluster", "test_doc_commands", "test_readme", "test_milvus_server", "test_bad_input",
                 "test_ingest", "test_serve", "test_ray_train", "test_cluster_config", "test_hybrid",
                 "test_metadata_columns", "test_encode_path")


def pytest_collection_modifyitems(items):
    """The longest modules first (LONGEST_FIRST), the rest in their order. The quick tier starts no
    Ray (a start costs ~8 s): a test on the real Ray is marked slow."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's tests keep their order
    unmarked = [item.nodeid for item in items
                if "ray_session" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError(f"{unmarked[0]} starts Ray (ray_session) but is not marked slow: "
                                "add @pytest.mark.slow, the quick tier runs none")
