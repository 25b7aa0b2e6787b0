"""File descriptor 2 pointed elsewhere for a moment: the processes started meanwhile (a
milvus-lite server, Ray's own) inherit it as their stderr, and the terminal keeps to dhim-ray's
own lines. One helper for the connector and the jobs."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stderr_to(path: str | None, fds: tuple[int, ...] = (2,)) -> Iterator[None]:
    """File descriptor 2 (or each of ``fds``: ``(1, 2)`` for a server that writes to stdout too)
    pointed at ``path`` (appended to; ``os.devnull`` drops it) while the block runs, then put
    back; None, or a path that cannot be opened, leaves them alone."""
    if path is None:
        yield
        return
    try:
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(fd) for fd in fds]
    try:
        for fd in fds:
            os.dup2(log, fd)
        yield
    finally:
        for fd, copy in zip(fds, saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(log)
