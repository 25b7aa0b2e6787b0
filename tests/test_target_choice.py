"""model.target_transform=auto: one training per candidate regulariser target on shared
features, the validation slice keeps the better one (real training on the tiny BERT and
a generated toy corpus; Ray Train for the distributed path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dhim_ray.config import AUTO_TARGET_CANDIDATES
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import CheckpointError, ConfigError, TrainingInterrupted
from dhim_ray.training.schedule import TrainCallback


def config(tiny_config, **train):
    return tiny_config.replace(model={"target_transform": "auto"},
                               train={"max_epochs": 3, "patience": 10, **train})


def alone(tiny_config, corpus, tmp_path, target):
    """The candidate trained by itself, as a user naming the target would."""
    from dhim_ray.training.pipeline import train_corpus

    cfg = config(tiny_config).replace(model={"target_transform": target})
    return train_corpus(corpus, cfg, tmp_path / f"alone-{target}", progress=False)


def test_auto_keeps_the_target_whose_epoch_scores_higher_on_the_slice(tmp_path, toy_folder, tiny_config):
    from dhim_ray.hasher import Hasher
    from dhim_ray.model.checkpoint import read_checkpoint
    from dhim_ray.training.pipeline import train_corpus

    corpus, out = CorpusSpec(str(toy_folder)), tmp_path / "auto"
    summary = train_corpus(corpus, config(tiny_config), out, progress=False)
    choice = summary["target_transform"]
    singles = {t: alone(tiny_config, corpus, tmp_path, t) for t in AUTO_TARGET_CANDIDATES}
    # each candidate scored what it scores trained alone, and the higher one was kept (a tie keeps "none")
    for target, single in singles.items():
        assert choice["scores"][target] == pytest.approx(single["best_val_precision_at_k_tie_aware"], abs=1e-12)
        assert choice["best_epochs"][target] == single["best_epoch"]
    best = max(choice["scores"].values())
    assert choice["chosen"] == next(t for t in AUTO_TARGET_CANDIDATES if choice["scores"][t] == best)
    assert choice["selected_by"] == "val P@100 (tie-aware)"
    # the saved model is the chosen candidate: its target, its summary, its codes
    info = read_checkpoint(out)
    assert info.config.model.target_transform == choice["chosen"] == Hasher.load(out).config.model.target_transform
    assert summary["best_val_precision_at_k_tie_aware"] == pytest.approx(best, abs=1e-12)
    assert not (out / "targets").exists()
    texts = corpus.with_split("val").load_split().texts
    codes = Hasher.load(out).encode(texts)
    assert np.array_equal(codes, Hasher.load(tmp_path / f"alone-{choice['chosen']}").encode(texts))


def test_auto_without_labels_compares_neighbour_recall(tmp_path, toy_folder, tiny_config):
    import json

    from dhim_ray.corpus.data import load_corpus
    from dhim_ray.training.pipeline import train_corpus

    texts = load_corpus(str(toy_folder)).split("train").texts
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    corpus = CorpusSpec(str(tmp_path / "docs.jsonl"))
    summary = train_corpus(corpus, config(tiny_config, patience=1, max_epochs=3), tmp_path / "auto",
                              progress=False)
    choice = summary["target_transform"]
    assert choice["selected_by"].startswith("val cosine-neighbour recall@100")
    assert set(choice["scores"]) == set(AUTO_TARGET_CANDIDATES) and all(0 <= s <= 1 for s in choice["scores"].values())
    assert summary["best_val_neighbour_recall_at_k"] == pytest.approx(max(choice["scores"].values()), abs=1e-12)


def test_an_interrupted_auto_run_resumes_without_training_a_finished_target_again(tmp_path, toy_folder,
                                                                                  tiny_config):
    from dhim_ray.training.pipeline import train_corpus

    started = []

    class CtrlCAt(TrainCallback):
        def __init__(self, at):
            self.at = at

        def on_epoch_start(self, epoch, state):
            started.append((state.config.model.target_transform, epoch))
            if len(started) == self.at:
                raise KeyboardInterrupt

    corpus, out = CorpusSpec(str(toy_folder)), tmp_path / "auto"
    cfg = config(tiny_config)
    # 3 epochs of "none", then Ctrl-C at the second epoch of "whitening"
    with pytest.raises(TrainingInterrupted, match=r"interrupted after epoch 0.*targets finished in .*targets are kept"):
        train_corpus(corpus, cfg, out, progress=False, callbacks=(CtrlCAt(5),))
    assert (out / "targets" / "none" / "config.json").is_file()
    with pytest.raises(CheckpointError, match="holds an unfinished model.target_transform=auto run; continue it with "
                                              "--resume"):
        train_corpus(corpus, cfg, out, progress=False)
    summary = train_corpus(corpus, cfg, out, progress=False, resume=True, callbacks=(CtrlCAt(-1),))
    assert started == [("none", 0), ("none", 1), ("none", 2), ("whitening", 0), ("whitening", 1),
                       ("whitening", 1), ("whitening", 2)]
    straight = train_corpus(corpus, cfg, tmp_path / "straight", progress=False)
    assert summary["target_transform"]["scores"] == pytest.approx(straight["target_transform"]["scores"], abs=1e-9)
    assert summary["target_transform"]["chosen"] == straight["target_transform"]["chosen"]
    with pytest.raises(CheckpointError, match="no unfinished run there"):
        train_corpus(corpus, cfg, out, progress=False, resume=True)


def test_auto_refuses_what_cannot_compare_the_targets(tmp_path, toy_folder, tiny_config):
    from dhim_ray.training.loop import fit
    from dhim_ray.training.pipeline import train_corpus

    with pytest.raises(ConfigError, match="--select objective scores each by its own loss"):
        train_corpus(CorpusSpec(str(toy_folder)), config(tiny_config, select="objective"), tmp_path / "a",
                     progress=False)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    with pytest.raises(ConfigError, match="target_transform=auto is a choice between trainings"):
        fit(None, None, config(tiny_config))
    with pytest.raises(ConfigError, match="target_transform='auto' transforms the regulariser target"):
        tiny_config.replace(model={"target_transform": "auto", "regulariser": "none"})


def test_auto_under_ray_train_shares_features_and_keeps_the_better_target(ray_session, tmp_path, toy_folder,
                                                                          tiny_config):
    from dhim_ray.jobs.train import TrainRequest, train_distributed
    from dhim_ray.model.checkpoint import read_checkpoint

    corpus, out = CorpusSpec(str(toy_folder)), tmp_path / "auto"
    cfg = config(tiny_config, max_epochs=2, batch_size=32)
    with pytest.raises(ConfigError, match="resumes from its --out folder"):
        train_distributed(TrainRequest(corpus, cfg, out, workers=2, resume=tmp_path / "elsewhere"))
    summary = train_distributed(TrainRequest(corpus, cfg, out, workers=2))
    choice = summary["target_transform"]
    assert set(choice["scores"]) == set(AUTO_TARGET_CANDIDATES) and choice["epochs_run"] == {"none": 2, "whitening": 2}
    assert summary["workers"] == 2
    assert summary["best_val_precision_at_k_tie_aware"] == pytest.approx(max(choice["scores"].values()), abs=1e-12)
    assert read_checkpoint(out).config.model.target_transform == choice["chosen"]
    assert not (out / "targets").exists()  # the candidates and the feature stores they shared
    assert Path(summary["run_dir"]).parent == tmp_path / "ray_runs"  # the chosen run's Ray folder is kept


def test_the_cli_says_which_target_auto_chose(tmp_path, toy_folder, tiny_bert):
    from typer.testing import CliRunner

    from dhim_ray.cli import app
    from dhim_ray.model.checkpoint import read_checkpoint

    out = tmp_path / "model"
    r = CliRunner().invoke(app, ["train", str(toy_folder), "--encoder", tiny_bert, "--max-words", "12", "--bits", "16",
                                 "--epochs", "2", "--set", "model.target_transform=auto", "--out", str(out)],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    choice = read_checkpoint(out).summary["target_transform"]
    assert f"{choice['chosen']} (auto)" in r.output
    assert ", ".join(f"{t} {v:.4f}" for t, v in choice["scores"].items()) in r.output
