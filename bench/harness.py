"""What every bench shares: where the dev corpora and results live, how a corpus' texts are
read (through the public corpus reader), which device ran, and one way to write a result."""

from __future__ import annotations

import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The dev corpora beside the checkout (../shared/data); never shipped, never in git.
DATA = HERE.parents[1] / "shared" / "data"

logger = logging.getLogger(__name__)


def corpus_path(name: str) -> Path:
    """A dev corpus folder, or a clear exit when ../shared/data does not hold it."""
    path = DATA / name
    if not (path / "train.csv").exists():
        raise SystemExit(f"{path} is missing: the benches read the dev corpora in ../shared/data beside the checkout")
    return path


def read_texts(path: Path, limit: int | None = None) -> list[str]:
    """The texts of one split file (a corpus folder's train.csv or val.csv), first ``limit`` rows."""
    from dhim_ray.corpus.data import load_split
    from dhim_ray.corpus.spec import CorpusSpec

    corpus_path(path.parent.name)
    return load_split(CorpusSpec(str(path.parent), split=path.stem, limit=limit)).texts


def device_name(device: str) -> str:
    """The device in words: the GPU's name, else the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()}, {_cores()} cores"


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_cpu_s() -> float:
    """The machine's CPU seconds spent busy since boot, every core and process (/proc/stat):
    differences over a run alone on the machine give its whole CPU cost, its servers' included."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def remove(path: Path) -> None:
    """A file, or a folder and what it holds (a milvus-lite file's words are a folder beside it)."""
    import shutil

    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def write_result(name: str, result: Any) -> Path:
    """bench/NAME.json, what ``bench.report`` reads."""
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    logger.info("wrote %s", path)
    return path


def record_key(name: str, key: str, value: Any) -> None:
    """Set one entry of bench/NAME.json (a dict of results), keeping the others."""
    path = HERE / f"{name}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[key] = value
    write_result(name, results)


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON Lines result file (none when it does not exist yet)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append_row(path: Path, row: dict) -> None:
    """Add one row to a JSON Lines result file: runs that take hours record as they go."""
    logger.info("%s", json.dumps(row))
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def file_bytes(path: Path) -> int:
    """A milvus-lite file and whatever it keeps beside it under its name, in bytes."""
    beside = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
    return sum(f.stat().st_size for p in beside for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
