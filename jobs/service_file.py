"""A running service, announced beside the milvus-lite file it holds: ``dhim-ray search`` on a
file that ``dhim-ray serve`` has open (one process per file) asks the service instead of
failing. Standard library only: the CLI's search reads it without importing Ray."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def service_file(uri: str) -> Path:
    """Where a service holding milvus-lite file ``uri`` says so: ``.NAME.db.service.json`` beside it."""
    path = Path(uri)
    return path.with_name(f".{path.name}.service.json")


def announce(uri: str, url: str, collection: str, model_dir: str, api_token_env: str | None) -> None:
    """Write the service file (the token's variable name, never the token)."""
    record = {"url": url, "collection": collection, "model_dir": str(Path(model_dir).resolve()), "pid": os.getpid(),
              "api_token_env": api_token_env}
    service_file(uri).write_text(json.dumps(record))


def withdraw(uri: str) -> None:
    service_file(uri).unlink(missing_ok=True)


def running_service(uri: str, collection: str | None, model_dir: str) -> dict[str, Any] | None:
    """The service holding ``uri`` for this collection and model, if one announced itself and
    its process still runs; else None."""
    try:
        record = json.loads(service_file(uri).read_text())
        os.kill(int(record["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if collection not in (None, record.get("collection")) or record.get("model_dir") != str(Path(model_dir).resolve()):
        return None
    return record


def ask(record: dict[str, Any], body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST /search to the announced service: its JSON answer. An error answer raises
    ``ServiceRefused`` with the service's one line."""
    headers = {"Content-Type": "application/json"}
    token_env = record.get("api_token_env")
    if token_env and os.environ.get(token_env):
        headers["Authorization"] = f"Bearer {os.environ[token_env]}"
    request = urllib.request.Request(record["url"].rstrip("/") + "/search", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise ServiceRefused(exc.code, str(message)) from None


class ServiceRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
