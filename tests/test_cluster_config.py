"""ray_cluster.yaml is a valid Ray cluster-launcher config: a CPU head, a GPU worker group, project setup."""
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def _config():
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())


def test_validates_against_rays_own_schema():
    # exactly what `ray up` does before it launches anything
    validate_config(prepare_config(_config()))


def test_has_cpu_head_gpu_workers_and_installs_the_project():
    cfg = _config()
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and not head["node_config"]["InstanceType"].startswith(("g", "p"))
    gpu = cfg["available_node_types"]["gpu_worker"]
    assert gpu["node_config"]["InstanceType"].startswith(("g", "p")) and gpu["max_workers"] >= 1
    setup = " ".join(cfg["setup_commands"])
    assert "pip install" in setup and "-e ." in setup
    assert cfg["file_mounts"]["/home/ubuntu/edje"] == "."


def test_schema_rejects_a_broken_config():
    cfg = _config()
    cfg["available_node_types"]["gpu_worker"]["min_workers"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(cfg))
