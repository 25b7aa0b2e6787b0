"""The ONNX Runtime encode path and the exported token-ids-to-codes graph: the same codes as
torch, on the tiny BERT and on the packaged encoder; the graph cache; int8; refusals."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dhim_ray.config import FeatureConfig, config_for_bits
from dhim_ray.encoding.encoder import FrozenEncoder
from dhim_ray.errors import ConfigError, EncoderError
from dhim_ray.hasher import Hasher
from dhim_ray.model.checkpoint import save_checkpoint
from dhim_ray.training.loop import build_model
from tests.conftest import make_toy_corpus

DOCS = Path(__file__).resolve().parents[1] / "docs"


def bits_changed(a: np.ndarray, b: np.ndarray) -> int:
    return int((np.unpackbits(a) != np.unpackbits(b)).sum())


def random_checkpoint(folder: Path, features: FeatureConfig, n_bits: int = 64, hidden: int = 384,
                      identity_bits: int = 0) -> Path:
    """A checkpoint whose head is freshly initialised (seeded): its codes depend on every
    feature as a trained head's do, without a training run. Identity bits are fitted, as
    training fits them, on the toy corpus."""
    from dhim_ray.training.loop import fit_transforms

    torch.manual_seed(0)
    cfg = config_for_bits(n_bits, features={**features.__dict__},
                          model={"hidden_size": hidden, "identity_bits": identity_bits})
    encoder, model = FrozenEncoder(cfg.features, backend="torch", precision="fp32"), build_model(cfg)
    if identity_bits:
        fit_transforms(model, encoder.features([t for _, t in make_toy_corpus(80, seed=9)]))
    return save_checkpoint(folder, model, cfg, encoder.fingerprint)


def test_auto_runs_onnx_on_the_cpu_and_torch_where_asked(tiny_bert):
    cfg = FeatureConfig(encoder=tiny_bert, max_words=12)
    assert FrozenEncoder(cfg).backend == "onnx"
    assert FrozenEncoder(cfg, backend="torch").backend == "torch"
    assert FrozenEncoder(replace(cfg, backend="torch")).backend == "torch"
    assert FrozenEncoder(cfg, precision="bf16").backend == "torch"  # ONNX Runtime runs fp32 and int8


@pytest.mark.parametrize("identity_bits", [0, 16])
def test_tiny_bert_codes_equal_across_backends(tiny_bert, tmp_path, identity_bits):
    texts = [t for _, t in make_toy_corpus(60, seed=3)]
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32,
                           identity_bits=identity_bits)
    by_torch = Hasher.load(ck, backend="torch").encode(texts)
    onnx = Hasher.load(ck)
    assert onnx.encoder.backend == "onnx"
    assert bits_changed(by_torch, onnx.encode(texts)) == 0
    a = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12), backend="torch").features(texts)
    b = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12), backend="onnx").features(texts)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_allclose(a.mean, b.mean, atol=1e-4)
    np.testing.assert_allclose(a.tokens.astype(np.float32), b.tokens.astype(np.float32), atol=2e-3)


def test_the_graph_is_exported_once_and_keyed_by_the_weights(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("DHIM_RAY_CACHE", str(tmp_path / "cache"))
    cfg = FeatureConfig(encoder=tiny_bert, max_words=12)
    first = FrozenEncoder(cfg)
    first.features(["goal striker league"])
    graphs = list((tmp_path / "cache" / "onnx").glob("*.onnx"))
    assert len(graphs) == 1 and first.onnx_session().graph == graphs[0]
    stamp = graphs[0].stat().st_mtime_ns
    again = FrozenEncoder(cfg)
    again.features(["vote parliament"])
    assert again.onnx_session().graph == graphs[0] and graphs[0].stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "cache" / "onnx").iterdir() if p.name.startswith(".export")]
    changed = FrozenEncoder(cfg)
    with torch.no_grad():
        next(changed.model.parameters()).add_(0.5)  # the same name and folder, other weights in memory
    changed.features(["vote parliament"])
    assert changed.onnx_session().graph != graphs[0]
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 2


def test_a_cache_that_cannot_be_written_exports_to_a_temporary_folder(tiny_bert, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DHIM_RAY_CACHE", str(blocker))
    enc = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12), backend="onnx")
    assert enc.features(["goal striker"]).mask.any()
    assert not str(enc.onnx_session().graph).startswith(str(blocker))
    assert not enc.onnx_session().graph.exists()  # exported for the run, read, and removed: nothing left in $TMPDIR


def test_a_cached_encoder_graph_not_as_written_is_exported_again(tiny_bert, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DHIM_RAY_CACHE", str(tmp_path / "cache"))
    cfg, texts = FeatureConfig(encoder=tiny_bert, max_words=12), ["goal striker league", "vote parliament"]
    expected = FrozenEncoder(cfg, backend="torch").features(texts).mean
    FrozenEncoder(cfg).features(texts)
    (graph,) = (tmp_path / "cache" / "onnx").glob("*.onnx")
    data = bytearray(graph.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    graph.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="dhim_ray.encoding.onnx_runtime"):
        np.testing.assert_allclose(FrozenEncoder(cfg).features(texts).mean, expected, atol=1e-4)
    assert [r.getMessage() for r in caplog.records] == [
        f"{graph} does not match the digest it was cached with: exporting it again"]
    assert graph.read_bytes() != bytes(data)


def test_int8_changes_features_and_keeps_its_own_cache_key(tiny_bert, tmp_path):
    texts = [t for _, t in make_toy_corpus(20, seed=1)]
    fp32 = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12))
    int8 = FrozenEncoder(FeatureConfig(encoder=tiny_bert, max_words=12, precision="int8"))
    assert int8.backend == "onnx"
    a, b = fp32.features(texts), int8.features(texts)
    np.testing.assert_array_equal(a.mask, b.mask)
    assert not np.array_equal(a.tokens, b.tokens)
    cos = (a.mean * b.mean).sum(1) / np.linalg.norm(a.mean, axis=1) / np.linalg.norm(b.mean, axis=1)
    assert cos.min() > 0.9  # an approximation of the same encoder, not another one
    assert fp32.store_path(texts, tmp_path) != int8.store_path(texts, tmp_path)


@pytest.mark.parametrize("settings, message", [
    ({"precision": "int8", "backend": "torch"}, "precision='int8' runs on the ONNX backend"),
    ({"backend": "tensorrt"}, "backend='tensorrt': choose one of auto, torch, onnx"),
    ({"precision": "fp8"}, "precision='fp8': choose one of fp32, fp16, bf16, int8"),
])
def test_feature_settings_are_checked(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        FeatureConfig(**settings)


def test_the_onnx_backend_refuses_a_gpu_or_half_precision(tiny_bert):
    cfg = FeatureConfig(encoder=tiny_bert, max_words=12)
    with pytest.raises(EncoderError, match="backend='onnx' runs fp32 or int8 on the CPU, not bf16"):
        FrozenEncoder(cfg, backend="onnx", precision="bf16")
    with pytest.raises(EncoderError, match="precision='int8' runs on ONNX Runtime on the CPU, not on meta"):
        FrozenEncoder(replace(cfg, precision="int8"), device="meta")


def run_exported_graph(path: Path, hasher: Hasher, texts: list[str]) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = np.empty((len(texts), hasher.n_bytes), dtype=np.uint8)
    ids = hasher.encoder.token_ids(texts)
    for rows, input_ids, mask in hasher.encoder.length_batches(ids, 16, reach=0):  # padded as a tokenizer pads
        out[rows] = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})[0]
    return out


def test_an_export_without_out_goes_to_a_folder_of_its_own_beside_the_model(tiny_bert, tmp_path, monkeypatch):
    """``dhim-ray export MODEL`` leaves nothing in the current folder: MODEL-onnx/ holds its files."""
    from dhim_ray.cli import main

    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=16, hidden=32)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(SystemExit) as done:
        main(["export", str(ck), "--json"])
    assert done.value.code in (0, None) and not any(here.iterdir())
    assert {"model.json", "model.onnx", "tokenizer.json"} <= {p.name for p in (tmp_path / "ck-onnx").iterdir()}


@pytest.mark.parametrize("identity_bits", [0, 16])
def test_the_exported_graph_gives_the_hashers_codes(tiny_bert, tmp_path, identity_bits, capsys, monkeypatch):
    from dhim_ray.cli import main

    texts = [t for _, t in make_toy_corpus(40, seed=5)] + ["goal " * 30]  # one cut at the token limit
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32,
                           identity_bits=identity_bits)
    monkeypatch.chdir(tmp_path)  # the paths printed are as the user gave them, all three alike
    with pytest.raises(SystemExit) as done:
        main(["export", str(ck), "--out", "out/tiny.onnx", "--json"])
    assert done.value.code in (0, None)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (printed["graph"], printed["spec"], printed["tokenizer"]) == ("out/tiny.onnx", "out/tiny.json",
                                                                          "out/tokenizer.json")
    hasher = Hasher.load(ck)
    codes = run_exported_graph(tmp_path / "out" / "tiny.onnx", hasher, texts)
    assert codes.dtype == np.uint8 and codes.shape == (len(texts), 4)
    assert bits_changed(codes, hasher.encode(texts)) == 0
    if identity_bits:  # the identity bits (the last two bytes) tell these texts apart
        assert len({row.tobytes() for row in codes[:, 2:]}) > 10
    spec = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert spec["n_bits"] == 32 and spec["max_tokens"] == 13 and (tmp_path / "out" / "tokenizer.json").is_file()


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_model_that_encodes_in_low_precision_exports_a_float32_graph_and_says_so(tiny_bert, tmp_path, caplog,
                                                                                   precision):
    from dhim_ray.export import export_codes_graph

    features = FeatureConfig(encoder=tiny_bert, max_words=12, precision=precision)
    ck = random_checkpoint(tmp_path / "ck", features, n_bits=32, hidden=32)
    export_codes_graph(ck, tmp_path / "out" / "m.onnx")
    assert f"encodes in {precision}; the exported graph computes in float32" in caplog.text
    fp32 = Hasher.load(ck, encoder=FrozenEncoder(replace(features, precision="fp32"), backend="torch"))
    texts = [t for _, t in make_toy_corpus(10, seed=3)]
    assert bits_changed(run_exported_graph(tmp_path / "out" / "m.onnx", fp32, texts), fp32.encode(texts)) == 0


def test_export_refuses_a_name_that_is_not_an_onnx_file(tiny_bert, tmp_path, capsys):
    from dhim_ray.cli import main

    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    with pytest.raises(SystemExit) as done:
        main(["export", str(ck), "--out", str(tmp_path / "model.txt")])
    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--out" in line and "give a file name ending in .onnx" in line


@pytest.mark.slow
def test_packaged_encoder_codes_equal_across_backends_and_the_docs_example(tmp_path, monkeypatch, tiny_bert):
    """The packaged all-MiniLM-L6-v2 on the packaged BBC corpus: ONNX Runtime, torch and the
    exported graph run by docs/serve.md's own example (tokenizers + onnxruntime only) give
    the same 64-bit codes; another encoder's model is not exported beside them."""
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec

    texts = load_split(CorpusSpec("bbc")).texts[::4]  # every fourth article: each topic, 114 to 1,528 words
    ck = random_checkpoint(tmp_path / "ck", FeatureConfig())
    torch_codes = Hasher.load(ck, backend="torch").encode(texts)
    onnx = Hasher.load(ck)
    assert onnx.encoder.backend == "onnx"
    assert bits_changed(torch_codes, onnx.encode(texts)) == 0
    from dhim_ray.export import export_codes_graph

    export_codes_graph(ck, tmp_path / "out" / "bbc-64.onnx")
    block = re.findall(r"```python\n(.*?)```", (DOCS / "serve.md").read_text(), re.S)[-2]
    assert "import dhim_ray" not in block and "torch" not in block
    monkeypatch.chdir(tmp_path / "out")
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the documented example, run as written
    assert bits_changed(scope["hash_texts"](texts[:300]), torch_codes[:300]) == 0
    # and its next step, searching a collection of these codes with pymilvus alone
    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids

    rows = np.arange(300)
    target = MilvusTarget(str(tmp_path / "out" / "dhim_ray.db"), "bbc_64")
    with target.open() as collection:
        collection.ensure(64, Hasher.load(ck).model_id)
        collection.upsert(code_rows({"id": document_ids("bbc@1", rows), "code": torch_codes[:300], "text": texts[:300],
                                     "row": rows}, 64, "bbc@1"))
    search = re.findall(r"```python\n(.*?)```", (DOCS / "serve.md").read_text(), re.S)[-1]
    assert "MilvusClient" in search and "import dhim_ray" not in search
    try:
        exec(search, scope)  # noqa: S102 - the documented example, run as written
    finally:
        release(target.uri)
    assert len(scope["hits"][0]) == 5 and all(scope["texts"]) and set(scope["texts"]) <= {t[:1024] for t in texts[:300]}
    # another encoder's model exported into the same folder would replace this graph's tokenizer
    tiny = random_checkpoint(tmp_path / "tiny", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    before = {p: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="holds another encoder's tokenizer.json") as refused:
        export_codes_graph(tiny, tmp_path / "out" / "tiny.onnx")
    assert "export into a folder of its own" in str(refused.value)
    assert {p: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


@pytest.mark.parametrize("where, words", [
    ("ck/config.onnx", "holds a model, whose files the export would replace"),
    ("ck/model.onnx", "holds a model"),
    ("afile/model.onnx", "is a file, not a folder"),
    ("spec/notes.onnx", "its spec would overwrite"),
])
def test_export_never_writes_over_a_model_or_a_file_that_is_not_its_own(tiny_bert, tmp_path, capsys, where, words):
    from dhim_ray.cli import main

    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "notes.json").write_text('{"mine": 1}')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as done:
        main(["export", str(ck), "--out", str(tmp_path / where)])
    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert words in line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_failed_export_leaves_the_earlier_graph_whole_and_no_partial_file(tiny_bert, tmp_path, monkeypatch):
    from dhim_ray import export

    ck = random_checkpoint(tmp_path / "ck", FeatureConfig(encoder=tiny_bert, max_words=12), n_bits=32, hidden=32)
    out = tmp_path / "out" / "tiny.onnx"
    export.export_codes_graph(ck, out)
    good = out.read_bytes()

    def full_disk(path, config):
        Path(path).write_bytes(Path(path).read_bytes()[:1000])  # a graph cut short, as a full disk leaves it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "optimise", full_disk)
    with pytest.raises(OSError, match="No space left"):
        export.export_codes_graph(ck, out)
    assert out.read_bytes() == good
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []
