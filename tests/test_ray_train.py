"""Integration: real Ray Train (CPU workers, gloo) running the library's one training
loop, on the tiny BERT and a generated toy corpus (no data download, no ../shared)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import CheckpointError, ClusterError, ConfigError
from dhim_ray.training.loop import TrainCallback

pytestmark = pytest.mark.slow  # real Ray, real Milvus, the packaged encoder: minutes


@pytest.fixture(scope="module")
def corpus(toy_folder):
    return CorpusSpec(str(toy_folder))


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    """One --cache-dir for the trainings of the toy corpus that check what happens after the
    features: the first builds its stores, the others open them."""
    return tmp_path_factory.mktemp("features")


def config(tiny_config, epochs):
    return tiny_config.replace(train={"max_epochs": epochs, "patience": 10, "batch_size": 32})


def test_two_workers_train_and_checkpoint_loads_without_ray(ray_session, tmp_path, corpus, tiny_config):
    """Two workers, the features over the memory budget (on disk, in --cache-dir): each worker
    opens only its rows; the checkpoint loads without Ray and scores what rank 0 recorded."""
    from dhim_ray.encoding.encoder import FrozenEncoder
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.train import TrainRequest, build_feature_stores, open_features, train_distributed
    from dhim_ray.model.inference import hash_features

    seen = tmp_path / "shards.txt"

    class RecordShard(TrainCallback):
        def on_epoch_end(self, state):
            tokens = state.train.tokens
            with open(seen, "a") as f:
                f.write(f"{state.rank} {tokens.start} {tokens.stop} {type(tokens).__name__}\n")

    out = tmp_path / "model"
    # 16 head bits and 8 identity bits: rank 0 fits the identity bits, DDP hands them to rank 1,
    # whose share of the selection search must hash as rank 0 does (checked below)
    cfg = config(tiny_config, 2).replace(model={"n_bits": 24, "identity_bits": 8})
    summary = train_distributed(TrainRequest(corpus, cfg, out, workers=2, storage_path=tmp_path / "runs",
                                             cache_dir=tmp_path / "cache", feature_memory_gb=0),
                                callbacks=(RecordShard(),))
    n = summary["n_train"]
    assert sorted(set(tuple(line.split()) for line in seen.read_text().splitlines())) == \
        [("0", "0", str(n // 2), "RowFile"), ("1", str(n // 2), str(n), "RowFile")]
    assert len(list((tmp_path / "cache").glob("features-*"))) == 2  # train and val stores, kept in --cache-dir
    assert not list((tmp_path / "runs").rglob("features-*"))  # none of the run's own: they are in --cache-dir
    assert summary["epochs_run"] == 2 and summary["workers"] == 2
    assert 0 < summary["best_val_precision_at_k_tie_aware"] <= 1
    assert [set(h) >= {"epoch", "steps", "loss", "seconds", "val_precision"} for h in summary["history"]] == [True] * 2
    hasher = Hasher.load(out)  # plain load, no Ray involved
    assert hasher.n_bits == 24 and hasher.model.identity_weight.abs().sum() > 0
    texts = load_split(corpus.with_split("val")).texts
    in_process = hasher.encode(texts)
    # Both workers hashed a share of the validation search; one process searching it
    # whole with the kept (best) weights scores what rank 0 recorded.
    from dhim_ray.training.distributed import Collective
    from dhim_ray.training.loop import Selection
    from dhim_ray.training.pipeline import load_train_val

    cfg = hasher.config
    train, val, _ = load_train_val(corpus, cfg)
    val_f = hasher.encoder.features(val.texts)
    selection = Selection.build(hasher.encoder.features(train.texts), train.labels, val_f, cfg)
    p, recall = selection.score(hasher.model, val_f, val.labels, hasher.encoder.device, Collective())
    assert p == pytest.approx(summary["best_val_precision_at_k_tie_aware"], abs=1e-9)
    assert recall == pytest.approx(summary["best_val_neighbour_recall_at_k"], abs=1e-9)
    # the same weights on features written by the Ray Data actors give the same codes
    enc = FrozenEncoder(hasher.config.features)
    store, = build_feature_stores([(texts, tmp_path / "store")], hasher.config.features, enc.hidden_size,
                                  enc.fingerprint, workers=2)
    ray_feats = open_features(store, memory_gb=0.0)
    assert ray_feats.on_disk
    assert np.array_equal(hash_features(hasher.model, ray_feats), in_process)


def test_one_ray_worker_runs_the_same_loop_as_in_process(ray_session, tmp_path, corpus, tiny_config, features):
    """One loop: a single Ray worker (DDP over a world of one) and the in-process run
    see the same batches and reach the same weights. The driver logs each epoch rank 0
    reported, once, in order."""
    import logging

    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.train import TrainRequest, train_distributed
    from dhim_ray.training.pipeline import train_corpus

    class Lines(logging.Handler):  # on the logger itself: the CLI stops 'dhim_ray' propagating to the root
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    cfg = config(tiny_config, 3)
    train_logger, lines = logging.getLogger("dhim_ray.jobs.train"), Lines()
    level = train_logger.level
    train_logger.addHandler(lines)
    train_logger.setLevel(logging.INFO)
    try:
        ray_summary = train_distributed(TrainRequest(corpus, cfg, tmp_path / "ray", storage_path=tmp_path / "runs",
                                                      cache_dir=features))
    finally:
        train_logger.removeHandler(lines)
        train_logger.setLevel(level)
    assert not list((tmp_path / "runs").rglob("features-*"))  # the run's feature stores go when it finishes
    epoch_lines = [line for line in lines.lines if line.startswith("epoch ")]
    assert [line.split()[1] for line in epoch_lines] == ["0:", "1:", "2:"], epoch_lines
    local_summary = train_corpus(corpus, cfg, tmp_path / "local", progress=False)
    assert [h["steps"] for h in ray_summary["history"]] == [h["steps"] for h in local_summary["history"]]
    np.testing.assert_allclose([h["loss"] for h in ray_summary["history"]],
                               [h["loss"] for h in local_summary["history"]], rtol=1e-4)
    texts = load_split(corpus.with_split("val")).texts
    assert np.array_equal(Hasher.load(tmp_path / "ray").encode(texts), Hasher.load(tmp_path / "local").encode(texts))


def test_worker_failure_resumes_from_last_checkpoint(ray_session, tmp_path, corpus, tiny_config, features):
    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.train import TrainRequest, train_distributed

    trace, marker = tmp_path / "epochs.txt", tmp_path / "failed-once"

    class FailOnceAtEpoch2(TrainCallback):  # pickled by value into the workers
        def on_epoch_start(self, epoch, state):
            if state.rank != 0:
                return
            with open(trace, "a") as f:
                f.write(f"{epoch}\n")
            if epoch == 2 and not marker.exists():
                marker.touch()
                raise RuntimeError("injected failure at epoch 2")

    request = TrainRequest(corpus, config(tiny_config, 4), tmp_path / "model", workers=2,
                           storage_path=tmp_path / "runs", max_failures=1, cache_dir=features)
    summary = train_distributed(request, callbacks=(FailOnceAtEpoch2(),))
    # The failure at 2 restarts from the last checkpoint Ray Train registered: epoch 1's, or epoch 0's
    # where the failure beat the controller's next poll of the workers (seen on a loaded machine);
    # never from scratch, and every epoch after it runs once.
    trace = [int(x) for x in trace.read_text().split()]
    assert trace[:3] == [0, 1, 2] and trace[3] in (1, 2) and trace[3:] == list(range(trace[3], 4)), trace
    assert summary["epochs_run"] == 4 and [h["epoch"] for h in summary["history"]] == [0, 1, 2, 3]
    assert Hasher.load(tmp_path / "model").encode(["football goal"]).shape == (1, 2)


def test_failure_past_max_failures_names_the_run_folder(ray_session, tmp_path, corpus, tiny_config, features):
    from dhim_ray.errors import TrainingFailed
    from dhim_ray.jobs.train import TrainRequest, train_distributed

    class AlwaysFail(TrainCallback):
        def on_epoch_start(self, epoch, state):
            if epoch == 1:
                raise RuntimeError("injected failure")

    request = TrainRequest(corpus, config(tiny_config, 3), tmp_path / "model", workers=2,
                           storage_path=tmp_path / "runs", max_failures=0, cache_dir=features)
    with pytest.raises(TrainingFailed, match=f"resume={tmp_path / 'runs' / 'failing'}"):
        train_distributed(request, callbacks=(AlwaysFail(),), name="failing")
    assert not (tmp_path / "model" / "config.json").exists()


def test_resume_with_a_relative_path_runs_only_the_missing_epochs(ray_session, tmp_path, corpus, tiny_config,
                                                                  monkeypatch):
    """Issue 11.9: a relative --resume failed in the workers; an absolute one repeated the last epoch."""
    from dhim_ray.jobs.train import TrainRequest, train_distributed

    monkeypatch.chdir(tmp_path)
    first = train_distributed(TrainRequest(corpus, config(tiny_config, 1), Path("m1"), workers=2,
                                           storage_path=Path("runs")), name="run")
    trace = tmp_path / "epochs.txt"

    class Trace(TrainCallback):
        def on_epoch_start(self, epoch, state):
            if state.rank == 0:
                with open(trace, "a") as f:
                    f.write(f"{epoch}\n")

    again = train_distributed(TrainRequest(corpus, config(tiny_config, 3), Path("m2"), workers=2,
                                           storage_path=Path("runs"), resume=Path("runs/run")), callbacks=(Trace(),))
    assert first["epochs_run"] == 1
    assert [int(x) for x in trace.read_text().split()] == [1, 2]  # epoch 0 is not repeated
    assert again["epochs_run"] == 3 and [h["epoch"] for h in again["history"]] == [0, 1, 2]
    assert json.loads((tmp_path / "m2" / "config.json").read_text())["summary"]["epochs_run"] == 3


def test_bad_inputs(tmp_path, tiny_config):
    from dhim_ray.jobs.ray_env import _check_address
    from dhim_ray.jobs.train import TrainRequest, find_resume_checkpoint

    with pytest.raises(ConfigError, match="workers=0: must be >= 1"):
        TrainRequest(CorpusSpec("bbc"), tiny_config, workers=0)
    with pytest.raises(ConfigError, match="max_failures=-1: must be >= 0"):
        TrainRequest(CorpusSpec("bbc"), tiny_config, workers=2, max_failures=-1)
    (tmp_path / "notarun").mkdir()
    with pytest.raises(CheckpointError, match="not a dhim-ray training run"):
        find_resume_checkpoint(tmp_path / "notarun")
    with pytest.raises(ClusterError, match="nothing answers at 127.0.0.1:1"):
        _check_address("ray://127.0.0.1:1")


def test_more_gpus_than_the_cluster_has(ray_session):
    from dhim_ray.jobs.ray_env import check_gpus

    with pytest.raises(ClusterError, match="use_gpu: the cluster has no GPUs"):
        check_gpus(2, use_gpu=True)
    check_gpus(2, use_gpu=False)
