"""ingest --alias on milvus-lite: refused in one line before any work (milvus-lite 2.5.1 answers
alias calls UNIMPLEMENTED); the server path is tests/server (test_server_ingest.py)."""

from __future__ import annotations

import pytest

from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.connectors.schema import check_alias_support
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError


def test_an_alias_on_a_lite_file_is_refused_before_anything(tmp_path):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    with pytest.raises(ConfigError, match="a milvus-lite file has no aliases; ingest into a Milvus server"):
        run_ingest(IngestRequest(CorpusSpec("bbc"), tmp_path / "no-model", MilvusTarget(str(tmp_path / "x.db"), "news_v1"), alias="news"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("alias, message", [
    ("news-2", "alias='news-2': use ASCII letters"),
    ("1news", "alias='1news': use ASCII letters"),
])
def test_an_alias_milvus_cannot_name_is_refused(alias, message):
    with pytest.raises(ConfigError, match=message):
        check_alias_support("http://localhost:19530", alias)


def test_the_alias_and_its_collection_need_two_names(tmp_path):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    with pytest.raises(ConfigError, match="the alias and the collection need two names"):
        run_ingest(IngestRequest(CorpusSpec("bbc"), tmp_path / "m", MilvusTarget("http://localhost:19530", "news"), alias="news"))
