"""ray_cluster.yaml is a valid Ray cluster-launcher config: a CPU head, a GPU worker group, project setup, Ray token
auth and metrics on every node, the dashboard on the head's loopback, room for docs/cluster.md's 16 GPU + 5 CPU nodes."""
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def _config():
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())


def _ray_starts(commands):
    """(environment exported before it, {flag: value}) of each `ray start` in a list of shell command lines."""
    starts = []
    for line in commands:
        env = {}
        for segment in re.split(r";|&&", line):
            words = shlex.split(segment)
            if words[:1] == ["export"]:
                env.update(word.split("=", 1) for word in words[1:])
            elif words[:2] == ["ray", "start"]:
                flags = dict((word.split("=", 1) + [""])[:2] for word in words[2:] if word.startswith("--"))
                starts.append((env, flags))
    return starts


def _starts_by_kind(cfg):
    head, workers = _ray_starts(cfg["head_start_ray_commands"]), _ray_starts(cfg["worker_start_ray_commands"])
    assert len(head) == 1 and len(workers) == 1, "one `ray start` for the head, one for the workers"
    return {"head": head[0], "worker": workers[0]}


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
    assert filled["available_node_types"]["gpu_worker"]["max_workers"] == 16 and filled["max_workers"] == 24
    filled["head_node_type"] = "no_such_type"  # the schema plus Ray's own cross-checks refuse it
    with pytest.raises(ValueError):
        validate_config(filled)


def test_token_auth_on_every_ray_start():
    cfg = _config()
    # Ray 2.60.0: RAY_AUTH_MODE=token turns it on; the token is RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
    # names, else ~/.ray/auth_token (ray/_private/authentication/authentication_token_setup.py and
    # authentication_test_utils.py). The file is synced from the launching machine's ~/.ray/auth_token.
    for kind, (env, _) in _starts_by_kind(cfg).items():
        assert env.get("RAY_AUTH_MODE") == "token", kind
        token_path = env["RAY_AUTH_TOKEN_PATH"]
        assert cfg["file_mounts"][token_path] == "~/.ray/auth_token", f"{kind}: the token file is not synced"
    text = (ROOT / "ray_cluster.yaml").read_text()
    assert "RAY_AUTH_TOKEN=" not in text, "a token written into the config would be committed with it"


def test_metrics_export_port_on_every_node():
    for kind, (_, flags) in _starts_by_kind(_config()).items():
        assert flags.get("--metrics-export-port") == "8080", kind


def test_dashboard_not_world_exposed():
    (env, flags) = _starts_by_kind(_config())["head"]
    host = flags.get("--dashboard-host", "127.0.0.1")  # Ray's default is loopback
    # loopback: reached with `ray dashboard ray_cluster.yaml` (ssh port-forwarding); all interfaces only with auth
    assert host in ("127.0.0.1", "localhost") or env.get("RAY_AUTH_MODE") == "token"


def test_max_workers_hold_the_readme_plan():
    # docs/cluster.md's costed plan: 16 GPU (L40S) nodes encoding, 5 CPU nodes (c6i.4xlarge) downloading
    cfg = prepare_config(_config())
    types = cfg["available_node_types"]
    assert types["gpu_worker"]["max_workers"] >= 16 and types["cpu_worker"]["max_workers"] >= 5
    assert types[cfg["head_node_type"]]["max_workers"] == 0
    # the cluster-wide cap lets every type reach its own at once (>= 16 + 5)
    assert cfg["max_workers"] >= sum(t["max_workers"] for t in types.values()) >= 21
