import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import build_tiny_bert, make_toy_corpus

from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.errors import CheckpointError, DataError, EncoderMismatchError
from dhim_ray.hasher import Hasher
from dhim_ray.model.checkpoint import check_writable, load_checkpoint, read_checkpoint, save_checkpoint
from dhim_ray.training.loop import build_model


@pytest.fixture()
def saved(tmp_path, tiny_config, tiny_bert):
    enc = FrozenEncoder(tiny_config.features)
    model = build_model(tiny_config)
    return save_checkpoint(tmp_path / "ckpt", model, tiny_config, enc.fingerprint), model


def test_round_trip_gives_identical_codes(saved, tiny_config):
    path, model = saved
    texts = [t for _, t in make_toy_corpus(5)]
    enc = FrozenEncoder(tiny_config.features)
    from dhim_ray.model.inference import hash_features

    before = hash_features(model, enc.features(texts))
    hasher = Hasher.load(path)
    after = hasher.encode(texts, batch_size=3)
    assert after.dtype == np.uint8 and after.shape == (len(texts), 2)
    assert np.array_equal(before, after)
    assert hasher.encode_bytes(texts[:1])[0] == after[0].tobytes()
    loaded, cfg, info = load_checkpoint(path)
    assert cfg == tiny_config and info.config.model.hidden_size == 32 and len(info.weights_sha256) == 64


def test_identity_bits_survive_the_checkpoint(tmp_path, tiny_config):
    from dhim_ray.model.inference import hash_features
    from dhim_ray.training.loop import fit_transforms

    cfg = replace(tiny_config, model=replace(tiny_config.model, identity_bits=8))  # 8 head bits + 8 fixed
    enc, model = FrozenEncoder(cfg.features), build_model(cfg)
    texts = [t for _, t in make_toy_corpus(60, seed=4)]
    fit_transforms(model, enc.features(texts))
    path = save_checkpoint(tmp_path / "ck", model, cfg, enc.fingerprint)
    before = hash_features(model, enc.features(texts))
    assert len(set(before[:, 1].tolist())) > 5  # the identity byte varies over the texts
    hasher = Hasher.load(path)
    assert hasher.n_bits == 16 and np.array_equal(hasher.encode(texts), before)
    assert load_checkpoint(path)[1].model.identity_bits == 8


def test_no_pickle_in_checkpoint(saved):
    path, _ = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        load_checkpoint(tmp_path / "nope")


def test_the_folder_above_a_model_names_the_models_in_it(saved):
    path, _ = saved
    with pytest.raises(CheckpointError, match=rf"a folder of models \({path.name}\); pass one of them, e.g. "):
        read_checkpoint(path.parent)


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
    with pytest.raises(CheckpointError, match="model.safetensors does not match the SHA-256 recorded"):
        load_checkpoint(path)


def test_flipped_bytes_in_the_weights_are_refused(saved):
    """Issue 11.5: a weights file with flipped bytes used to load and give garbage codes."""
    path, _ = saved
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF  # inside a tensor: the file still parses as safetensors
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256 recorded in config.json"):
        Hasher.load(path)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["config"].pop("model"), "has no model/features config"),
    (lambda m: m["config"]["model"].update(n_bits="sixty-four"), "holds an invalid config"),
    (lambda m: m["config"]["model"].update(n_bits=60), "holds an invalid config .*n_bits=60"),
    (lambda m: m["config"]["train"].update(nope=1), "holds an invalid config"),
])
def test_broken_config_is_one_clear_error(saved, edit, message):
    """Issue 11.10: config.json without a model section or with a non-integer n_bits."""
    path, _ = saved
    meta = json.loads((path / "config.json").read_text())
    edit(meta)
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(path)


def test_unwritable_out_is_refused_before_work(tmp_path):
    """Issue 11.4: --out a file (or under one) fails at once, not after training."""
    (tmp_path / "afile").write_text("x")
    for bad in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(CheckpointError, match="is a file, not a folder"):
            check_writable(bad)
    assert (tmp_path / "afile").read_text() == "x"


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


def test_a_checkpoint_knows_a_local_encoder_by_its_weights(tmp_path, tiny_config, caplog):
    """Same architecture, other weights (as a refined encoder is): refused, at the same path too;
    the same weights in another folder (the encoder copied to another machine): accepted."""
    enc_dir = build_tiny_bert(tmp_path / "enc", seed=0)
    cfg = tiny_config.replace(features={"encoder": str(enc_dir)})
    fingerprint = FrozenEncoder(cfg.features).fingerprint
    path = save_checkpoint(tmp_path / "ck", build_model(cfg), cfg, fingerprint)
    copy = shutil.copytree(enc_dir, tmp_path / "elsewhere")
    assert Hasher.load(path, encoder=FrozenEncoder(replace(cfg.features, encoder=str(copy)))).n_bits == 16
    other = build_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(EncoderMismatchError, match=r"weights=.* was loaded; use the encoder \(the same weights\)"):
        Hasher.load(path, encoder=FrozenEncoder(replace(cfg.features, encoder=str(other))))
    build_tiny_bert(enc_dir, seed=1)  # the encoder at that path changed
    with pytest.raises(EncoderMismatchError):
        Hasher.load(path)
    # a checkpoint from before the digest matches its folder by name, and says it could not check more
    legacy = save_checkpoint(tmp_path / "legacy", build_model(cfg), cfg, fingerprint.rsplit("|", 1)[0])
    assert Hasher.load(legacy).n_bits == 16 and "matched by name only" in caplog.text
    with pytest.raises(EncoderMismatchError):
        Hasher.load(legacy, encoder=FrozenEncoder(replace(cfg.features, encoder=str(copy))))


