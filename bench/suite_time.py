"""The test command's budget, measured as the house states it (CONTRIBUTING.md, Budgets): the
README's test command at a revision against the same command at the budget's base, run in turn
on this machine, so the machine's speed cancels out. The base, 9faf47f, took 20.2 minutes on 2
cores when the budget was set at 25: the budget is a ratio of 1.24 (25 / 20.2).

    python bench/suite_time.py                  # HEAD against 9faf47f, about 70 minutes on 2 cores
    python bench/suite_time.py --rev REV --base BASE
    python bench/suite_time.py -- -m "not slow"   # pytest's arguments after --, both revisions

Each revision is checked out in a worktree of its own and installed editable there (the suite's
subprocesses and the cluster's Ray jobs import the installed package), then this checkout is
installed editable again. The whole command writes bench/suite_time.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench's own helpers
from bench.harness import device_name, write_result  # noqa: E402

BASE = "9faf47f"
BUDGET_RATIO = 25 / 20.2


def summary(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line ('1 failed, 1448 passed in 2099.86s')."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    if not lines:
        raise SystemExit(f"pytest ended without a summary line:\n{output[-2000:]}")
    last = lines[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", last)}


def timed_suite(rev: str, folder: Path, pytest_args: list[str]) -> dict:
    """The README's test command, timed, at ``rev`` checked out in ``folder``."""
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), rev], cwd=ROOT, check=True, capture_output=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(folder)], check=True)
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], cwd=folder,
                             capture_output=True, text=True)
        wall = time.monotonic() - started
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True).stdout
    return {"rev": commit.strip(), "wall_s": round(wall, 1), **summary(run.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description="The README's test command at --rev against the budget's base, timed in turn.")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--base", default=BASE)
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest at both revisions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        try:
            base, rev = (timed_suite(r, Path(tmp) / name, args.pytest_args)
                         for name, r in (("base", args.base), ("rev", args.rev)))
        finally:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    ratio = rev["wall_s"] / base["wall_s"]
    result = {"device": device_name("cpu"), "pytest_args": args.pytest_args, "base": base, "rev": rev, "ratio": round(ratio, 3),
              "budget_ratio": round(BUDGET_RATIO, 3), "held": ratio <= BUDGET_RATIO}
    if not args.pytest_args:  # a part of the suite is no measure of the budget
        write_result("suite_time", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
