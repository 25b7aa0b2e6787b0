"""The command's side of a running service: ``ask_service`` sends a search to the ``dhim-ray serve``
holding a milvus-lite file (jobs/service_file.py finds it), and the last search's hit ids are
kept (``remember_hits``) so ``--like @N`` names a hit by its rank (``last_hits``)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from dhim_ray.errors import ConfigError, StoreBusyError

logger = logging.getLogger(__name__)


def last_search_file() -> Path:

    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dhim-ray" / "last-search.json"


def searched(uri: str, model_dir: Path) -> dict[str, str]:
    """What a last search is recognised by: its store (a milvus-lite file by its full path) and model."""
    from dhim_ray.connectors.connection import is_lite

    return {"uri": str(Path(uri).resolve()) if is_lite(uri) else uri, "model": str(Path(model_dir).resolve())}


def remember_hits(hits: list[list[dict[str, Any]]], uri: str, collection: str | None, model_dir: Path) -> None:
    """Keep the last search's hit ids, so ``--like @N`` names a hit by its rank."""
    record = {**searched(uri, model_dir), "collection": collection, "ids": [[h["id"] for h in row] for row in hits]}
    path = last_search_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    except OSError as exc:  # a read-only home: --like @N is then unavailable, the search is not
        logger.debug("cannot keep the last search in %s: %s", path, exc)


def last_hits(like: list[str] | None, uri: str, collection: str | None, model_dir: Path):
    """``--like`` with each ``@N``/``@Q.N`` replaced by that hit's id, and the collection the search used."""
    if not like or not any(v.startswith("@") for v in like):
        return like, collection
    try:
        last = json.loads(last_search_file().read_text())
    except (OSError, ValueError):
        raise ConfigError("--like @N: no search to take a hit from yet; search first, or give a hit's id") from None
    if any(last.get(key) != value for key, value in searched(uri, model_dir).items()) or collection not in (None, last.get("collection")):
        raise ConfigError(f"--like @N: the last search was of {last.get('collection')} at {last.get('uri')} with "
                          f"{last.get('model')}; search this collection first, or give a hit's id")
    out = []
    for value in like:
        if not value.startswith("@"):
            out.append(value)
            continue
        query, _, rank = value[1:].rpartition(".")
        try:
            q, r = int(query or 1), int(rank)
            if q < 1 or r < 1:
                raise IndexError
            out.append(last["ids"][q - 1][r - 1])
        except (ValueError, IndexError):
            shape = ", ".join(str(len(row)) for row in last["ids"])
            raise ConfigError(f"--like {value}: the last search has no such hit (hits per query: {shape}); give "
                              "@RANK or @QUERY.RANK") from None
    return out, last.get("collection")


def ask_service(uri: str, collection: str | None, model_dir: Path, request):
    """The answer of the ``dhim-ray serve`` holding milvus-lite file ``uri``; None where none announced itself."""
    from dhim_ray.jobs.service_file import ServiceRefused, ask, running_service
    from dhim_ray.search import SearchResult

    record = running_service(uri, collection, str(model_dir))
    if record is None:
        return None
    body = {"k": request.k, "rerank": request.rerank, "filter": request.filter and request.filter.text, "max_distance": request.max_distance,
            "mode": request.mode, **({"texts": list(request.texts)} if request.texts else {"like": list(request.like)})}
    logger.info("%s is held by the service at %s: asking it", uri, record["url"])
    try:
        answer = ask(record, {key: value for key, value in body.items() if value is not None})
    except ServiceRefused as exc:
        error = ConfigError if exc.status in (400, 422) else StoreBusyError
        raise error(f"the service at {record['url']} answered {exc.status}: {exc}") from None
    except OSError as exc:
        raise StoreBusyError(f"uri={uri}: held by the service at {record['url']}, which did not answer ({exc}); "
                             "stop it or retry") from None
    queries = list(request.texts) if request.texts else [f"like {x}" for x in request.like]
    return SearchResult(queries, answer["results"], answer["mode"])
