"""The Python examples of docs/, run as written, a page's blocks in order in one namespace (as
a reader follows the page), in a folder where runs/bbc-64 is a trained model and dhim_ray.db
holds bbc_64: the packaged BBC corpus ingested with it. The ONNX page's blocks and the
DHIMEmbeddingFunction block run in the tests named below, beside what they check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytestmark = pytest.mark.slow
#: (page, block index) -> the test file that runs it as written.
RUN_ELSEWHERE = {("serve.md", 0): "test_onnx_backend.py", ("serve.md", 1): "test_onnx_backend.py",
                 ("ingest-and-search.md", 3): "test_embedding_function.py"}


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


PAGES = sorted(p.name for p in DOCS.glob("*.md") if python_blocks(p.name))


@pytest.fixture(scope="module")
def folder(ray_session, bbc16, tmp_path_factory):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    root = tmp_path_factory.mktemp("docs")
    (root / "runs").mkdir()
    (root / "runs" / "bbc-64").symlink_to(bbc16, target_is_directory=True)
    run_ingest(IngestRequest(CorpusSpec("bbc", limit=400), root / "runs" / "bbc-64", MilvusTarget(str(root / "dhim_ray.db"), "bbc_64"), workers=2), progress=False)
    return root


def test_every_python_block_is_run_by_a_test():
    for (page, i), test_file in RUN_ELSEWHERE.items():
        assert i < len(python_blocks(page)), f"{page} has no block {i} any more: update RUN_ELSEWHERE"
        assert page in (ROOT / "tests" / test_file).read_text(), f"{test_file} no longer runs {page}'s block {i}"
    assert {"evaluation.md", "ingest-and-search.md", "serve.md"} <= set(PAGES)


@pytest.mark.parametrize("page", [p for p in PAGES if any(i not in {j for q, j in RUN_ELSEWHERE if q == p}
                                                          for i in range(len(python_blocks(p))))])
def test_a_pages_python_examples_run_as_written(folder, page, monkeypatch, capsys):
    from dhim_ray.connectors.connection import release

    monkeypatch.chdir(folder)
    scope: dict = {}
    try:
        for i, block in enumerate(python_blocks(page)):
            if (page, i) not in RUN_ELSEWHERE:
                exec(compile(block, f"{page} block {i}", "exec"), scope)  # noqa: S102 - the documented example
    finally:
        release(str(folder / "dhim_ray.db"))
    printed = capsys.readouterr().out
    if page == "ingest-and-search.md":
        assert scope["result"].mode == "hybrid" and len(scope["result"].hits[0]) == 10
        like = scope["like"].hits[0]  # only the fields asked for, the row itself left out
        assert scope["like"].mode == "codes" and len(like) == 5 and set(like[0]) == {"id", "distance", "row", "text"}
        assert scope["hit"]["id"] not in {h["id"] for h in like}
        assert len(scope["hits"][0]) == 10  # the pymilvus block's own search
        assert scope["figures"]["rows_in_collection"] == 100  # the datasink's
    if page == "evaluation.md":
        assert [line.split()[0] for line in printed.splitlines()] == ["dhim", "itq"]
