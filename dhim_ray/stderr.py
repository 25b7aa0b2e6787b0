"""File descriptor 2 pointed elsewhere for a moment: the processes started meanwhile (a
milvus-lite server, Ray's own) inherit it as their stderr, and the terminal keeps to dhim-ray's
own lines. One helper for the connector and the jobs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def stderr_to(path: str | None) -> Iterator[None]:
    """File descriptor 2 pointed at ``path`` (appended to; ``os.devnull`` drops it) while the
    block runs, then put back; None, or a path that cannot be opened, leaves it alone."""
    if path is None:
        yield
        return
    try:
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)
