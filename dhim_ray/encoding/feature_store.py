"""Frozen features on disk (numpy only): ``.npy`` files filled batch by batch while the encoder
runs and read back with ``pread`` as ``RowFile`` arrays, so a batch costs its own rows in memory
and a Ray worker (a ``RowFile`` pickles as its path) reads only its shard.

    >>> store = FeatureStore.create(folder, n=len(texts), n_tokens=50, hidden=384)
    >>> feats = FeatureStore.open(folder).features(in_memory=False)"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

META = "meta.json"
FORMAT = 1
# name -> (dtype, per-row shape given n_tokens T and hidden H)
FIELDS: dict[str, tuple[str, str]] = {"tokens": ("float16", "TH"), "mask": ("bool", "T"),
                                      "cls": ("float32", "H"), "mean": ("float32", "H")}


def _runs(idx: np.ndarray):
    """(start, stop) positions in ``idx`` of its runs of consecutive row numbers."""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    return zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(idx)].tolist())


class RowFile:
    """Rows [start, stop) of an (n, ...) array in a ``.npy`` file, read with ``pread``.

    Indexing by an int, a slice (step 1) or an array of row numbers returns a numpy
    array holding just those rows; runs of consecutive rows are read in one call.
    ``shard(a, b)`` is a view of rows a..b-1 that reads nothing else.
    """

    def __init__(self, path: str | Path, start: int = 0, stop: int | None = None):
        self.path = str(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            self._offset = f.tell()
        if fortran:
            raise ValueError(f"{self.path}: Fortran-ordered arrays are not supported")
        self.dtype = np.dtype(dtype)
        self._file_rows, self.row_shape = int(shape[0]), tuple(shape[1:])
        self._row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        stop = self._file_rows if stop is None else stop
        if not 0 <= start <= stop <= self._file_rows:
            raise IndexError(f"rows [{start}, {stop}) outside {self.path} ({self._file_rows} rows)")
        self.start, self.stop = start, stop
        self._fd: int | None = None

    # ---- array-like surface -----------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return (self.stop - self.start, *self.row_shape)

    @property
    def data_offset(self) -> int:
        """Where row 0 of the file starts (after the .npy header)."""
        return self._offset

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    @property
    def nbytes(self) -> int:
        return len(self) * self._row_bytes

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"RowFile({self.path!r}, rows {self.start}..{self.stop}, {self.dtype}{list(self.row_shape)})"

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            i = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {index} outside {len(self)} rows")
            return self._read_runs(np.array([i]))[0]
        if isinstance(index, slice):
            a, b, step = index.indices(len(self))
            if step != 1:
                return self[np.arange(a, b, step)]
            return self._read_runs(np.arange(a, max(a, b)))
        idx = np.asarray(index)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(f"RowFile takes an int, a slice or a 1-d array of rows, not {type(index).__name__}")
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"rows outside 0..{len(self) - 1}")
        if idx.size > 1 and (np.diff(idx) <= 0).any():  # unsorted or repeated: read each row once
            uniq, inverse = np.unique(idx, return_inverse=True)
            return self._read_runs(uniq)[inverse]
        return self._read_runs(idx)

    def shard(self, start: int, stop: int) -> RowFile:
        """Rows start..stop-1 of this view, as a view of their own."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"shard [{start}, {stop}) outside {len(self)} rows")
        return RowFile(self.path, self.start + start, self.start + stop)

    # ---- reading and writing --------------------------------------------------------------
    def _fileno(self, writable: bool = False) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)
        return self._fd

    def _read_runs(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (sorted, distinct) in one array, one pread per run of consecutive rows."""
        out = np.empty((len(idx), *self.row_shape), dtype=self.dtype)
        if not len(idx):
            return out
        flat = out.reshape(len(idx), -1).view(np.uint8).reshape(len(idx), self._row_bytes)
        fd = self._fileno()
        for run_start, run_stop in _runs(idx):
            row = self.start + int(idx[run_start])
            view = memoryview(flat[run_start:run_stop]).cast("B")
            offset, done = self._offset + row * self._row_bytes, 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], offset + done)
                if got <= 0:
                    raise OSError(f"{self.path}: short read at row {row} (a truncated feature store?)")
                done += got
        return out

    def write(self, start: int, rows: np.ndarray) -> None:
        """Write ``rows`` at rows start.. of this view (disjoint writes may come from many processes)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape or not 0 <= start <= start + len(rows) <= len(self):
            raise ValueError(f"{self.path}: cannot write {rows.shape} at row {start} of {self.shape}")
        data = memoryview(rows.reshape(-1).view(np.uint8))
        offset, done = self._offset + (self.start + start) * self._row_bytes, 0
        fd = self._fileno(writable=True)
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}


