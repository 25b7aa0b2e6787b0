"""The wheel installs one top-level name, dhim_ray: the repository's connectors/ and
jobs/ folders land as dhim_ray.connectors and dhim_ray.jobs, so an unrelated project's
``jobs`` or ``connectors`` package neither shadows them nor is shadowed (issue 12.8)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_imports_cleanly_next_to_an_unrelated_jobs_package(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("dhim_ray-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"dhim_ray"}, tops
    assert "dhim_ray/connectors/milvus.py" in names and "dhim_ray/jobs/train.py" in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    other = tmp_path / "other"
    for name in ("jobs", "connectors"):  # another project's packages of the same names
        (other / name).mkdir(parents=True)
        (other / name / "__init__.py").write_text(f"OWNER = 'another project: {name}'\n")
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import jobs, connectors\n"
        "import dhim_ray.jobs.ray_env, dhim_ray.connectors.milvus, dhim_ray.codes\n"
        "assert jobs.OWNER.endswith('jobs') and connectors.OWNER.endswith('connectors')\n"
        "assert dhim_ray.jobs.ray_env.__file__.startswith(sys.argv[1]), dhim_ray.jobs.ray_env.__file__\n"
        "assert dhim_ray.connectors.milvus.__file__.startswith(sys.argv[1])\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(site), str(other)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
