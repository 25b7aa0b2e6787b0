"""A DHIM model behind pymilvus' embedding-function interface (``encode_documents``,
``encode_queries``, ``dim``): each text becomes its packed code as ``bytes``, the value a
``BINARY_VECTOR`` field takes with the ``HAMMING`` metric. No pymilvus import here.

    >>> ef = DHIMEmbeddingFunction("runs/bbc-64")
    >>> client.search("docs", data=ef.encode_queries(["oil prices"]), anns_field="code", limit=5)"""

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
