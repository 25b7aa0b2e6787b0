"""Frozen features on disk (FeatureStore, RowFile): read in pieces, same codes as in memory."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys

import numpy as np
import pytest

from dhim_ray.config import FeatureConfig
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.encoding.encoder import Features, FrozenEncoder
from dhim_ray.encoding.feature_store import FeatureStore, RowFile


def _array_file(tmp_path, a: np.ndarray) -> RowFile:
    path = tmp_path / "a.npy"
    np.save(path, a)
    return RowFile(path)


def test_rowfile_reads_what_numpy_reads(tmp_path):
    a = np.arange(7 * 3 * 2, dtype=np.float16).reshape(7, 3, 2)
    f = _array_file(tmp_path, a)
    assert f.shape == a.shape and len(f) == 7 and f.dtype == a.dtype
    for index in (3, -1, slice(None), slice(2, 5), slice(1, 7, 2), np.array([0, 1, 2, 5]),
                  np.array([5, 0, 5, 2]), np.array([], dtype=np.int64), a[:, 0, 0] > 10):
        np.testing.assert_array_equal(f[index], a[index])
    np.testing.assert_array_equal(np.asarray(f), a)
    with pytest.raises(IndexError):
        f[np.array([7])]


def test_a_shard_reads_only_its_rows_and_pickles_as_a_path(tmp_path):
    a = np.arange(100, dtype=np.float32).reshape(20, 5)
    shard = _array_file(tmp_path, a).shard(8, 14)
    assert len(shard) == 6
    np.testing.assert_array_equal(shard[np.array([0, 5])], a[[8, 13]])
    with pytest.raises(IndexError):
        shard[6]
    again = pickle.loads(pickle.dumps(shard))
    np.testing.assert_array_equal(again[:], a[8:14])


def test_store_built_batch_by_batch_equals_in_memory_features(tmp_path, tiny_config):
    enc = FrozenEncoder(tiny_config.features)
    texts = [f"sport match {i} goal team" if i % 2 else f"market stock {i} price bank" for i in range(150)]
    in_memory = enc.features(texts, batch_size=16)
    on_disk = enc.features(texts, batch_size=16, cache_dir=tmp_path, in_memory=False)
    assert on_disk.on_disk and not in_memory.on_disk
    assert on_disk.tokens.nbytes > 16 * on_disk.tokens.shape[1] * on_disk.tokens.shape[2] * 2  # > one batch
    for name in ("tokens", "mask", "cls", "mean"):
        np.testing.assert_array_equal(np.asarray(getattr(on_disk, name)), getattr(in_memory, name))
    # The same inputs read the finished store back; a damaged store is rebuilt, not trusted.
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("features-")]
    assert FeatureStore.open(folder).meta["fingerprint"] == enc.fingerprint
    with open(folder / "tokens.npy", "r+b") as f:
        f.truncate(200)
    again = enc.features(texts, batch_size=16, cache_dir=tmp_path, in_memory=True)
    np.testing.assert_array_equal(again.tokens, in_memory.tokens)


def test_training_from_disk_gives_the_codes_of_training_in_memory(tmp_path, toy_folder, tiny_config):
    """The in-memory path and the on-disk path (features bigger than the budget, read
    in batches) train the same model to the last bit."""
    from dhim_ray.hasher import Hasher
    from dhim_ray.training.pipeline import train_corpus

    corpus = CorpusSpec(str(toy_folder))
    cfg = tiny_config.replace(train={"max_epochs": 2, "crop_tokens": 6})
    mem = train_corpus(corpus, cfg, tmp_path / "mem", progress=False)
    disk = train_corpus(corpus, cfg, tmp_path / "disk", progress=False, feature_memory_gb=0)
    assert mem["features"] == "in memory" and disk["features"] == "on disk"
    assert not (tmp_path / "disk" / "features.tmp").exists()  # the scratch store goes when the run ends
    assert [h["loss"] for h in mem["history"]] == [h["loss"] for h in disk["history"]]
    texts = [f"doc {i} about sport and goals" for i in range(30)]
    np.testing.assert_array_equal(Hasher.load(tmp_path / "mem").encode(texts),
                                  Hasher.load(tmp_path / "disk").encode(texts))


def test_bytes_per_document_matches_the_arrays(tiny_config):
    enc = FrozenEncoder(tiny_config.features)
    f = enc.features(["one text", "two texts here"])
    assert f.nbytes == 2 * Features.bytes_per_document(tiny_config.features.n_tokens, enc.hidden_size)


def _build(folder, n: int, fill: float) -> FeatureStore:
    store = FeatureStore.create(folder, n=n, n_tokens=3, hidden=2)
    store.writer().write(0, np.full((n, 3, 2), fill, np.float16), np.ones((n, 3), bool),
                         np.full((n, 2), fill, np.float32), np.full((n, 2), fill, np.float32))
    return store


def test_two_builds_of_one_store_at_once_both_finish_and_the_first_stays(tmp_path):
    """Two trainings on one corpus build its feature cache at the same time: neither
    may delete the other's work (the second's start used to, and the first then failed
    with FileNotFoundError); the first to finish is kept and the second's is dropped."""
    folder = tmp_path / "features-x"
    first, second = _build(folder, 4, 1.0), _build(folder, 4, 2.0)
    first.finish(fingerprint="f")
    assert FeatureStore.is_complete(folder)
    second.finish(fingerprint="f")
    cols = FeatureStore.open(folder).columns(in_memory=True)
    assert (cols["mean"] == 1.0).all()
    assert [p.name for p in tmp_path.iterdir()] == ["features-x"]  # no work folder left behind
    with pytest.raises(ValueError, match="not being built"):
        second.writer()


