"""A DHIM model behind pymilvus' embedding-function interface, for Milvus users' own code.

pymilvus' model library (``pymilvus.model``) names what an embedding function offers:
``encode_documents``, ``encode_queries``, ``dim`` and calling it. This class offers the same
for a ``BINARY_VECTOR`` field: each text becomes its packed code as ``bytes`` (most
significant bit first, ``dim`` bits), the value pymilvus inserts and searches with the
``HAMMING`` metric. No pymilvus import here: the values are plain bytes.

    >>> from pymilvus import MilvusClient, DataType
    >>> ef = DHIMEmbeddingFunction("runs/bbc-64")
    >>> client = MilvusClient("docs.db")
    >>> schema = client.create_schema(auto_id=True)
    >>> schema.add_field("id", DataType.INT64, is_primary=True)
    >>> schema.add_field("code", DataType.BINARY_VECTOR, dim=ef.dim)
    >>> schema.add_field("text", DataType.VARCHAR, max_length=4096)
    >>> index = client.prepare_index_params()
    >>> index.add_index("code", index_type="BIN_FLAT", metric_type="HAMMING")
    >>> client.create_collection("docs", schema=schema, index_params=index)
    >>> client.insert("docs", [{"code": c, "text": t} for c, t in zip(ef.encode_documents(texts), texts)])
    >>> client.search("docs", data=ef.encode_queries(["oil prices"]), anns_field="code", limit=5,
    ...               output_fields=["text"])
"""

from __future__ import annotations

from pathlib import Path

from dhim_ray.hasher import Hasher


class DHIMEmbeddingFunction:
    """Texts -> packed DHIM codes (``bytes`` of ``dim // 8``) for a Milvus BINARY_VECTOR field.

    Documents and queries are hashed alike (a Hamming code is symmetric); both methods exist
    because pymilvus' interface has them. ``model_name`` is the checkpoint folder.
    """

    def __init__(self, model_name: str | Path, device: str = "cpu", batch_size: int = 64):
        self.model_name = str(model_name)
        self.hasher = Hasher.load(model_name, device=device)
        self.batch_size = batch_size

    @property
    def dim(self) -> int:
        """The code length in bits: the BINARY_VECTOR field's ``dim``."""
        return self.hasher.n_bits

    def encode_documents(self, documents: list[str]) -> list[bytes]:
        return [code.tobytes() for code in self.hasher.encode(list(documents), self.batch_size)]

    def encode_queries(self, queries: list[str]) -> list[bytes]:
        return self.encode_documents(queries)

    def __call__(self, texts: list[str]) -> list[bytes]:
        return self.encode_documents(texts)