class FeatureStore:
    """A folder of frozen features for n documents: tokens, mask, cls and mean as .npy
    files plus ``meta.json``. ``create`` starts one in a work folder of its own
    (``FOLDER.partial-HOST-PID-TAG``), ``write`` fills rows, ``finish`` makes it appear
    at ``FOLDER``; ``open`` reads a finished one. Two processes that build the same
    store at once (two trainings on one corpus) each write their own work folder; the
    first to finish puts its store in place and the other's is dropped."""

    def __init__(self, folder: str | Path, meta: dict[str, Any], work: str | Path | None = None):
        self.folder = Path(folder)
        self.meta = meta
        self.work = None if work is None else Path(work)

    # ---- building ---------------------------------------------------------------------
    @staticmethod
    def _work_prefix(folder: Path) -> str:
        return folder.name + ".partial-"

    @classmethod
    def _reap_abandoned(cls, folder: Path) -> None:
        """Remove work folders that this host's crashed builds left beside ``folder``."""
        host, prefix = socket.gethostname(), cls._work_prefix(folder)
        for work in folder.parent.glob(glob.escape(prefix) + "*"):
            owner = work.name[len(prefix):].rsplit("-", 2)  # HOST-PID-TAG, as create names it
            if len(owner) != 3 or owner[0] != host or not owner[1].isdigit():
                continue
            try:
                os.kill(int(owner[1]), 0)
            except ProcessLookupError:
                logger.info("removing %s, left by a build that did not finish", work)
                shutil.rmtree(work, ignore_errors=True)
            except PermissionError:  # alive, another user's
                pass

    @staticmethod
    def nbytes_for(n: int, n_tokens: int, hidden: int) -> int:
        """The bytes a store of n documents takes on disk."""
        dims = {"T": n_tokens, "H": hidden}
        return n * sum(int(np.prod([dims[c] for c in row], dtype=np.int64)) * np.dtype(dtype).itemsize
                       for dtype, row in FIELDS.values())

    @classmethod
    def create(cls, folder: str | Path, n: int, n_tokens: int, hidden: int) -> FeatureStore:
        """Allocate the files of a store for n documents (sparse: no disk written yet)."""
        folder = Path(folder)
        check_cache_dir(folder.parent, cls.nbytes_for(n, n_tokens, hidden))
        folder.parent.mkdir(parents=True, exist_ok=True)
        cls._reap_abandoned(folder)
        work = folder.with_name(f"{cls._work_prefix(folder)}{socket.gethostname()}-{os.getpid()}-"
                                f"{uuid.uuid4().hex[:8]}")
        work.mkdir()
        dims = {"T": n_tokens, "H": hidden}
        for name, (dtype, row) in FIELDS.items():
            shape = (n, *(dims[c] for c in row))
            with open(work / f"{name}.npy", "wb") as f:
                np.lib.format.write_array_header_2_0(
                    f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                        "shape": shape})
                f.truncate(f.tell() + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        return cls(folder, {"format": FORMAT, "n": n, "n_tokens": n_tokens, "hidden": hidden}, work)

    def _building(self) -> Path:
        if self.work is None or not self.work.is_dir():
            raise ValueError(f"{self.folder}: this store is not being built (FeatureStore.create starts one)")
        return self.work

    def writer(self) -> StoreWriter:
        """Something to write rows with, from this process or (pickled) from another."""
        return StoreWriter(self._building())

    def finish(self, **meta: Any) -> FeatureStore:
        """Record ``meta`` and move the folder into place (the store now reads as complete).
        If another build of the same store finished first, its store stays and this one
        is dropped: both hold the same features."""
        work = self._building()
        self.meta.update(meta)
        (work / META).write_text(json.dumps(self.meta, indent=1))
        for _ in range(3):
            try:
                work.rename(self.folder)
                break
            except OSError as exc:  # the folder exists: a finished store, or a damaged one
                error = exc
                if self.is_complete(self.folder):
                    logger.info("%s was finished by another process meanwhile; using it", self.folder)
                    shutil.rmtree(work, ignore_errors=True)
                    break
                shutil.rmtree(self.folder, ignore_errors=True)
        else:
            raise OSError(f"could not move {work} to {self.folder} ({error})") from error
        self.work = None
        return self

    # ---- reading ----------------------------------------------------------------------
    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / META).is_file()

    @classmethod
    def is_complete(cls, folder: str | Path) -> bool:
        """A finished store that opens (one left damaged, e.g. truncated, is logged and
        reads as missing: building it again replaces it)."""
        if not cls.exists(folder):
            return False
        try:
            cls.open(folder)
        except ValueError as exc:
            logger.warning("%s; computing it again", exc)
            return False
        return True

    @classmethod
    def open(cls, folder: str | Path) -> FeatureStore:
        folder = Path(folder)
        try:
            meta = json.loads((folder / META).read_text())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')}")
            n = meta["n"]
            for name in FIELDS:
                f = RowFile(folder / f"{name}.npy")
                if len(f) != n or os.path.getsize(f.path) < f.data_offset + f.nbytes:
                    raise ValueError(f"{name}.npy does not hold {n} rows")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{folder}: not a complete feature store ({exc})") from exc
        return cls(folder, meta)

    def __len__(self) -> int:
        return int(self.meta["n"])

    @property
    def nbytes(self) -> int:
        return sum(RowFile(self.folder / f"{name}.npy").nbytes for name in FIELDS)

    def columns(self, in_memory: bool, rows: Sequence[int] | None = None) -> dict[str, Any]:
        """tokens, mask, cls, mean for rows [a, b) (default all): numpy arrays read whole
        when ``in_memory``, else ``RowFile`` views read batch by batch. The (n, T) bool
        mask is always read whole: it is small and every batch needs its lengths."""
        a, b = (0, len(self)) if rows is None else rows
        out = {}
        for name in FIELDS:
            col = RowFile(self.folder / f"{name}.npy").shard(a, b)
            out[name] = col[:] if in_memory or name == "mask" else col
        return out