def test_a_damaged_store_is_replaced_when_a_build_finishes(tmp_path):
    folder = tmp_path / "features-x"
    _build(folder, 4, 1.0).finish()
    (folder / "cls.npy").unlink()
    _build(folder, 4, 3.0).finish()
    assert (FeatureStore.open(folder).columns(in_memory=True)["cls"] == 3.0).all()


def test_work_folders_of_crashed_builds_are_removed_and_live_ones_kept(tmp_path):
    folder = tmp_path / "features-x"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    host = socket.gethostname()
    crashed = tmp_path / f"features-x.partial-{host}-{dead}-0000abcd"
    running = tmp_path / f"features-x.partial-{host}-{os.getpid()}-0000abcd"
    elsewhere = tmp_path / f"features-x.partial-other-host-{dead}-0000abcd"
    for p in (crashed, running, elsewhere):
        p.mkdir()
    _build(folder, 2, 1.0).finish()
    assert not crashed.exists() and running.exists() and elsewhere.exists()


def _features_in_a_process(encoder: str, cache_dir: str, texts: list[str]) -> np.ndarray:
    f = FrozenEncoder(FeatureConfig(encoder=encoder, max_words=12)).features(texts, batch_size=8,
                                                                            cache_dir=cache_dir)
    return np.asarray(f.mean)


def test_two_processes_encoding_one_corpus_into_one_cache_both_succeed(tmp_path, tiny_bert):
    texts = [f"document {i} about {'sport' if i % 2 else 'markets'}" for i in range(200)]
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        a, b = [f.result() for f in [pool.submit(_features_in_a_process, tiny_bert, str(tmp_path), texts)
                                     for _ in range(2)]]
    np.testing.assert_array_equal(a, b)
    (folder,) = list(tmp_path.iterdir())
    assert FeatureStore.is_complete(folder) and len(FeatureStore.open(folder)) == 200


def test_within_shared_features_the_same_texts_are_encoded_once(tiny_config, monkeypatch):
    """An evaluation comparing several methods encodes its corpus once: within
    shared_features() a second call with the same texts and settings returns what the first
    encoded, another max_words encodes (and keeps only the newest settings' features), and
    outside it nothing is kept."""
    from dataclasses import replace

    from dhim_ray.encoding import encoder as enc_module

    encoded: list[int] = []
    real = FrozenEncoder._encode
    monkeypatch.setattr(FrozenEncoder, "_encode", lambda self, texts, *a, **k: encoded.append(len(texts))
                        or real(self, texts, *a, **k))
    texts = ["goal striker league final", "vote parliament minister budget"]
    enc, other = FrozenEncoder(tiny_config.features), FrozenEncoder(replace(tiny_config.features, max_words=3))
    with enc_module.shared_features():
        first = enc.features(texts)
        assert FrozenEncoder(tiny_config.features).features(list(texts)) is first  # another instance, equal texts
        assert encoded == [2]
        other.features(texts)
        assert encoded == [2, 2] and [len(held) for held in enc_module._shared.values()] == [1]  # the newest only
        np.testing.assert_array_equal(enc.features(texts).mean, first.mean)  # encoded again, the same
        assert encoded == [2, 2, 2]
    assert enc_module._shared is None
    enc.features(texts)
    assert encoded == [2, 2, 2, 2]


def test_a_cache_on_a_disk_too_small_is_refused_before_any_encoding(tmp_path, toy_folder, tiny_bert, capsys):
    """Features that would fill the cache's disk hours into the encoding are refused at once, in
    one line that says what they need and what is free; the disk and --out are left as they were."""
    from dhim_ray.cli import main

    assert os.geteuid() == 0, "this test mounts a small tmpfs (a full disk): run the suite as root"
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], check=True)
    try:
        with pytest.raises(SystemExit) as done:
            main(["train", str(toy_folder), "--encoder", tiny_bert, "--max-words", "12", "--bits", "16",
                  "--epochs", "1", "--out", str(tmp_path / "model"), "--cache-dir", str(disk / "features")])
        err = capsys.readouterr().err.strip()
        assert done.value.code == 2 and len(err.splitlines()) == 1, err
        assert f"no room for the frozen features in {disk / 'features'}: they need" in err and "KiB free" in err and "--cache-dir DIR on a larger disk" in err, err
        assert list(disk.iterdir()) == [] and not (tmp_path / "model").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
