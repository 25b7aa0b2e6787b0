"""pymilvus' embedding-function interface over a DHIM model: a Milvus user's own code, with
MilvusClient alone, stores and searches DHIM codes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # real milvus-lite


def test_a_milvus_client_stores_and_searches_the_codes(tmp_path, toy_folder, tiny_model):
    from pymilvus import DataType, MilvusClient

    from dhim_ray import DHIMEmbeddingFunction, Hasher
    from dhim_ray.connectors.connection import release
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec

    model = tiny_model
    texts = load_split(CorpusSpec(str(toy_folder), "train")).texts[:60]
    ef = DHIMEmbeddingFunction(model)
    assert ef.dim == 16
    docs = ef.encode_documents(texts)
    assert all(isinstance(c, bytes) and len(c) == 2 for c in docs)
    assert docs == [c.tobytes() for c in Hasher.load(model).encode(texts)] == ef(texts)

    db = str(tmp_path / "docs.db")
    client = MilvusClient(db)
    schema = client.create_schema(auto_id=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("code", DataType.BINARY_VECTOR, dim=ef.dim)
    schema.add_field("text", DataType.VARCHAR, max_length=4096)
    index = client.prepare_index_params()
    index.add_index("code", index_type="BIN_FLAT", metric_type="HAMMING")
    client.create_collection("docs", schema=schema, index_params=index)
    client.insert("docs", [{"id": i, "code": c, "text": t} for i, (c, t) in enumerate(zip(docs, texts))])
    hits = client.search("docs", data=ef.encode_queries(texts[:5]), anns_field="code", limit=60,
                         output_fields=["text"])
    codes = np.frombuffer(b"".join(docs), dtype=np.uint8).reshape(len(docs), 2)
    for i, row in enumerate(hits):
        assert row[0]["distance"] == 0  # a document's own text is at distance 0
        expected = np.bitwise_count(codes ^ codes[i]).sum(1)
        assert sorted(int(h["distance"]) for h in row) == sorted(expected.tolist())
    client.close()
    release(db)


def test_the_docs_example_runs_as_written(tmp_path, tiny_model, monkeypatch):
    """docs/ingest-and-search.md's DHIMEmbeddingFunction block, run as written in a folder where
    runs/bbc-64 is a trained model."""
    import re
    from pathlib import Path

    from dhim_ray.connectors.connection import release

    shutil.copytree(tiny_model, tmp_path / "runs" / "bbc-64")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "ingest-and-search.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "DHIMEmbeddingFunction(" in b]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    try:
        exec(block, scope)  # noqa: S102 - the documented example, run as written
    finally:
        release(str(tmp_path / "my_docs.db"))
    assert len(scope["hits"][0]) == 2 and {h["entity"]["text"] for h in scope["hits"][0]} == set(scope["texts"])