class StoreWriter:
    """Writes rows into a store being built; pickles as its folder (for Ray actors)."""

    def __init__(self, work: str | Path):
        self.work = Path(work)
        self.files = {name: RowFile(self.work / f"{name}.npy") for name in FIELDS}

    def write(self, start: int, tokens: np.ndarray, mask: np.ndarray, cls: np.ndarray, mean: np.ndarray) -> None:
        for name, rows in (("tokens", tokens), ("mask", mask), ("cls", cls), ("mean", mean)):
            self.files[name].write(start, rows)

    def write_rows(self, rows: np.ndarray, tokens: np.ndarray, mask: np.ndarray, cls: np.ndarray,
                   mean: np.ndarray) -> None:
        """Rows at arbitrary positions (a Ray Data batch's document numbers)."""
        rows = np.asarray(rows, dtype=np.int64)
        for a, b in _runs(rows):
            self.write(int(rows[a]), tokens[a:b], mask[a:b], cls[a:b], mean[a:b])

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def __getstate__(self) -> dict:
        return {"work": self.work}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["work"])


def _size(nbytes: int) -> str:
    """1536 -> '1.5 KiB'."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if nbytes >= 1024**power:
            return f"{nbytes / 1024**power:.1f} {unit}"
    return f"{nbytes} B"


def check_cache_dir(folder: str | Path | None, nbytes: int = 0) -> None:
    """A feature cache must be a folder (or not exist yet) on a disk with room for ``nbytes``
    more: a file there, or a disk that would fill hours into the encoding, is refused in one line."""
    from dhim_ray.errors import ConfigError

    if folder is None:
        return
    for part in (Path(folder), *Path(folder).parents):
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"cache_dir={folder}: {part} is a file, not a folder; give a folder for the "
                                  "feature cache", field="cache_dir")
            if not os.access(part, os.W_OK | os.X_OK):
                raise ConfigError(f"cache_dir={folder}: {part} cannot be written; give a writable folder for the "
                                  "feature cache", field="cache_dir")
            free = shutil.disk_usage(part).free
            if nbytes > free:
                raise ConfigError(f"no room for the frozen features in {folder}: they need {_size(nbytes)} and its "
                                  f"disk has {_size(free)} free; free some space, or give cache_dir=DIR on a "
                                  "larger disk")
            return
