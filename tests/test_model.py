import numpy as np
import pytest
import torch

from dhim_ray.config import ModelConfig, TrainConfig, as_published, config_for_bits
from dhim_ray.encoding.encoder import Features
from dhim_ray.errors import ConfigError
from dhim_ray.model.dhim import DHIM, bernoulli_straight_through
from dhim_ray.training.loop import carve_validation, fit


def toy_features(n=96, t=8, h=24, n_topics=4, seed=0):
    """Token features drawn around one centre per topic: MI has something to find."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_topics, h)) * 2
    labels = rng.integers(0, n_topics, n)
    tokens = centres[labels][:, None, :] + rng.standard_normal((n, t, h))
    mask = np.ones((n, t), dtype=bool)
    mask[: n // 2, t - 2 :] = False  # some padding
    tokens[~mask] = 0
    mean = tokens.mean(1)
    return Features(tokens.astype(np.float16), mask, mean.astype(np.float32), mean.astype(np.float32)), labels


def test_straight_through_passes_gradient_to_p():
    logits = torch.tensor([[0.3, -2.0, 5.0]], requires_grad=True)
    codes = bernoulli_straight_through(logits, alpha=0.5)
    assert set(codes.detach().unique().tolist()) <= {0.0, 1.0}
    codes.sum().backward()
    p = torch.sigmoid(logits.detach() / 0.5)
    # d code / d logit = dp/dlogit = p (1 - p) / alpha
    assert torch.allclose(logits.grad, p * (1 - p) / 0.5)


def test_gradients_reach_conv_weights():
    feats, _ = toy_features()
    model = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8))
    out = model(torch.tensor(feats.tokens[:16]).float(), torch.tensor(feats.mask[:16]),
                torch.tensor(feats.cls[:16]), beta=0.5)
    out.loss.backward()
    for conv in model.convs:
        assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
    assert model.target_proj.weight.grad.abs().sum() > 0


def test_global_logit_is_masked_mean_of_local_logits():
    feats, _ = toy_features()
    model = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8))
    tokens, mask = torch.tensor(feats.tokens[:4]).float(), torch.tensor(feats.mask[:4])
    local = model.local_logits(tokens)
    g = model.global_logits(tokens, mask)
    expected = torch.stack([local[i][mask[i]].mean(0) for i in range(4)])
    assert torch.allclose(g, expected, atol=1e-5)
    # with padding counted as words (paper code) the readout differs where there is padding
    paper = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8, mask_padding=False))
    paper.load_state_dict(model.state_dict())
    assert torch.allclose(paper.global_logits(tokens, mask), local.mean(1), atol=1e-5)


def test_loss_finite_and_decreases_on_toy_corpus():
    feats, labels = toy_features(n=128)
    cfg = config_for_bits(16, model={"hidden_size": 24, "n_filters": 16, "alpha": 0.3},
                          train={"batch_size": 32, "lr": 3e-3, "beta": 0.5})
    cfg = cfg.replace(train={"max_epochs": 15})
    losses = [h.loss for h in fit(feats, None, cfg, progress=False).history]  # no val slice: all 15 epochs
    assert len(losses) == 15
    assert all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05


def test_fit_keeps_best_epoch_and_learns_topics():
    feats, labels = toy_features(n=160, seed=1)
    cfg = config_for_bits(16, model={"hidden_size": 24, "n_filters": 16, "alpha": 0.3},
                          train={"batch_size": 32, "lr": 3e-3, "max_epochs": 12, "patience": 12, "k": 10})
    tr, va = np.arange(120), np.arange(120, 160)
    result = fit(feats.take(tr), feats.take(va), cfg, labels[tr], labels[va], progress=False)
    vals = [h.val_precision for h in result.history]
    assert result.best_precision == max(vals)
    assert result.best_epoch == int(np.argmax(vals))
    assert result.best_precision > 0.6  # 4 topics: chance is ~0.25


def test_without_labels_the_neighbour_criterion_picks_the_epoch_and_stops_early():
    from dhim_ray.model.inference import hash_features
    from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k

    feats, labels = toy_features(n=160, seed=1)
    cfg = config_for_bits(16, model={"hidden_size": 24, "n_filters": 16, "alpha": 0.3},
                          train={"batch_size": 32, "lr": 3e-3, "max_epochs": 40, "patience": 2, "k": 10})
    tr, va = np.arange(120), np.arange(120, 160)
    result = fit(feats.take(tr), feats.take(va), cfg, progress=False)  # no labels anywhere
    recall = [h.val_neighbour_recall for h in result.history]
    assert all(h.val_precision is None for h in result.history)
    assert result.selected_by == "val cosine-neighbour recall@10 (tie-aware)"
    # the first `patience` epochs are a warm-up the label-free criterion does not pick from
    assert result.best_epoch == 2 + int(np.argmax(recall[2:])) and result.best_neighbour_recall == max(recall[2:])
    assert len(result.history) < 40 and len(result.history) == result.best_epoch + 1 + 2  # stopped by patience
    assert result.summary()["stopped"] == (f"early, after epoch {len(result.history)} of 40: no gain for 2 epochs; "
                                           f"kept epoch {result.best_epoch + 1} (val cosine-neighbour recall@10 "
                                           f"(tie-aware) {result.best_neighbour_recall:.4f})")
    # the returned model is the chosen epoch's: its codes score what that epoch scored
    nbrs = cosine_topk(feats.mean[tr], feats.mean[va], 10)
    again = neighbour_recall_at_k(hash_features(result.model, feats.take(tr)), hash_features(result.model,
                                                                                              feats.take(va)), nbrs, 10)
    assert again.recall_at_k == pytest.approx(result.best_neighbour_recall)
    assert result.best_neighbour_recall > 0.3  # 10 of 120 by chance: ~0.08

    # with labels, both scores are recorded and labels choose unless told otherwise
    labelled = fit(feats.take(tr), feats.take(va), cfg, labels[tr], labels[va], progress=False)
    assert labelled.selected_by == "val P@10 (tie-aware)"
    assert all(h.val_precision is not None and h.val_neighbour_recall is not None for h in labelled.history)
    told = fit(feats.take(tr), feats.take(va), cfg.replace(train={"select": "neighbours"}), labels[tr], labels[va],
               progress=False)
    assert told.selected_by.startswith("val cosine-neighbour") and told.best_precision is not None
    with pytest.raises(ConfigError, match="no labels"):
        fit(feats.take(tr), feats.take(va), cfg.replace(train={"select": "labels"}), progress=False)
    with pytest.raises(ConfigError, match="select='best'"):
        cfg.replace(train={"select": "best"})


def test_one_label_cannot_pick_the_epoch_so_auto_selects_by_neighbours():
    """Found using the CLI: `train bbc --limit 400` kept the packaged split's first rows, all
    one label, so val P@100 read the same every epoch and early stopping kept epoch 0."""
    feats, labels = toy_features(n=160, seed=1)
    cfg = config_for_bits(16, model={"hidden_size": 24, "n_filters": 16, "alpha": 0.3},
                          train={"batch_size": 32, "lr": 3e-3, "max_epochs": 4, "patience": 2, "k": 10})
    tr, va = np.arange(120), np.arange(120, 160)
    one = np.zeros(120, dtype=np.int64)
    result = fit(feats.take(tr), feats.take(va), cfg, one, labels[va], progress=False)
    assert result.selected_by == "val cosine-neighbour recall@10 (tie-aware)"
    # what labels would have ranked by: the same figure every epoch, whatever the codes
    assert len({round(h.val_precision, 12) for h in result.history}) == 1
    with pytest.raises(ConfigError, match="every training document has the same label"):
        fit(feats.take(tr), feats.take(va), cfg.replace(train={"select": "labels"}), one, labels[va], progress=False)


def test_the_retired_objective_criterion_is_refused():
    with pytest.raises(ConfigError, match="select='objective': choose one of auto, labels, neighbours"):
        config_for_bits(16, train={"select": "objective"})


def test_as_published_formulation():
    cfg = as_published(config_for_bits(32, model={"hidden_size": 768}))
    assert cfg.model.score_sigmoid and not cfg.model.mask_padding and cfg.train.beta == 1.0
    assert cfg.model.shared_cls_projection  # 3 x 256 == 768
    # the paper's architecture and the reference run's hyperparameters, none of the shipped levers
    assert (cfg.model.n_filters, cfg.model.regulariser, cfg.model.linear_path, cfg.model.init) == (256, "cls", False,
                                                                                                  "random")
    assert (cfg.train.batch_size, cfg.train.neighbours, cfg.train.crop_tokens) == (512, 0, 0)
    assert not as_published(config_for_bits(32, model={"hidden_size": 384})).model.shared_cls_projection
    # the sigmoid quirk bounds the objective: the loss can never go below 2 * softplus(-1) - softplus(1) ...
    feats, _ = toy_features()
    model = DHIM(cfg.model.__class__(**{**cfg.model.__dict__, "hidden_size": 24, "n_filters": 8,
                                        "shared_cls_projection": False}))
    out = model(torch.tensor(feats.tokens[:8]).float(), torch.tensor(feats.mask[:8]), None, beta=0.0)
    sp = torch.nn.functional.softplus
    assert out.loss.item() >= (sp(torch.tensor(-1.0)) + sp(torch.tensor(0.0))).item() - 1e-6


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 1}, "batch_size=1"),
    ({"lr": 0}, "lr=0"),
    ({"beta": -1}, "beta=-1"),
    ({"max_epochs": 0}, "max_epochs=0"),
])
def test_bad_train_settings(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kwargs)


def test_bad_model_settings():
    with pytest.raises(ConfigError, match="n_bits=100"):
        ModelConfig(n_bits=100)
    with pytest.raises(ConfigError, match="regulariser='x'"):
        ModelConfig(regulariser="x")
    with pytest.raises(ConfigError, match="shared_cls_projection needs"):
        ModelConfig(hidden_size=384, shared_cls_projection=True)


def test_carve_validation_is_deterministic_and_disjoint():
    tr, va = carve_validation(500, TrainConfig())
    tr2, va2 = carve_validation(500, TrainConfig())
    assert np.array_equal(va, va2) and len(va) == 50 and not set(tr) & set(va)
    assert len(tr) + len(va) == 500


# ---- the shipped levers -----------------------------------------------------------------
def test_itq_initialised_linear_path_starts_as_itq_codes():
    from dhim_ray.model.inference import hash_features
    from dhim_ray.retrieval.baselines import ITQ
    from dhim_ray.training.loop import init_from_itq, token_mean

    feats, _ = toy_features(n=120)
    model = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8, linear_path=True, init="itq"))
    init_from_itq(model, feats, seed=0)
    model.proj.weight.data.zero_()
    model.proj.bias.data.zero_()  # CNN silent: the codes are the linear path's alone
    x = token_mean(feats)
    itq_bits = ITQ(16, 0).fit(x).bits(x)
    codes = np.unpackbits(hash_features(model, feats), axis=1).astype(bool)
    assert (codes == itq_bits).mean() > 0.999  # float32 vs float64 may flip a bit sitting on 0


def test_identity_bits_are_itq_of_the_mean_word_feature_fixed_through_training():
    from dhim_ray.model.inference import hash_features
    from dhim_ray.retrieval.baselines import ITQ
    from dhim_ray.training.loop import token_mean

    feats, labels = toy_features(n=120)
    cfg = config_for_bits(24, model={"hidden_size": 24, "n_filters": 8, "identity_bits": 8},
                          train={"max_epochs": 3, "batch_size": 32, "neighbours": 0})
    res = fit(feats, None, cfg, labels)
    model = res.model
    assert model.proj.out_features == 16 and model.config.head_bits == 16  # the head learns 16 bits
    assert not any("identity" in name for name, _ in model.named_parameters())  # never trained
    x = token_mean(feats)
    codes = np.unpackbits(hash_features(model, feats), axis=1).astype(bool)
    # the last 8 bits are ITQ's of the mean word feature, fitted on the training documents
    assert (codes[:, 16:] == ITQ(8, 0).fit(x).bits(x)).mean() > 0.999
    before = model.identity_weight.clone()
    res2 = fit(feats, None, cfg, labels)
    assert torch.equal(res2.model.identity_weight, before)  # the same fit, whatever the head learns
    assert "identity_weight" in model.state_dict() and "identity_weight" not in DHIM(
        ModelConfig(n_bits=16, hidden_size=24, n_filters=8)).state_dict()


def test_identity_bits_on_fewer_documents_than_bits_are_a_random_projection(caplog):
    from dhim_ray.model.inference import hash_features
    from dhim_ray.training.loop import fit_transforms

    feats, _ = toy_features(n=10)
    model = DHIM(ModelConfig(n_bits=24, hidden_size=24, n_filters=8, identity_bits=16))
    with caplog.at_level("WARNING", logger="dhim_ray"):
        fit_transforms(model, feats)
    assert "10 training documents are too few for 16 ITQ identity bits" in caplog.text
    bits = np.unpackbits(hash_features(model, feats), axis=1)[:, 8:]
    assert 0.2 < bits.mean() < 0.8 and len({row.tobytes() for row in bits}) >= 8  # documents told apart


@pytest.mark.parametrize("bits, identity, message", [
    (64, 60, "identity_bits=60: must be between 0 and n_bits - 8 = 56"),
    (64, -8, "identity_bits=-8"),
    (128, 124, "identity_bits=124: must be between 0 and n_bits - 8 = 120"),
])
def test_identity_bits_out_of_range_are_one_clear_error(bits, identity, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(n_bits=bits, hidden_size=384, identity_bits=identity)
    with pytest.raises(ConfigError, match="at most the encoder width"):
        ModelConfig(n_bits=128, hidden_size=24, identity_bits=32)


def test_itq_init_needs_the_linear_path():
    with pytest.raises(ConfigError, match="linear_path"):
        ModelConfig(n_bits=16, hidden_size=24, linear_path=False, init="itq")
    with pytest.raises(ValueError, match="linear_path"):
        init_linear = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8)).init_linear_path
        init_linear(np.zeros((16, 24)), np.zeros(16))


def test_neighbour_table_and_pair_batches():
    from dhim_ray.training.loop import neighbour_table, pair_batches

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    table = neighbour_table(x, 4, chunk=16)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = xn @ xn.T
    np.fill_diagonal(sim, -np.inf)
    assert np.array_equal(np.sort(table, 1), np.sort(np.argsort(-sim, 1)[:, :4], 1))
    seen = set()
    for idx, pairs in pair_batches(50, 16, table, rng):
        b = len(idx) // 2
        assert pairs.shape == (len(idx), len(idx)) and (pairs == pairs.T).all() and pairs.diagonal().all()
        for i in range(b):
            assert idx[b + i] in table[idx[i]] and pairs[i, b + i]
        seen.update(idx[:b].tolist())
    assert seen == set(range(50))  # every document is an anchor once per epoch


def test_trimming_padding_does_not_change_codes():
    from dhim_ray.model.inference import to_tensors

    feats, _ = toy_features(n=40, t=12)
    feats.mask[:, 6:] = False  # every document ends by position 6: the batch can be trimmed
    model = DHIM(ModelConfig(n_bits=16, hidden_size=24, n_filters=8, windows=(1, 3, 5)))
    idx = np.arange(40)
    full_t, full_m, _ = to_tensors(feats, idx, "none", torch.device("cpu"))
    trim_t, trim_m, _ = to_tensors(feats, idx, "none", torch.device("cpu"), model.config.pad_reach)
    assert trim_t.shape[1] == 6 + 2
    assert torch.allclose(model.global_logits(full_t, full_m), model.global_logits(trim_t, trim_m), atol=1e-5)


def test_crops_keep_a_window_of_words():
    from dhim_ray.model.inference import to_tensors

    feats, _ = toy_features(n=30, t=12)
    tokens, mask, _ = to_tensors(feats, np.arange(30), "none", torch.device("cpu"), None, crop=4,
                                 rng=np.random.default_rng(0))
    assert tokens.shape == (30, 4, 24) and mask.shape == (30, 4)
    assert mask.all()  # every toy document has more than 4 words


@pytest.mark.parametrize("bits", [16, 32])
def test_shipped_defaults_learn_topics_with_every_lever_on(bits):
    """Neighbour positives + mean target + crops (+ the ITQ-initialised path at 16 bits), end to end."""
    feats, labels = toy_features(n=160, seed=1)
    cfg = config_for_bits(bits, model={"hidden_size": 24, "n_filters": 16},
                          train={"max_epochs": 6, "patience": 6, "k": 10, "crop_tokens": 6, "neighbours": 5})
    assert cfg.model.regulariser == "mean" and cfg.train.neighbours == 5
    # shipped: the ITQ-initialised linear path at 16 bits only; the CNN alone from random init above
    assert (cfg.model.linear_path, cfg.model.init) == ((True, "itq") if bits == 16 else (False, "random"))
    tr, va = np.arange(120), np.arange(120, 160)
    result = fit(feats.take(tr), feats.take(va), cfg, labels[tr], labels[va], progress=False)
    assert result.best_precision > 0.8


def test_model_selection_searches_a_fixed_sample_of_train():
    from dhim_ray.training.loop import selection_database

    cfg = TrainConfig(max_select_database=300, k=10)
    idx = selection_database(1000, cfg)
    assert len(idx) == 300 and len(set(idx)) == 300 and (np.diff(idx) > 0).all()
    assert (idx == selection_database(1000, cfg)).all()  # the same documents every epoch
    assert (selection_database(200, cfg) == np.arange(200)).all()
    assert len(selection_database(1000, TrainConfig(max_select_database=0))) == 1000
    with pytest.raises(ConfigError, match="max_select_database"):
        TrainConfig(max_select_database=50, k=100)


def test_interrupted_in_process_training_keeps_the_best_epoch_and_resumes(tmp_path, toy_folder, tiny_config):
    """Issue 11.9: Ctrl-C threw away every finished epoch; now the --out folder holds the
    best epoch so far after each epoch, and --resume continues after the last one."""
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.errors import CheckpointError, TrainingInterrupted
    from dhim_ray.hasher import Hasher
    from dhim_ray.model.checkpoint import has_training_state, read_checkpoint
    from dhim_ray.training.loop import TrainCallback
    from dhim_ray.training.pipeline import train_corpus

    seen = []

    class CtrlCAtEpoch(TrainCallback):
        def __init__(self, at):
            self.at = at

        def on_epoch_start(self, epoch, state):
            seen.append(epoch)
            if epoch == self.at:
                raise KeyboardInterrupt

    corpus, out = CorpusSpec(str(toy_folder)), tmp_path / "run"
    cfg = tiny_config.replace(train={"max_epochs": 4, "patience": 10})
    with pytest.raises(TrainingInterrupted, match="interrupted after epoch 2.*resume="):
        train_corpus(corpus, cfg, out, progress=False, callbacks=(CtrlCAtEpoch(2),))
    info = read_checkpoint(out)
    assert has_training_state(out) and info.summary["epochs_run"] == 2
    assert Hasher.load(out).encode(["football goal"]).shape == (1, 2)  # the best epoch so far is usable
    with pytest.raises(CheckpointError, match="holds an unfinished run; continue it with resume="):
        train_corpus(corpus, cfg, out, progress=False)
    # a resume must be the run's own command: not another width, setting or corpus
    with pytest.raises(CheckpointError, match="started with model.n_bits=16, this command asks for 64"):
        train_corpus(corpus, cfg.replace(model={"n_bits": 64}), out, progress=False, resume=True)
    with pytest.raises(CheckpointError, match="started with train.lr=0.003, this command asks for 0.01"):
        train_corpus(corpus, cfg.replace(train={"lr": 0.01}), out, progress=False, resume=True)
    with pytest.raises(CheckpointError, match=r"that run trains on .*toy.*, not .*:val"):
        train_corpus(CorpusSpec(str(toy_folder), "val"), cfg, out, progress=False, resume=True)
    assert seen == [0, 1, 2]  # none of them trained
    summary = train_corpus(corpus, cfg, out, progress=False, resume=True, callbacks=(CtrlCAtEpoch(-1),))
    assert seen == [0, 1, 2, 2, 3]  # epochs 0 and 1 were not trained again
    assert summary["epochs_run"] == 4 and [h["epoch"] for h in summary["history"]] == [0, 1, 2, 3]
    assert not has_training_state(out)
    # resumed == uninterrupted: same RNG stream, Adam state and weights
    straight = train_corpus(corpus, cfg, tmp_path / "straight", progress=False)
    np.testing.assert_allclose([h["loss"] for h in summary["history"]], [h["loss"] for h in straight["history"]],
                               rtol=1e-5)


def test_best_score_is_none_until_the_criterion_has_picked_an_epoch():
    """The progress bar and the epoch log show "best -" during the label-free warm-up,
    not -inf; then the best value."""
    from dhim_ray.training.loop import LoopState, best_score
    from dhim_ray.training.schedule import EarlyStopping

    state = LoopState(None, None, None, EarlyStopping(patience=6, warmup=2), np.random.default_rng(0),
                      criterion="neighbours")
    assert not state.stopper.update(0.31, epoch=0) and best_score(state) is None
    assert state.stopper.update(0.35, epoch=2) and best_score(state) == pytest.approx(0.35)
    assert best_score(LoopState(None, None, None, EarlyStopping(patience=6), np.random.default_rng(0))) is None
