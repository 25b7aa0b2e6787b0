"""The query graph: a model's codes through its cached ONNX graph, with no torch in the process
that searches; the torch Hasher where the graph cannot stand in for it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dhim_ray.config import FeatureConfig
from dhim_ray.errors import CheckpointError, DataError
from dhim_ray.graph_hasher import GraphHasher, graph_folder, load_query_hasher
from dhim_ray.hasher import Hasher
from tests.conftest import make_toy_corpus
from tests.test_onnx_backend import bits_changed, random_checkpoint

TEXTS = [t for _, t in make_toy_corpus(30, seed=4)] + ["goal " * 40, "Zürich café ñandú"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DHIM_RAY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "onnx"


@pytest.mark.parametrize("identity_bits", [0, 16])
def test_the_query_graph_gives_the_hashers_codes(tiny_bert, tmp_path, cache, identity_bits):
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32,
                           identity_bits=identity_bits)
    graph, hasher = load_query_hasher(ck), Hasher.load(ck)
    assert isinstance(graph, GraphHasher) and (graph.model_id, graph.n_bits) == (hasher.model_id, 32)
    codes = graph.encode(TEXTS, batch_size=7)  # batches padded to their own longest text
    assert codes.shape == (len(TEXTS), 4) and bits_changed(codes, hasher.encode(TEXTS)) == 0
    assert graph.encode(TEXTS[3]).tolist() == codes[3:4].tolist()
    assert graph.encode_bytes(TEXTS[:2]) == hasher.encode_bytes(TEXTS[:2])
    scored = graph.encode(TEXTS[:5], scores=True)  # what only the torch model gives: from its Hasher
    np.testing.assert_array_equal(scored.scores, hasher.encode(TEXTS[:5], scores=True).scores)
    with pytest.raises(DataError, match="text 1 .* is empty after cleaning"):
        graph.encode(["goal", "@@@ ###"])


def test_the_graph_is_made_once_and_a_later_process_hashes_without_torch(tiny_bert, tmp_path, cache):
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    expected = load_query_hasher(ck).encode(TEXTS).tolist()
    made = [p for p in cache.iterdir()]
    assert [p.name for p in made] == [graph_folder(Hasher.check(ck), __import__("onnxruntime").__version__).name]
    stamp = (made[0] / "model.onnx").stat().st_mtime_ns
    code = (f"import json, sys\nfrom dhim_ray.graph_hasher import load_query_hasher\n"
            f"codes = load_query_hasher({str(ck)!r}).encode({TEXTS!r}).tolist()\n"
            "print(json.dumps([codes, sorted(m for m in ('torch', 'transformers') if m in sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    codes, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == expected and heavy == []
    assert [p.name for p in cache.iterdir()] == [made[0].name] and (made[0] / "model.onnx").stat().st_mtime_ns == stamp


def test_other_weights_get_their_own_graph_and_changed_bytes_are_refused(tiny_bert, tmp_path, cache):
    features = FeatureConfig(encoder=tiny_bert, max_words=12)
    a = random_checkpoint(tmp_path / "a", features, n_bits=32, hidden=32)
    b = random_checkpoint(tmp_path / "b", features, n_bits=32, hidden=32, identity_bits=16)
    assert bits_changed(load_query_hasher(a).encode(TEXTS), load_query_hasher(b).encode(TEXTS)) > 0
    assert len(list(cache.glob("query-*"))) == 2
    weights = a / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        load_query_hasher(a)


def test_a_model_that_encodes_in_another_precision_is_hashed_by_torch(tiny_bert, tmp_path, cache):
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12, precision="int8"),
                           n_bits=32, hidden=32)
    hasher = load_query_hasher(ck)
    assert isinstance(hasher, Hasher) and not cache.exists()


def test_a_cache_that_cannot_be_written_hashes_with_torch_and_says_why(tiny_bert, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DHIM_RAY_CACHE", str(blocker))
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    hasher = load_query_hasher(ck)
    assert isinstance(hasher, Hasher) and bits_changed(hasher.encode(TEXTS), Hasher.load(ck).encode(TEXTS)) == 0
    assert "hashing with torch (no query graph:" in caplog.text


def _flip_middle(path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def _tokenizer_swapped(path) -> None:
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    a, b = "goal", "vote"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(spec))


def _spec_changed(path) -> None:
    spec = json.loads(path.read_text())
    path.write_text(json.dumps({**spec, "max_tokens": 3}))


@pytest.mark.parametrize("tamper", ["another model's graph", "bytes overwritten", "tokenizer ids swapped",
                                    "max_tokens changed", "graph missing", "seal missing"])
def test_a_cached_query_graph_not_as_written_is_made_again_never_used(tiny_bert, tmp_path, cache, caplog, tamper):
    features = FeatureConfig(encoder=tiny_bert, max_words=12)
    a = random_checkpoint(tmp_path / "a", features, n_bits=32, hidden=32)
    b = random_checkpoint(tmp_path / "b", features, n_bits=32, hidden=32, identity_bits=16)
    expected = Hasher.load(a).encode(TEXTS)
    load_query_hasher(a), load_query_hasher(b)
    folder_a, folder_b = (graph_folder(Hasher.check(ck), __import__("onnxruntime").__version__) for ck in (a, b))
    if tamper == "another model's graph":
        for name in ("model.onnx", "model.onnx.sha256"):
            (folder_a / name).write_bytes((folder_b / name).read_bytes())
    elif tamper == "bytes overwritten":
        _flip_middle(folder_a / "model.onnx")
    elif tamper == "tokenizer ids swapped":
        _tokenizer_swapped(folder_a / "tokenizer.json")
    elif tamper == "max_tokens changed":
        _spec_changed(folder_a / "model.json")
    elif tamper == "graph missing":
        (folder_a / "model.onnx").unlink()
    else:
        (folder_a / "tokenizer.json.sha256").unlink()
    with caplog.at_level("WARNING", logger="dhim_ray.graph_hasher"):
        assert bits_changed(load_query_hasher(a).encode(TEXTS), expected) == 0
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{folder_a} does not match the digests it was cached with: making it again"]
    stamp = (folder_a / "model.onnx").stat().st_mtime_ns
    caplog.clear()
    assert bits_changed(load_query_hasher(a).encode(TEXTS), expected) == 0  # repaired once, not made each run
    assert (folder_a / "model.onnx").stat().st_mtime_ns == stamp and not caplog.records
