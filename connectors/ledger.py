"""Which code collections an ingest has finished, one row each in ``dhim_ray_ingests`` (Milvus
cannot change a collection's description): ``writing`` before the first row, ``verified`` once the
count matches the source's, so a search can say that what it reads is incomplete (a collection the
ledger does not know is taken as it is). ``dhim_ray_words`` holds the generation of each
collection's words beside a milvus-lite file, which the words hold too: one that differs is stale."""

from __future__ import annotations

import time
from typing import Any

from dhim_ray.connectors.schema import RESERVED_NAME, WORDS_LEDGER, create_loaded, quote

LEDGER = RESERVED_NAME
WRITING, VERIFIED = "writing", "verified"
_NAME_BYTES, _SOURCE_BYTES = 255, 1024


def _schema():
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False,
                                        description="dhim-ray: the state of each code collection's last ingest")
    schema.add_field("collection", DataType.VARCHAR, is_primary=True, max_length=_NAME_BYTES)
    schema.add_field("state", DataType.VARCHAR, max_length=16)
    schema.add_field("source", DataType.VARCHAR, max_length=_SOURCE_BYTES)
    schema.add_field("at", DataType.VARCHAR, max_length=32)
    schema.add_field("rows", DataType.INT64)
    schema.add_field("unused", DataType.BINARY_VECTOR, dim=8)  # Milvus wants a vector in every collection
    return schema


def _words_schema():
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False,
                                        description="dhim-ray: the generation of each collection's words")
    schema.add_field("collection", DataType.VARCHAR, is_primary=True, max_length=_NAME_BYTES)
    schema.add_field("generation", DataType.VARCHAR, max_length=64)
    schema.add_field("unused", DataType.BINARY_VECTOR, dim=8)
    return schema


def _created(client: Any, name: str, schema, timeout: float | None) -> None:
    if not client.has_collection(name, timeout=timeout):
        index = client.prepare_index_params()
        index.add_index(field_name="unused", index_type="BIN_FLAT", metric_type="HAMMING")
        create_loaded(client, name, schema, index, timeout)


def words_generation(client: Any, collection: str, timeout: float | None = None) -> str | None:
    """The generation ``collection``'s words were last written in (None: none recorded)."""
    if not client.has_collection(WORDS_LEDGER, timeout=timeout):
        return None
    found = client.query(WORDS_LEDGER, filter=f"collection == {quote(collection)}", output_fields=["generation"],
                         timeout=timeout, consistency_level="Strong")
    return found[0]["generation"] if found else None


def set_words_generation(client: Any, collection: str, generation: str, timeout: float | None = None) -> None:
    _created(client, WORDS_LEDGER, _words_schema(), timeout)
    client.upsert(WORDS_LEDGER, [{"collection": collection, "generation": generation, "unused": b"\0"}],
                  timeout=timeout)


def mark(client: Any, collection: str, state: str, source: str, rows: int = 0, timeout: float | None = None) -> None:
    """Record ``collection``'s ingest of ``source`` as ``state`` (WRITING or VERIFIED, with its rows)."""
    _created(client, LEDGER, _schema(), timeout)
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    client.upsert(LEDGER, [{"collection": collection, "state": state, "source": source[:_SOURCE_BYTES // 4],
                            "at": at, "rows": int(rows), "unused": b"\0"}], timeout=timeout)


def unfinished(client: Any, collection: str, timeout: float | None = None) -> str | None:
    """One line saying ``collection`` is incomplete (an ingest marked it WRITING and has not
    verified it), or None: verified, or not in the ledger."""
    if not client.has_collection(LEDGER, timeout=timeout):
        return None
    found = client.query(LEDGER, filter=f"collection == {quote(collection)}", output_fields=["state", "source", "at"],
                         timeout=timeout)
    if not found or found[0]["state"] != WRITING:
        return None
    row = found[0]
    return (f"collection {collection!r} may be incomplete: an ingest of {row['source']} began at {row['at']} and has "
            "not verified it (interrupted, or still running); rerun the same ingest to complete it")
