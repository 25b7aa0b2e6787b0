"""Folders a command creates: a refused or failed command leaves the disk as it was."""

from __future__ import annotations

import contextlib
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
