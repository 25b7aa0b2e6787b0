"""The fast encode path (length-sorted batches, each padded to its longest document plus
the head's reach) gives the codes of the paper's path (every document padded to max_words,
in input order): bit for bit on the tiny BERT, and on the packaged encoder and BBC corpus
at most a rounding flip in a thousand bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TOPICS

from dhim_ray.codes import unpack_codes
from dhim_ray.config import FeatureConfig, ModelConfig
from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.errors import DataError, EncoderError
from dhim_ray.hasher import Hasher
from dhim_ray.model.dhim import DHIM
from dhim_ray.model.inference import hash_features


def mixed_lengths(n: int, seed: int = 0, longest: int = 500) -> list[str]:
    """Generated documents of 1 to ``longest`` words, in no order of length."""
    rng = np.random.default_rng(seed)
    vocab = " ".join(TOPICS.values()).split()
    return [" ".join(rng.choice(vocab, size=int(rng.integers(1, longest + 1)))) for _ in range(n)]


def model_for(encoder: FrozenEncoder, n_bits: int = 32, mask_padding: bool = True, seed: int = 0) -> DHIM:
    torch.manual_seed(seed)
    return DHIM(ModelConfig(n_bits=n_bits, hidden_size=encoder.hidden_size, n_filters=16,
                            mask_padding=mask_padding)).eval()


def codes_both_ways(encoder_name: str, texts: list[str], max_words: int, mask_padding: bool = True,
                    batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    cfg = FeatureConfig(encoder=encoder_name, max_words=max_words)
    padded = FrozenEncoder(cfg, reach=None)  # the paper's path: every document to max_words
    model = model_for(padded, mask_padding=mask_padding)
    fast = FrozenEncoder(cfg, model=padded.model, tokenizer=padded.tokenizer, reach=model.config.pad_reach)
    old = hash_features(model, padded.features(texts, batch_size=batch_size))
    new = hash_features(model, fast.features(texts, batch_size=batch_size))
    return old, new


def test_the_fast_path_gives_the_padded_paths_codes_bit_for_bit(tiny_bert):
    texts = mixed_lengths(150, longest=120)
    old, new = codes_both_ways(tiny_bert, texts, max_words=100)
    assert old.shape == new.shape == (150, 4)
    assert np.array_equal(old, new)


def test_the_fast_path_pads_less_but_keeps_the_fixed_width(tiny_bert):
    texts = ["football goal", "vote " * 30, "film"]
    enc = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=60), reach=2)
    widths = [ids.shape[1] for _, ids, _ in enc.length_batches(enc.token_ids(texts), batch_size=1)]
    assert widths == [34, 6, 5]  # longest first; [CLS] + words + [SEP] + 2 positions of reach
    f = enc.features(texts, batch_size=1)
    assert f.tokens.shape == (3, 60, 32) and f.mask.sum(1).tolist() == [2, 30, 1]
    assert not f.tokens[0, 5:].any() and f.tokens[0, :3].any()  # past the reach: zeros, never read


def test_the_paper_formulation_pads_every_document_to_max_words(tiny_bert):
    """mask_padding off reads [PAD] positions as words: there the fast path must not skip them."""
    texts = mixed_lengths(40, seed=3, longest=40)
    old, new = codes_both_ways(tiny_bert, texts, max_words=50, mask_padding=False)
    assert ModelConfig(mask_padding=False).pad_reach is None
    assert np.array_equal(old, new)


def test_input_order_is_kept_and_a_batch_of_one_works(tiny_bert):
    texts = mixed_lengths(23, seed=5, longest=60)
    enc = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=60))
    together = enc.features(texts, batch_size=4)
    for i in (0, 7, 22):
        alone = enc.features([texts[i]], batch_size=1)
        np.testing.assert_allclose(alone.mean[0], together.mean[i], atol=1e-5)
        np.testing.assert_array_equal(alone.mask[0], together.mask[i])


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_hasher_encode_equals_the_padded_path_on_very_long_and_one_word_texts(tiny_bert, tiny_config, tmp_path,
                                                                            backend):
    """On the torch backend the head hashes the encoder's batch where it lies (a GPU's memory):
    the same codes as the cached-features path, which copies the token states to the host."""
    from dhim_ray.model.checkpoint import save_checkpoint

    enc = FrozenEncoder(tiny_config.features, reach=None)
    cfg = tiny_config.replace(model={"hidden_size": enc.hidden_size})
    torch.manual_seed(1)
    save_checkpoint(tmp_path / "m", DHIM(cfg.model), cfg, encoder_fingerprint=enc.fingerprint)
    hasher = Hasher.load(tmp_path / "m", backend=backend)
    assert hasher.encoder.reach == 2 and hasher.encoder.backend == backend
    texts = ["goal", "vote " * 5000, *mixed_lengths(30, seed=9, longest=30)]  # 5,000 words: truncated to max_words
    expected = hash_features(hasher.model, enc.features(texts, batch_size=7))
    for batch_size in (1, 7, 64):
        assert np.array_equal(hasher.encode(texts, batch_size=batch_size), expected)
    codes, scores, _ = hasher.encode(texts, scores=True)
    assert np.array_equal(codes, expected) and scores.shape == (32, 16)
    assert np.array_equal(np.packbits(scores > 0, axis=1), expected)  # the codes are the scores' signs
    both = hasher.encode(texts, scores=True, vectors=True)
    assert np.array_equal(both.codes, expected) and np.array_equal(both.scores, scores)
    assert np.allclose(both.vectors, enc.features(texts).mean, atol=1e-5)  # the mean-pooled sentence vectors
    assert hasher.encode(texts, vectors=True).scores is None
    with pytest.raises(DataError, match="text 1"):
        hasher.encode(["goal", "   "])


def test_precision_is_checked(tiny_bert):
    cfg = FeatureConfig(encoder=tiny_bert, max_words=12)
    with pytest.raises(EncoderError, match="choose one of fp32, fp16, bf16"):
        FrozenEncoder(cfg, precision="fp8")
    with pytest.raises(EncoderError, match="needs a CUDA device"):
        FrozenEncoder(cfg, precision="fp16").features(["goal"])
    with pytest.raises(EncoderError, match="reach=-1"):
        FrozenEncoder(cfg, reach=-1)


@pytest.mark.slow
def test_on_the_packaged_encoder_and_bbc_corpus_at_most_one_bit_in_a_thousand_differs():
    """Real encoder, real long documents (BBC articles, 400 words) and generated 1-500-word
    ones: float rounding between padded widths may flip a bit that sits at 0; the share
    must stay under 0.1% (it is 0 when the kernels round alike)."""
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec

    bbc = load_split(CorpusSpec("bbc", limit=120)).texts
    texts = bbc + mixed_lengths(80, seed=11)
    old, new = codes_both_ways("all-MiniLM-L6-v2", texts, max_words=400, batch_size=32)
    flipped = int((unpack_codes(old, 32) != unpack_codes(new, 32)).sum())
    assert flipped / old.size / 8 <= 1e-3, f"{flipped} of {old.size * 8} bits differ"
