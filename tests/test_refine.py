"""SG-OPT refinement on the tiny BERT: BERT_T moves, BERT_F does not; the refined
folder reloads and encodes identically; an interrupted refine resumes."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import make_toy_corpus

from dhim_ray.config import FeatureConfig
from dhim_ray.encoding.encoder import FrozenEncoder, _load
from dhim_ray.encoding.refine import SGOPT, RefineConfig, max_pool_layers, refine_encoder, sg_opt_loss
from dhim_ray.errors import CheckpointError, ConfigError, DataError, EncoderMismatchError, TrainingInterrupted
from dhim_ray.hasher import Hasher
from dhim_ray.model.checkpoint import save_checkpoint
from dhim_ray.training.loop import build_model

TEXTS = [t for _, t in make_toy_corpus(12, seed=4)]  # 48 documents, 4 topics


def config(tiny_bert, **kw):
    return RefineConfig(encoder=tiny_bert, batch_size=8, lr=1e-3, head_hidden=32, max_words=12, **kw)


def test_a_refine_step_changes_bert_t_and_leaves_bert_f(tiny_bert):
    model, tok = _load(tiny_bert, tiny_bert)
    sg = SGOPT(model, 32)
    guide_before = {k: v.clone() for k, v in sg.guide.state_dict().items()}
    student_before = {k: v.clone() for k, v in sg.student.state_dict().items()}
    opt = torch.optim.AdamW([*sg.student.parameters(), *sg.head.parameters()], lr=1e-3)
    batch = dict(tok(TEXTS[:8], padding=True, return_tensors="pt"))
    batch.pop("token_type_ids", None)
    loss, contrastive, reg = sg.loss(batch, config(tiny_bert))
    assert reg == 0.0 and contrastive > 0  # starts where it began
    loss.backward()
    opt.step()
    assert all(torch.equal(v, guide_before[k]) for k, v in sg.guide.state_dict().items())
    moved = [k for k, v in sg.student.state_dict().items() if not torch.equal(v, student_before[k])]
    assert len(moved) > 10
    assert sg.regulariser().item() > 0  # now away from the start, and the regulariser sees it


def test_sg_opt_loss_prefers_each_cls_near_its_own_guides():
    torch.manual_seed(0)
    c = torch.randn(6, 8)
    aligned = c.expand(3, 6, 8) + 0.01 * torch.randn(3, 6, 8)
    shuffled = aligned[:, torch.randperm(6)]
    assert sg_opt_loss(c, aligned, 0.1) < sg_opt_loss(c, shuffled, 0.1)


def test_max_pool_ignores_padding():
    states = tuple(torch.tensor([[[1.0], [5.0], [9.0]]]) * (i + 1) for i in range(3))  # embeddings + 2 layers
    pooled = max_pool_layers(states, torch.tensor([[1, 1, 0]]))
    assert pooled.shape == (2, 1, 1) and pooled.flatten().tolist() == [10.0, 15.0]


def test_refined_encoder_reloads_and_encodes_identically(tmp_path, tiny_bert):
    out = tmp_path / "refined"
    summary = refine_encoder(TEXTS, out, config(tiny_bert, max_steps=4), progress=False)
    assert summary["steps"] == 4 and (out / "refine.json").exists() and not (tmp_path / "refined.partial").exists()
    assert json.loads((out / "refine.json").read_text())["config"]["method"] == "sg-opt"
    refined = FrozenEncoder(FeatureConfig(encoder=str(out), max_words=12))
    original = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12))
    a, b = refined.features(TEXTS[:5]), FrozenEncoder(FeatureConfig(encoder=str(out), max_words=12)).features(TEXTS[:5])
    np.testing.assert_array_equal(a.cls, b.cls)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.allclose(a.cls, original.features(TEXTS[:5]).cls)  # it did change the encoder
    assert refined.fingerprint != original.fingerprint
    with pytest.raises(ConfigError, match="exists"):
        refine_encoder(TEXTS, out, config(tiny_bert, max_steps=1), progress=False)


def test_a_checkpoint_refuses_the_refined_encoder_and_back(tmp_path, tiny_bert, tiny_config):
    """Refining keeps the architecture and changes the weights: a DHIM model trained on either
    encoder refuses the other, in one line."""
    out = tmp_path / "refined"
    refine_encoder(TEXTS, out, config(tiny_bert, max_steps=2), progress=False)
    refined = tiny_config.replace(features={"encoder": str(out)})
    for name, trained, other in (("plain", tiny_config, refined), ("refined", refined, tiny_config)):
        path = save_checkpoint(tmp_path / f"ck-{name}", build_model(trained), trained, FrozenEncoder(trained.features).fingerprint)
        assert Hasher.load(path).encode(TEXTS[:2]).shape == (2, trained.model.n_bits // 8)
        with pytest.raises(EncoderMismatchError, match="use the encoder \\(the same weights\\)"):
            Hasher.load(path, encoder=FrozenEncoder(other.features))


def test_interrupted_refine_resumes(tmp_path, tiny_bert, monkeypatch):
    out = tmp_path / "refined"
    cfg = config(tiny_bert, max_steps=5, save_every=2)
    calls = {"n": 0}
    real = SGOPT.loss

    def flaky(self, batch, c):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, batch, c)

    monkeypatch.setattr(SGOPT, "loss", flaky)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 3 of 5.*--resume"):
        refine_encoder(TEXTS, out, cfg, progress=False)
    assert not out.exists()
    with pytest.raises(CheckpointError, match="continue it with --resume"):
        refine_encoder(TEXTS, out, cfg, progress=False)
    monkeypatch.setattr(SGOPT, "loss", real)
    # a resume must be the run's own: not other documents, not other settings
    with pytest.raises(CheckpointError, match="ran on other documents"):
        refine_encoder(TEXTS[::-1], out, cfg, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="was started with lr=.*, this command asks for 0.5"):
        refine_encoder(TEXTS, out, dataclasses.replace(cfg, lr=0.5), resume=True, progress=False)
    summary = refine_encoder(TEXTS, out, cfg, resume=True, progress=False)
    assert summary["steps"] == 5 and out.exists()
    with pytest.raises(CheckpointError, match="no unfinished refine"):
        refine_encoder(TEXTS, tmp_path / "other", cfg, resume=True, progress=False)


def test_refine_input_errors(tmp_path, tiny_bert):
    with pytest.raises(DataError, match="needs at least batch_size=8"):
        refine_encoder(TEXTS[:5], tmp_path / "x", config(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match="method='simcse': choose one of sg-opt"):
        RefineConfig(method="simcse")
    with pytest.raises(ConfigError, match="temperature=0"):
        RefineConfig(temperature=0)
