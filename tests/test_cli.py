"""The CLI end to end on a tiny random BERT and a toy corpus (fast, no Ray)."""

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dhim_ray.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_help_keeps_bracketed_defaults():
    """Issue 11.11: Rich markup ate every '[default: ...]' in --help."""
    r = run("train", "--help")
    assert r.exit_code == 0 and "[default: runs/CORPUS-BITS]" in r.output


def test_config_field_names_in_errors_read_as_set_flags_for_every_section():
    from dhim_ray.cli_words import _FIELD, as_flags
    from dhim_ray.config import SECTIONS

    assert "(?:" + "|".join(SECTIONS) + r")\." in _FIELD.pattern
    for section in SECTIONS:
        assert as_flags(f"give more documents or {section}.x=1") == f"give more documents or --set {section}.x=1"


def test_version_names_the_stack_without_loading_it():
    """``dhim-ray --version`` for a bug report: dhim-ray's and its stack's versions, read from
    the packages' metadata (torch and Ray are not imported for it)."""
    import dhim_ray

    code = ("import sys; from dhim_ray.cli import main; sys.argv = ['dhim-ray', '--version']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"dhim-ray {dhim_ray.__version__} (python "), done.stdout
    assert all(f"{name} " in done.stdout for name in ("torch", "ray", "pymilvus", "milvus-lite")), done.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_folder, tiny_bert):
    out = tmp_path_factory.mktemp("cli") / "model"
    r = run("train", toy_folder, "--bits", 16, "--out", out, "--encoder", tiny_bert, "--max-words", 12,
            "--epochs", 2, "--set", "train.batch_size=32", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["n_bits"] == 16 and summary["epochs_run"] == 2
    return out


def test_train_leaves_the_query_graph_ready_so_the_first_search_builds_nothing(tmp_path, toy_folder, tiny_bert):
    """Training ends by preparing the model's query graph (cached once per model and machine):
    a search opened next finds it whole, so its first query costs what the next one does."""
    import onnxruntime

    from dhim_ray.graph_hasher import GRAPH, graph_folder
    from dhim_ray.model.checkpoint import read_checkpoint

    out = tmp_path / "model"
    r = run("train", toy_folder, "--bits", 16, "--out", out, "--encoder", tiny_bert, "--max-words", 12,
            "--epochs", 1, "--set", "train.batch_size=32", "--seed", 7)
    assert r.exit_code == 0, r.output
    assert (graph_folder(read_checkpoint(out), onnxruntime.__version__) / GRAPH).is_file()


def test_the_shipped_identity_bits_fit_a_narrow_encoder(tmp_path, toy_folder, tiny_bert):
    """128 bits ship 64 identity bits; ITQ of a 32-wide encoder gives 32 at most: 32 are used, and
    said; a value set by hand that the encoder cannot give is one clear error."""
    out = tmp_path / "model"
    r = run("train", toy_folder, "--bits", 128, "--out", out, "--encoder", tiny_bert, "--max-words", 12,
            "--epochs", 1, "--set", "train.batch_size=32")
    assert r.exit_code == 0, r.output
    assert "the 64 shipped at 128 bits exceed the encoder's width 32; 32 are used" in r.output
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["model"]["identity_bits"] == 32 and saved["config"]["model"]["n_bits"] == 128
    r = run("train", toy_folder, "--bits", 128, "--out", tmp_path / "other", "--encoder", tiny_bert,
            "--set", "model.identity_bits=48")
    assert r.exit_code == 2 and "identity_bits=48: at most the encoder width (32)" in r.output


def test_eval_json_has_both_precisions(trained, toy_folder):
    r = run("eval", trained, "--database", f"{toy_folder}:train", "--queries", f"{toy_folder}:val", "--k", 20, "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.output.strip().splitlines()[-1])
    assert result["k"] == 20 and result["n_queries"] == 40
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.eval_in_memory import Model, topic

    want = topic(Model(trained), CorpusSpec(str(toy_folder), "train"), CorpusSpec(str(toy_folder), "val"), k=20,
                               progress=False)  # the same evaluation in this process
    for key in ("precision_at_k", "precision_at_k_tie_aware"):
        assert result[key] == pytest.approx(want[key], abs=1e-12), key


def test_eval_queries_from_a_single_file_are_all_of_it(trained, toy_folder, tmp_path):
    """A single file has one split: --queries my-queries.csv means all of it, not a 'val' it lacks."""
    import shutil

    queries = tmp_path / "my-queries.csv"
    shutil.copy(toy_folder / "val.csv", queries)
    r = run("eval", trained, "--database", f"{toy_folder}:train", "--queries", queries, "--k", 20, "--json")
    assert r.exit_code == 0, r.output
    by_file = json.loads(r.output.strip().splitlines()[-1])
    same = run("eval", trained, "--database", f"{toy_folder}:train", "--queries", f"{toy_folder}:val", "--k", 20,
               "--json")
    same = json.loads(same.output.strip().splitlines()[-1])
    assert by_file["n_queries"] == same["n_queries"] == 40
    assert by_file["precision_at_k_tie_aware"] == same["precision_at_k_tie_aware"]


def test_eval_baseline(toy_folder, tiny_bert):
    r = run("eval", "--baseline", "itq", "--bits", 16, "--encoder", tiny_bert, "--max-words", 12,
            "--database", f"{toy_folder}:train", "--queries", f"{toy_folder}:val", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["method"] == "itq"


def test_eval_float_baselines_are_cosine_knn_on_the_unhashed_vectors(toy_folder, tiny_bert):
    """Issue 16.2a: the float references from the CLI. 'cosine' is exact cosine kNN on the
    mean-pooled vectors (checked against numpy here); the transformed ones search another space."""
    import numpy as np

    from dhim_ray.config import FeatureConfig
    from dhim_ray.corpus.data import load_corpus
    from dhim_ray.encoding.encoder import FrozenEncoder

    def evaluate(name):
        r = run("eval", "--baseline", name, "--encoder", tiny_bert, "--max-words", 12, "--k", 50,
                "--database", f"{toy_folder}:train", "--queries", f"{toy_folder}:val", "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.output.strip().splitlines()[-1])

    got = {name: evaluate(name) for name in ("cosine", "whitening-cosine")}
    corpus = load_corpus(str(toy_folder))
    train, val = corpus.split("train"), corpus.split("val")
    encoder = FrozenEncoder(FeatureConfig(tiny_bert, 12))
    x, q = (np.asarray(encoder.features(s.texts, progress=False).mean, np.float64) for s in (train, val))
    sim = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    top = np.argsort(-sim, axis=1, kind="stable")[:, :50]  # k = 50 of 40 per topic: not every neighbour is right
    expected = (np.asarray(train.labels)[top] == np.asarray(val.labels)[:, None]).mean()
    assert got["cosine"]["precision_at_k"] == pytest.approx(expected, abs=1e-9)
    assert got["cosine"]["dims"] == x.shape[1] and got["cosine"]["bytes_per_doc"] == 4 * x.shape[1]
    assert got["cosine"]["n_database"] == len(x) and got["cosine"]["n_queries"] == len(q)
    assert {g["method"] for g in got.values()} == set(got)
    assert got["whitening-cosine"]["precision_at_k"] != got["cosine"]["precision_at_k"]
    assert "n_bits" not in got["cosine"]


def test_eval_without_labels_scores_cosine_neighbour_recall(trained, toy_folder, tiny_bert, tmp_path):
    """Most corpora have no labels: eval then reports how much of each query's cosine top-k
    under the frozen encoder's mean vectors its Hamming top-k recovers (tie-aware), for a
    model and a baseline, and names that metric; a --label-column that is not there is
    still an error."""
    import numpy as np

    from dhim_ray.corpus.data import load_corpus
    from dhim_ray.hasher import Hasher
    from dhim_ray.retrieval.metrics import cosine_topk, neighbour_recall_at_k
    from dhim_ray.retrieval.rerank import rerank_topk

    corpus = load_corpus(str(toy_folder))
    train, val = corpus.split("train"), corpus.split("val")
    for name, split in (("db", train), ("q", val)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in split.texts))
    db, q = f"{tmp_path / 'db.jsonl'}:train", f"{tmp_path / 'q.jsonl'}:train"

    def evaluate(*args):
        r = run("eval", *args, "--database", db, "--queries", q, "--k", 10, "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.output.strip().splitlines()[-1])

    got = evaluate(trained)
    hasher = Hasher.load(trained)
    db_f, q_f = (hasher.encoder.features(s.texts, progress=False) for s in (train, val))
    expected = neighbour_recall_at_k(hasher.hash_features(db_f), hasher.hash_features(q_f),
                                     cosine_topk(db_f.mean, q_f.mean, 10), 10).recall_at_k
    assert got["metric"].startswith("cosine-neighbour recall@k") and "precision_at_k" not in got
    assert got["neighbour_recall_at_k"] == pytest.approx(expected, abs=1e-12) and 0 < expected <= 1
    assert (got["k"], got["n_database"], got["n_queries"]) == (10, len(train.texts), len(val.texts))
    reranked = evaluate(trained, "--rerank", 4)
    q_codes, q_scores, _ = hasher.encode(val.texts, scores=True)
    idx, _ = rerank_topk(hasher.hash_features(db_f), q_codes, q_scores, 10, 4)  # 40 Hamming candidates re-ranked
    neighbours = cosine_topk(db_f.mean, q_f.mean, 10)
    expected_reranked = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(idx, neighbours)])
    assert reranked["neighbour_recall_at_k_reranked"] == pytest.approx(expected_reranked, abs=1e-12)
    assert reranked["neighbour_recall_at_k"] == got["neighbour_recall_at_k"]  # the plain figure stays
    assert evaluate("--baseline", "cosine", "--encoder", tiny_bert, "--max-words", 12)["neighbour_recall_at_k"] == 1.0
    itq = evaluate("--baseline", "itq", "--bits", 16, "--encoder", tiny_bert, "--max-words", 12)
    assert 0 < itq["neighbour_recall_at_k"] < 1 and itq["bytes_per_doc"] == 2
    assert np.isfinite(evaluate("--baseline", "whitening-cosine", "--encoder", tiny_bert, "--max-words", 12)
                       ["neighbour_recall_at_k"])
    r = run("eval", trained, "--database", db, "--queries", q, "--label-column", "topic")
    assert r.exit_code == 2 and "no label column 'topic'" in r.output and "--label-column" in r.output


def test_init_flag_turns_the_linear_path_on_and_paper_turns_it_off():
    from dhim_ray.config import build_config, init_levers

    def build(formulation="shipped", bits=32, init=None):
        return build_config(bits, formulation, {"model": init_levers(init) if init else {}})

    shipped = build()
    assert (shipped.model.linear_path, shipped.model.init) == (False, "random")
    itq = build(init="itq")
    assert (itq.model.linear_path, itq.model.init) == (True, "itq")
    # 16 bits ships the ITQ-initialised path; --init random takes it away again
    assert build(bits=16).model.linear_path and not build(bits=16, init="random").model.linear_path
    paper = build("paper")
    assert (paper.model.linear_path, paper.model.n_filters, paper.train.neighbours) == (False, 256, 0)
    assert paper.features.cleaning == "ascii" and shipped.features.cleaning == "unicode"


def test_set_overrides_any_field(trained, toy_folder, tiny_bert, tmp_path):
    r = run("train", toy_folder, "--bits", 16, "--out", tmp_path / "m", "--encoder", tiny_bert, "--max-words", 12,
            "--epochs", 1, "--set", "train.beta=2.5", "--set", "model.n_filters=8", "--json")
    assert r.exit_code == 0, r.output
    from dhim_ray.model.checkpoint import read_checkpoint

    cfg = read_checkpoint(tmp_path / "m").config
    assert cfg.train.beta == 2.5 and cfg.model.n_filters == 8


def test_help_reads_as_a_command_line_and_every_option_has_a_panel():
    """Usage lines name arguments by what they hold (CORPUS, MODEL; typer braces a required one),
    and every option of every command sits in a named panel (Data, Model, Milvus, ..., --help in
    Output): no catch-all 'Options' box."""
    import typer

    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        loose = [p.name for p in command.params if p.param_type_name == "option"
                 and not getattr(p, "rich_help_panel", None)]
        assert not loose, f"{name}: options outside every panel: {loose}"
    for name in ("train", "ingest", "eval"):
        r = subprocess.run([sys.executable, "-m", "dhim_ray.cli", name, "--help"], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, COLUMNS="100"))
        assert r.returncode == 0, r.stderr
        assert "─ Options ─" not in r.stdout and "--help" in r.stdout.split("─ Output ─")[1], r.stdout
    usage = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "ingest", "--help"], capture_output=True, text=True,
                           timeout=120).stdout
    assert "Usage: dhim-ray ingest [OPTIONS] {CORPUS}" in " ".join(usage.split())


