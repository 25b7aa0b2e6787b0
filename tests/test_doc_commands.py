"""Every ``dhim-ray`` command of docs/ that a fresh clone can run, run as written: a page's
commands in order, the pages in RUN_ORDER, in one folder where runs/bbc-64 is a trained model
(the session's BBC model) and my-docs.jsonl / my-docs.csv hold the columns the commands name.
``ID`` stands for a stored document's id, as in the README. Each run is a process of its own,
forked from one that has done the imports (tests/cli_fork.py).

A command that needs what a fresh clone lacks names it in NEEDS, and the test that runs such a
command where it is met; test_docs parses every command against the CLI."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
from cli_fork import ForkedCLI
from test_bad_input import cli_env
from test_docs import doc_commands

pytestmark = pytest.mark.slow

#: What a command needs that a fresh clone lacks: the first pattern matching the command says it.
NEEDS = (
    (r"\b(dbpedia|agnews|20ng)\b|encoders/dbpedia", "the Hugging Face hub (test_readme: a hub preset fails in one line)"),
    (r"http://milvus:", "a Milvus server (tests/server: ingest, alias and serve on one)"),
    (r"--use-gpu|--device cuda|--address auto", "a GPU or a cluster (test_ray_cluster submits train and ingest)"),
    (r"^dhim-ray serve ", "a service until Ctrl-C (test_readme runs it and queries it; test_serve)"),
    (r"^dhim-ray train bbc ", "minutes of training (test_readme: the demo trains bbc; test_ray_train: --workers)"),
)
#: The pages whose commands run here, in this order (evaluation.md searches the collection
#: ingest-and-search.md makes).
RUN_ORDER = ("training.md", "ingest-and-search.md", "evaluation.md")


def docs_commands() -> list[tuple[str, str]]:
    return [(where, line) for where, line in doc_commands() if where != "README.md"]  # the README's: test_readme


def need(line: str) -> str | None:
    return next((why for pattern, why in NEEDS if re.search(pattern, line)), None)


def test_every_doc_command_runs_here_or_names_what_it_needs():
    runnable = {where for where, line in docs_commands() if need(line) is None}
    assert runnable == set(RUN_ORDER), f"pages with commands that run here, not in RUN_ORDER: {runnable ^ set(RUN_ORDER)}"


@pytest.fixture(scope="module")
def folder(bbc16, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("doc-commands")
    (root / "runs").mkdir()
    (root / "runs" / "bbc-64").symlink_to(bbc16, target_is_directory=True)
    docs = [("a1", "The striker scored twice as United won the cup final.", "Cup final", 2019),
            ("a2", "Intel shows a faster chip for phones and a bigger battery.", "Intel phone chip", 2021),
            ("a3", "The minister announced a vote on the budget next week.", "Budget vote", 2020),
            ("a4", "Intel's new laptop chip is faster and sips power.", "Intel laptop chip", 2024)]
    (root / "my-docs.jsonl").write_text("".join(json.dumps({"doc_id": i, "body": t}) + "\n" for i, t, _, _ in docs))
    (root / "my-docs.csv").write_text("text,title,year,url\n" + "".join(
        f'"{t}",{title},{year},https://example.com/{i}\n' for i, t, title, year in docs))
    return root


def test_the_docs_commands_run_as_written(folder, tmp_path):
    cli = ForkedCLI(cli_env(), tmp_path, cwd=folder)
    stored_id = None
    try:
        for page in RUN_ORDER:
            for line in (line for where, line in docs_commands() if where == page and need(line) is None):
                if " ID " in f"{line} ":
                    assert stored_id is not None, f"{page}: {line} uses a hit's ID before a search showed one"
                    line = line.replace(" ID ", f" {stored_id} ")
                started = time.monotonic()
                done = cli.run(shlex.split(line)[1:], timeout=600)
                print(f"{time.monotonic() - started:6.1f} s  {line}")  # shown where the test fails, or with -s
                assert done.returncode == 0, f"{page}: {line}\n{done.stderr[-3000:]}"
                assert "Traceback" not in done.stderr, f"{page}: {line}\n{done.stderr[-3000:]}"
                if line.startswith("dhim-ray search"):
                    assert done.stdout.strip(), f"{page}: {line} showed no hits"
                if line.startswith("dhim-ray search") and (stored_id is None and "--collection bbc_64 " in f"{line} "
                                                           or "title like" in line):
                    hits = json.loads(cli.run([*shlex.split(line)[1:], "--json"]).stdout)[0]["hits"]
                    stored_id = stored_id or hits[0]["id"]
                    if "title like" in line:  # the filter's hits: the Intel documents from 2020 on, no other
                        assert sorted(h["title"] for h in hits) == ["Intel laptop chip", "Intel phone chip"], hits
    finally:
        cli.close()
    assert (folder / "precision-at-k.png").stat().st_size > 0  # evaluation.md's --plot
