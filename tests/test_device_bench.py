"""The device machine's one prepared script runs every step here first, on CPU (--dry-run), so
a lent GPU's minutes go to figures, not to finding a typo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_device_ingest_script_runs_every_step_on_cpu(tiny_model, tmp_path):
    out = tmp_path / "device_ingest.json"
    run = subprocess.run([sys.executable, "-m", "bench", "device_ingest", "--model", str(tiny_model), "--dry-run",
                          "--scratch", str(tmp_path), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["docs"] == 2000 and result["device"]["gpu"] is None
    assert result["encoder_alone_docs_per_s"]["fp32"] > 0 and result["store_alone_rows_per_s"] > 0
    assert result["pipeline_without_encoder"]["verified"] and result["pipeline_without_encoder"]["rows_written"] == 2000
    assert result["ingest"]["verified"] and result["ingest"]["rows_in_collection"] == 2000
    assert result["ingest_over_slower"] > 0 and result["pipeline_over_store"] > 0
    assert result["bits_changed_vs_cpu"] == 0.0  # the CPU against itself: the comparison itself runs


def test_what_the_device_lacks_travels_in_calls_under_the_limit_and_is_checked_there(tmp_path):
    """Wheels larger than a call are cut into parts; every call folder stays under its limit; joined
    on the other side they are the same bytes, and a part missing or changed is refused in one line."""
    from bench.device_carry import MANIFEST, join, split_into_calls, take

    rng = np.random.default_rng(0)
    wheels = []
    for name, size in (("big-1.0-py3-none-any.whl", 20_000), ("mid-2.0-py3-none-any.whl", 9_000),
                       ("small-0.1-py3-none-any.whl", 700)):
        wheels.append(tmp_path / name)
        wheels[-1].write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    calls = split_into_calls(wheels, tmp_path / "carry", call_bytes=8_000)
    assert len(calls) == 4  # 29,700 bytes in calls of 8,000
    assert all(sum(f.stat().st_size for f in c.iterdir() if f.name != MANIFEST) <= 8_000 for c in calls)
    device = tmp_path / "device"
    for call in calls:
        take(call, device)
    joined = join(device)
    assert sorted(w.name for w in joined) == sorted(w.name for w in wheels)
    assert all((device / w.name).read_bytes() == w.read_bytes() for w in wheels)

    part = next(device.glob("big-*.part-001"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(SystemExit, match="big-1.0-py3-none-any.whl: its parts join to another sha256"):
        join(device)
    part.unlink()
    with pytest.raises(SystemExit, match="part big-1.0-py3-none-any.whl.part-001 was not carried"):
        join(device)
