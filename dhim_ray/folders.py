"""Folders a command creates (a refused or failed command leaves the disk as it was), and the
cache's files, sealed with the digest of what was written and read back only where it matches."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


def first_missing_folder(path: str | Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None when ``path`` exists):
    what a run that creates ``path`` and then fails removes again, parents included."""
    path = Path(path).absolute()
    if path.exists():
        return None
    top = path
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


@contextlib.contextmanager
def removed_unless_kept(path: str | Path, kept: Callable[[Path], bool]) -> Iterator[None]:
    """Run a block that creates folder ``path``; when the block fails and ``kept(path)`` is
    false (nothing there worth resuming), remove what it created: a refused command
    leaves the disk as it was."""
    top = first_missing_folder(path)
    try:
        yield
    except BaseException:
        if top is not None and top.exists() and not kept(Path(path)):
            shutil.rmtree(top, ignore_errors=True)
        raise


def cache_folder() -> Path:
    """Where exported graphs are kept: $DHIM_RAY_CACHE, else $XDG_CACHE_HOME/dhim-ray, else
    ~/.cache/dhim-ray (each under ``onnx/``)."""
    root = os.environ.get("DHIM_RAY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dhim-ray")
    return Path(root) / "onnx"


def _seal_of(data: bytes, key: str) -> str:
    """The seal of a cached file's bytes under the key it is cached by (a file copied from another key fails)."""
    return hashlib.sha256(key.encode() + b"\0" + data).hexdigest()


def seal(path: Path, key: str) -> None:
    """Write ``PATH.sha256`` beside a cached file: the digest of the bytes just written, under ``key``."""
    tmp = path.with_name(path.name + ".sha256.tmp")
    tmp.write_text(_seal_of(path.read_bytes(), key))
    os.replace(tmp, path.with_name(path.name + ".sha256"))


def read_sealed(path: Path, key: str) -> bytes | None:
    """A cached file's bytes where its seal matches them; None where either is missing, partial or changed."""
    try:
        data, sealed = path.read_bytes(), path.with_name(path.name + ".sha256").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return data if sealed == _seal_of(data, key) else None