@pytest.mark.parametrize("argv", [["train", "bbc", "--out", "{tmp}/m"], ["ingest", "bbc", "--model", "{tmp}/m"],
                                  ["search", "a query", "--model", "{tmp}/m"], ["demo", "--out", "{tmp}/demo"]])
def test_a_terminal_hears_what_a_command_does_before_the_heavy_imports(tmp_path, argv):
    """On a terminal the first line says what the command is about to do, written before torch,
    Ray or pymilvus is imported (here they cannot be: the command stops right after it)."""
    import pty

    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Heavy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'ray', 'pymilvus', 'transformers'):\n"
        "            raise ImportError(f'{name} is not importable in this test')\n"
        "sys.meta_path.insert(0, Heavy())\n")
    main, terminal = pty.openpty()
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.Popen([sys.executable, "-c", "from dhim_ray.cli import main; main()", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=terminal, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    os.close(terminal)
    heard = b""
    try:
        while b"\n" not in heard:
            heard += os.read(main, 1024)
    finally:
        proc.wait(timeout=120)
        os.close(main)
    first = re.sub(r"\x1b\[[0-9;]*m", "", heard.decode()).splitlines()[0]
    assert first.startswith(f"dhim-ray {argv[0]}: ") and first.endswith(" ..."), first


PNG = b"\x89PNG\r\n\x1a\n"


def test_curves_beside_the_checkpoint_and_for_every_method_of_an_eval(trained, toy_folder, tiny_bert, tmp_path,
                                                                        monkeypatch):
    """train draws training.png beside the checkpoint; eval --plot draws precision@k (known-item:
    recall@k) against k for the model and each --baseline of the run, from the same figures it prints."""
    assert (trained / "training.png").read_bytes()[:8] == PNG
    db, q = f"{toy_folder}:train", f"{toy_folder}:val"
    plot = tmp_path / "curves" / "topic.png"
    # beside a model, the baselines hash its own features at its width (no --bits, --encoder, --max-words)
    r = run("eval", trained, "--baseline", "itq", "--baseline", "cosine", "--database", db, "--queries", q,
            "--k", 20, "--plot", plot, "--json")
    assert r.exit_code == 0, r.output
    results = json.loads(r.output.strip().splitlines()[-1])
    assert [x["method"] for x in results] == ["dhim", "itq", "cosine"] and plot.read_bytes()[:8] == PNG
    assert (results[1]["n_bits"], results[2]["dims"]) == (16, 32)  # the tiny BERT's width, not MiniLM's 384
    for x in results:
        curve = dict(zip(x["curve"]["k"], x["curve"]["value"], strict=True))
        assert curve[1] >= 0 and max(curve) <= x["n_database"]
        assert curve[20] == pytest.approx(x["precision_at_k_tie_aware"], abs=1e-12), x["method"]

    known = tmp_path / "known.png"
    r = run("eval", trained, "--task", "known-item", "--baseline", "lsh", "--bits", 16, "--encoder", tiny_bert,
            "--max-words", 12, "--database", db, "--windows", 50, "--window-words", 4, "--plot", known, "--json")
    assert r.exit_code == 0, r.output
    known_results = json.loads(r.output.strip().splitlines()[-1])
    for x in known_results:
        curve = dict(zip(x["curve"]["k"], x["curve"]["value"], strict=True))
        assert curve[10] == pytest.approx(x["recall_at_10"]) and curve[1] == pytest.approx(x["recall_at_1"])
    assert known.read_bytes()[:8] == PNG
    # the model's figures say they are the codes alone, and where the hybrid search is scored
    model_row = next(x for x in known_results if x["method"] == "dhim")
    assert model_row["searched"].startswith("the codes alone, in memory") and "--collection NAME" in model_row["searched"]
    assert model_row["queries"] == f"windows of {db}, each to find its document among them"

    # a plot asked where it cannot be drawn: refused before any work, in one line
    r = run("eval", trained, "--database", db, "--queries", q, "--plot", tmp_path / "x.svg")
    assert r.exit_code == 2 and "--plot" in r.output and "ending in .png" in r.output, r.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a machine without the extra
    r = run("eval", trained, "--database", db, "--queries", q, "--plot", tmp_path / "y.png")
    assert r.exit_code == 2 and "pip install matplotlib" in r.output and not (tmp_path / "y.png").exists()


def test_the_demo_refuses_a_folder_whose_model_it_did_not_make(tmp_path):
    """The demo replaces its model and database on each run: pointed at a folder holding the
    Quickstart's runs/bbc-64 (or another dhim_ray.db), it refuses before any work and leaves
    them as they were."""
    runs = tmp_path / "runs"
    (runs / "bbc-64").mkdir(parents=True)
    (runs / "bbc-64" / "model.safetensors").write_bytes(b"the user's weights")
    r = run("demo", "--out", runs)
    assert r.exit_code == 2, r.output
    assert f"--out {runs}: {runs / 'bbc-64'} was not made by the demo" in " ".join(r.output.split()), r.output
    assert sorted(p.name for p in runs.rglob("*")) == ["bbc-64", "model.safetensors"]
    assert (runs / "bbc-64" / "model.safetensors").read_bytes() == b"the user's weights"


def test_curve_draws_a_trained_models_curve_again_from_its_checkpoint(trained, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(trained, model)
    (model / "training.png").unlink()  # trained where matplotlib was missing, say
    r = run("curve", model, "--json")
    assert r.exit_code == 0, r.output
    drawn = json.loads(r.output.strip().splitlines()[-1])
    assert drawn["curve"] == str(model / "training.png") and (model / "training.png").read_bytes()[:8] == PNG
    assert drawn["epochs"] == 2 and drawn["stopped"]
    r = run("curve", model, "--out", tmp_path / "elsewhere.png")
    assert r.exit_code == 0 and (tmp_path / "elsewhere.png").read_bytes()[:8] == PNG
    r = run("curve", tmp_path / "nowhere")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "no such folder" in r.output, r.output


def test_the_curves_say_what_they_show(monkeypatch, tmp_path):
    """The training curve counts epochs from 1 (as the summary's stopped line), names its score with
    the run's k and starts that axis at zero; the eval curve's title names the queries and database."""
    from pathlib import Path

    from dhim_ray import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, plt, path: drawn.setdefault("fig", fig) and Path(path))
    history = [{"epoch": e, "loss": 1.0 - e / 10, "val_precision": 0.6 + e / 100} for e in range(4)]
    plots.training_curve({"history": history, "criterion": "labels", "selected_by": "val P@100 (tie-aware)",
                          "best_epoch": 3, "corpus": "bbc"}, tmp_path / "t.png")
    loss_ax, score_ax = drawn.pop("fig").axes
    assert list(loss_ax.lines[0].get_xdata()) == [1, 2, 3, 4]
    assert score_ax.get_ylabel() == "val P@100 (tie-aware)" and score_ax.get_ylim() == (0, 1)
    assert [line.get_label() for line in score_ax.lines][-1] == "chosen: epoch 3"
    result = {"method": "dhim", "n_bits": 16, "curve": {"k": [1, 10], "value": [0.9, 0.8]}}
    plots.k_curves([result], tmp_path / "k.png", "precision@k", "bbc:test: 445 queries against bbc:train: 1,780 documents")
    assert drawn["fig"].axes[0].get_title() == "bbc:test: 445 queries against bbc:train: 1,780 documents"
