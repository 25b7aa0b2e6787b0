"""A running service, announced beside the milvus-lite file it holds: ``dhim-ray search`` on a
file that ``dhim-ray serve`` has open (one process per file) asks the service instead of
failing. The file is trusted only if it is the user's own (not writable by others) and names
a loopback address; a token goes only where its digest in the file matches. Standard library
only: the CLI's search reads it without importing Ray."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import stat
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def service_file(uri: str) -> Path:
    """Where a service holding milvus-lite file ``uri`` says so: ``.NAME.db.service.json`` beside it."""
    path = Path(uri)
    return path.with_name(f".{path.name}.service.json")


def announce(uri: str, url: str, collection: str, model_dir: str, api_token_env: str | None,
             api_token_sha256: str = "") -> None:
    """Write the service file, readable by its owner alone (the token's variable and digest, never the token)."""
    record = {"url": url, "collection": collection, "model_dir": str(Path(model_dir).resolve()), "pid": os.getpid(),
              "api_token_env": api_token_env, "api_token_sha256": api_token_sha256}
    path = service_file(uri)
    path.unlink(missing_ok=True)  # a planted file (or link) is replaced, never written through
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))


def withdraw(uri: str) -> None:
    service_file(uri).unlink(missing_ok=True)


def loopback_url(url: Any) -> str | None:
    """``http://HOST:PORT`` rewritten from its parse where HOST is a loopback address; else None."""
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        port = parts.port if parts else None
    except ValueError:
        return None
    if parts is None or parts.scheme != "http" or not port or parts.username or parts.password or parts.query:
        return None
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None
    if not loopback:
        return None
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _owned(path: Path) -> str | None:
    """Why a service file may not be trusted (None: the user's own regular file, writable by them alone)."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.getuid():
        return "another user owns it"
    if info.st_mode & 0o022:
        return "others may write it"
    return None


def running_service(uri: str, collection: str | None, model_dir: str) -> dict[str, Any] | None:
    """The service holding ``uri`` for this collection and model, if one announced itself in a
    file this user owns, at a loopback address, and its process still runs; else None (a file
    that fails the checks is said in one warning and ignored)."""
    path = service_file(uri)
    try:
        why = _owned(path)
        record = json.loads(path.read_text()) if why is None else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        why, record = f"it cannot be read ({type(exc).__name__})", None
    if record is not None and not isinstance(record, dict):
        why, record = "it is not a service's record", None
    if record is not None:
        url = loopback_url(record.get("url"))
        why = None if url else "its address is not a loopback http://HOST:PORT"
    if why is not None:
        logger.warning("%s: ignored (%s); remove it if no 'dhim-ray serve' of yours holds %s", path, why, uri)
        return None
    try:
        os.kill(int(record["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return None
    if collection not in (None, record.get("collection")) or record.get("model_dir") != str(Path(model_dir).resolve()):
        return None
    return {**record, "url": url}


def _bearer(record: dict[str, Any]) -> dict[str, str]:
    """The Authorization header, only where the named variable's token is the one the service checks."""
    token_env, digest = record.get("api_token_env"), record.get("api_token_sha256")
    token = os.environ.get(token_env) if isinstance(token_env, str) and token_env else None
    if not token or not isinstance(digest, str) or not digest:
        return {}
    if not hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), digest):
        logger.warning("$%s does not hold the token the service at %s checks: not sent", token_env, record["url"])
        return {}
    return {"Authorization": f"Bearer {token}"}


def ask(record: dict[str, Any], body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST /search to the announced service: its JSON answer. An error answer raises
    ``ServiceRefused`` with the service's one line."""
    headers = {"Content-Type": "application/json", **_bearer(record)}
    request = urllib.request.Request(record["url"] + "/search", json.dumps(body).encode(), headers)
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
