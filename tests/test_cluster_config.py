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


def test_defaults_are_filled_then_the_whole_config_validates():
    raw = _config()
    filled = prepare_config(raw)
    # prepare_config merged the autoscaler's own defaults in: these keys come from Ray, not from our file
    for key in ("docker", "file_mounts_sync_continuously", "cluster_synced_files"):
        assert key not in raw and key in filled
    validate_config(filled)
    assert filled["available_node_types"]["gpu_worker"]["max_workers"] == filled["max_workers"] == 16
    filled["head_node_type"] = "no_such_type"  # the schema plus Ray's own cross-checks refuse it
    with pytest.raises(ValueError):
        validate_config(filled)
