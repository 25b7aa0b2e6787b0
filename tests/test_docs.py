"""The docs as a reader meets them: every code fence closed, every generated table (BENCHMARKS.md
and the README's results) equal to what the result files say, relative links that lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_every_code_fence_is_closed(path):
    fences = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{path.name}: an unpaired code fence (fences at lines {fences})"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{path.name}: link to {target} leads nowhere"


def test_generated_tables_equal_the_results(tmp_path):
    """bench.report --check: BENCHMARKS.md's and the README's tables are what the result files
    give; it reads result files only, so it runs where torch cannot be imported."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError('torch is not importable in this test')\n"
        "sys.meta_path.insert(0, NoTorch())\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "bench.report", "--check"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode != 0 and "not importable" in probe.stderr  # the guard was in force


def test_every_bench_command_in_the_docs_names_a_registered_bench():
    """``python -m bench NAME`` runs what the registry names; the docs name only those, and
    every module in bench/ is a registered bench or one of their shared helpers."""
    from bench.__main__ import BENCHES

    helpers = {"__init__", "__main__", "harness", "protocol", "anchor_worker", "code_lines", "suite_time",  # budgets, no bench
               "device_carry"}  # what a device machine lacks, carried: no bench
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")} - helpers
    assert modules == set(BENCHES), f"bench/ modules not in the registry, or registered and missing: {modules ^ set(BENCHES)}"
    for path in MARKDOWN:
        for name in re.findall(r"python -m bench[. ]([a-z_]+)", path.read_text()):
            assert name in BENCHES, f"{path.name}: `python -m bench {name}` is not a registered bench"
    listed = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and all(f"  {name} " in listed.stdout for name in BENCHES), listed.stdout
    wrong = subprocess.run([sys.executable, "-m", "bench", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "no bench named 'nope'" in wrong.stderr
    helped = subprocess.run([sys.executable, "-m", "bench", "ray_train", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert helped.returncode == 0 and "--corpus" in helped.stdout


def doc_commands() -> list[tuple[str, str]]:
    """(file, command line) for every ``dhim-ray`` command in the docs' bash blocks, a command
    submitted with ``ray job submit ... --`` included; comments and continuations resolved."""
    found = []
    for path in MARKDOWN:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                line = line.split(" -- ", 1)[1].strip() if line.startswith("ray job submit") else line
                for part in line.split("&&"):
                    if part.strip().startswith("dhim-ray "):
                        found.append((path.name, part.strip()))
    return found


@pytest.mark.parametrize("where,line", doc_commands(), ids=lambda x: x[:60])
def test_every_documented_command_parses(where, line):
    """Every option a doc shows exists and takes the value shown (the CLI parses the line as
    it would run it, without running it)."""
    import shlex

    import typer

    from dhim_ray.cli import app

    group = typer.main.get_command(app)
    args = shlex.split(line)[1:]
    ctx = group.context_class(group, info_name="dhim-ray")
    name, command, rest = group.resolve_command(ctx, args)
    command.make_context(name, rest, parent=ctx)
