"""The device machine's one prepared script runs every step here first, on CPU (--dry-run), so
a lent GPU's minutes go to figures, not to finding a typo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
