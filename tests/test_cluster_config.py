import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def ray_schema():
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def test_cluster_yaml_is_valid_for_rays_schema():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    jsonschema.validate(config, ray_schema())
    workers = config["available_node_types"]["gpu_worker"]
    assert workers["resources"]["GPU"] == 1 and workers["min_workers"] == 4
    assert any("torch==2.13.0" in c for c in config["setup_commands"])


def test_schema_check_catches_a_broken_config():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    config["max_workers"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, ray_schema())


@pytest.mark.slow
def test_the_setup_commands_make_a_working_node_from_a_fresh_python(tmp_path):
    """cluster.yaml's setup_commands, as `ray up` runs them on each node, on a fresh virtual
    environment here (the project mounted where file_mounts puts it): they install, and the
    node can then import and run dhim-ray. No GPU here, so the torch line takes its CPU branch."""
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    mount = next(remote for remote, local in config["file_mounts"].items() if local == ".")
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(node)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{node / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(node), PIP_DISABLE_PIP_VERSION_CHECK="1")
    assert shutil.which("python3", path=env["PATH"]) == str(node / "bin" / "python3")
    for command in config["setup_commands"]:
        run = subprocess.run(["bash", "-c", command.replace(mount, str(ROOT))], env=env, capture_output=True,
                             text=True, timeout=1800)
        assert run.returncode == 0, f"{command}\n{(run.stdout + run.stderr)[-3000:]}"
    check = subprocess.run([str(node / "bin" / "python3"), "-c",
                            "import torch, ray, pymilvus, milvus, dhim_ray.jobs.ingest; print(torch.__version__)"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.strip().startswith("2.13.0"), check.stdout + check.stderr[-2000:]
    cli = subprocess.run([str(node / "bin" / "dhim-ray"), "--help"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert cli.returncode == 0 and "ingest" in cli.stdout, cli.stderr[-2000:]