def test_a_fingerprint_names_the_weights_that_were_loaded(tmp_path, tiny_config):
    """The folder rewritten after the encoder loaded it (refined again into the same --out while
    features were computed): the fingerprint still names the weights in memory, not the new ones."""
    enc_dir = build_tiny_bert(tmp_path / "enc", seed=0)
    cfg = tiny_config.replace(features={"encoder": str(enc_dir)})
    loaded = FrozenEncoder(cfg.features)
    before = FrozenEncoder(cfg.features).fingerprint
    build_tiny_bert(enc_dir, seed=1)
    assert loaded.fingerprint == before != FrozenEncoder(cfg.features).fingerprint


def test_a_checkpoint_never_overwrites_another_model(tmp_path, tiny_config, tiny_bert):
    encoder = shutil.copytree(tiny_bert, tmp_path / "encoder")  # config.json + model.safetensors too
    before = {f.name: f.read_bytes() for f in encoder.iterdir()}
    with pytest.raises(CheckpointError, match="config.json that is not a dhim-ray checkpoint's .* pick an empty folder"):
        save_checkpoint(encoder, build_model(tiny_config), tiny_config)
    assert {f.name: f.read_bytes() for f in encoder.iterdir()} == before
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.safetensors").write_bytes(b"someone's weights")
    with pytest.raises(CheckpointError, match="model.safetensors without a dhim-ray config.json"):
        save_checkpoint(tmp_path / "weights", build_model(tiny_config), tiny_config)
    assert (tmp_path / "weights" / "model.safetensors").read_bytes() == b"someone's weights"
    ours = save_checkpoint(tmp_path / "ours", build_model(tiny_config), tiny_config)
    assert save_checkpoint(ours, build_model(tiny_config), tiny_config) == ours  # a checkpoint is replaced, as before


def test_encode_refuses_empty_text(saved):
    hasher = Hasher.load(saved[0])
    with pytest.raises(DataError, match="text 1 .* is empty after cleaning"):
        hasher.encode(["football goal", "  ?? "[:0] + "@@"])
    with pytest.raises(DataError, match="text 0 is a int"):
        hasher.encode([3])


def test_a_resume_asks_for_the_identity_bits_the_encoder_gave(tmp_path, tiny_config):
    """A 128-bit run on a 32-wide encoder trains 32 identity bits, not the shipped 64: resuming it
    with the same command is the same settings; other identity bits are a different run."""
    from dhim_ray.config import config_for_bits
    from dhim_ray.training.pipeline import resume_config

    requested = config_for_bits(128, features={"encoder": tiny_config.features.encoder, "max_words": 12})
    started = requested.for_encoder(32)
    assert requested.model.identity_bits == 64 and started.model.identity_bits == 32
    path = save_checkpoint(tmp_path / "run", build_model(started), started, "fingerprint")
    assert resume_config(path, requested).model.identity_bits == 32
    with pytest.raises(CheckpointError, match="started with model.identity_bits=32, this command asks for 16"):
        resume_config(path, requested.replace(model={"identity_bits": 16}))


@pytest.mark.parametrize("version, says", [(2, "train the model again"), (5, "upgrade dhim-ray"),
                                            ("4", "train the model again")])
def test_a_checkpoint_of_another_format_version_is_refused_in_one_line(saved, version, says):
    """An older format (its config may hold retired fields, its weights no digest) is not read
    field by field: refused, saying how to move on; so is a newer one."""
    path, _ = saved
    meta = json.loads((path / "config.json").read_text())
    meta["format_version"] = version
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"format version {version!r} and this dhim-ray reads 4; {says}"):
        read_checkpoint(path)


def test_a_format_3_checkpoint_is_read_without_its_retired_lever(saved, tiny_config):
    """Format 3 differs from 4 only by train.feature_dropout: it loads, the same model."""
    path, model = saved
    meta = json.loads((path / "config.json").read_text())
    meta["format_version"], meta["config"]["train"]["feature_dropout"] = 3, 0.25
    (path / "config.json").write_text(json.dumps(meta))
    loaded, config, _ = load_checkpoint(path)
    assert config == tiny_config
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_a_config_without_the_weights_digest_is_refused(saved):
    path, _ = saved
    meta = json.loads((path / "config.json").read_text())
    meta.pop("weights_sha256")
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="has no weights_sha256, so its weights cannot be checked"):
        read_checkpoint(path)


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000, '{"format": ' + "7" * 5000 + "}"],
                         ids=["nested", "long-integer"])
def test_a_config_json_bomb_is_one_line(saved, text):
    path, _ = saved
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="is not a config dhim-ray wrote") as caught:
        read_checkpoint(path)
    assert "\n" not in str(caught.value)
