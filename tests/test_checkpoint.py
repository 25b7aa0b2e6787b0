import json

import numpy as np
import pytest

from conftest import TOPICS, build_tiny_bert, make_toy_corpus
from dhim_ray.checkpoint import load_checkpoint, save_checkpoint
from dhim_ray.encoder import FrozenEncoder
from dhim_ray.errors import CheckpointError, DataError, EncoderMismatchError
from dhim_ray.hasher import Hasher
from dhim_ray.training import build_model


@pytest.fixture()
def saved(tmp_path, tiny_config, tiny_bert):
    enc = FrozenEncoder(tiny_config.features)
    model = build_model(tiny_config)
    return save_checkpoint(tmp_path / "ckpt", model, tiny_config, enc.fingerprint), model


def test_round_trip_gives_identical_codes(saved, tiny_config):
    path, model = saved
    texts = [t for _, t in make_toy_corpus(5)]
    enc = FrozenEncoder(tiny_config.features)
    from dhim_ray.training import hash_features

    before = hash_features(model, enc.features(texts))
    hasher = Hasher.load(path)
    after = hasher.encode(texts, batch_size=3)
    assert after.dtype == np.uint8 and after.shape == (len(texts), 2)
    assert np.array_equal(before, after)
    assert hasher.encode_bytes(texts[:1])[0] == after[0].tobytes()
    loaded, cfg, meta = load_checkpoint(path)
    assert cfg == tiny_config and meta["encoder"]["hidden_size"] == 32


def test_no_pickle_in_checkpoint(saved):
    path, _ = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        load_checkpoint(tmp_path / "nope")


def test_missing_weights(saved):
    path, _ = saved
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_checkpoint(path)


def test_corrupt_config(saved):
    path, _ = saved
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is corrupt"):
        load_checkpoint(path)


def test_corrupt_weights(saved):
    path, _ = saved
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_checkpoint(path)


def test_weights_not_matching_config(saved):
    path, _ = saved
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["model"]["n_bits"] = 32
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="weights do not match its config"):
        load_checkpoint(path)


def test_mismatched_encoder(tmp_path, tiny_config):
    enc_dir = build_tiny_bert(tmp_path / "enc", hidden_size=32)
    cfg = tiny_config.replace(features={"encoder": str(enc_dir)})
    path = save_checkpoint(tmp_path / "ck", build_model(cfg), cfg, FrozenEncoder(cfg.features).fingerprint)
    build_tiny_bert(enc_dir, hidden_size=48)  # the encoder at that path changed
    with pytest.raises(EncoderMismatchError, match=r"\(width 32\) but encoder .* has width 48"):
        Hasher.load(path)


def test_encode_refuses_empty_text(saved):
    hasher = Hasher.load(saved[0])
    with pytest.raises(DataError, match="text 1 .* is empty after cleaning"):
        hasher.encode(["football goal", "  ?? "[:0] + "@@"])
    with pytest.raises(DataError, match="text 0 is a int"):
        hasher.encode([3])
