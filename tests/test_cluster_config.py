import json
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
