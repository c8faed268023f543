"""deploy/kuberay/ manifests are valid KubeRay objects (the vendored v1 CRD schemas) and keep their promises:
Ray token auth on every node, metrics ports, the dashboard not world-exposed, the project's own entry points."""
from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
import importlib
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
CRDS = KUBERAY / "crds"
MANIFESTS = {"RayJob": "rayjob-encode.yaml", "RayService": "rayservice.yaml"}
AUTH_SECRET_KEY = "auth_token"  # the key KubeRay reads the token from (constant.go: RAY_AUTH_TOKEN_SECRET_KEY)


def _manifest(kind: str) -> dict:
    return yaml.safe_load((KUBERAY / MANIFESTS[kind]).read_text())


def _schema_json(kind: str) -> bytes:
    return gzip.decompress((CRDS / f"{kind}.schema.json.gz").read_bytes())


def _closed(schema: dict) -> dict:
    """The schema with every object that lists its `properties` closed to others (`additionalProperties: false`),
    unless it says `x-kubernetes-preserve-unknown-fields`: what the API server's strict field validation (kubectl's
    default) does with an unknown field, where a plain JSON-schema validator would let it pass. Walks only schema
    positions, so a field that happens to be called `properties` is not mistaken for a keyword."""
    node = dict(schema)
    if "properties" in node:
        node["properties"] = {name: _closed(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _closed(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = _closed(node["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [_closed(sub) for sub in node[key]]
    if isinstance(node.get("not"), dict):
        node["not"] = _closed(node["not"])
    return node


_VALIDATORS: dict = {}


def _validator(kind: str) -> jsonschema.Draft7Validator:
    """Draft 7 over the CRD's openAPIV3Schema: unknown keywords (x-kubernetes-*, format int32, ...) are ignored;
    int-or-string quantities are the schema's own anyOf [integer, string]; type, enum, required, pattern and
    (closed, see _closed) additionalProperties are enforced."""
    if kind not in _VALIDATORS:
        schema = _closed(json.loads(_schema_json(kind)))
        jsonschema.Draft7Validator.check_schema(schema)
        _VALIDATORS[kind] = jsonschema.Draft7Validator(schema)
    return _VALIDATORS[kind]


def _validate(kind: str, manifest: dict) -> None:
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(manifest))
    if error is not None:
        raise error


def _cluster(kind: str, manifest: dict) -> dict:
    return manifest["spec"]["rayClusterSpec" if kind == "RayJob" else "rayClusterConfig"]


def _groups(kind: str, manifest: dict):
    """(name, group spec) of the head group and every worker group."""
    cluster = _cluster(kind, manifest)
    yield "head", cluster["headGroupSpec"]
    for group in cluster["workerGroupSpecs"]:
        yield group["groupName"], group


def _ray_container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]  # KubeRay's Ray container is the first one


def _secret_ref(container: dict, name: str):
    for env in container.get("env", []):
        if env["name"] == name:
            return env.get("valueFrom", {}).get("secretKeyRef")
    return None


def _env_value(container: dict, name: str):
    return next((env.get("value") for env in container.get("env", []) if env["name"] == name), None)


def _serve_config_app() -> dict:
    (app,) = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]
    return app


# ---------------------------------------------------------------------------------------------------------------
# The schemas and what they accept


def test_vendored_schemas_are_the_pinned_release():
    source = (CRDS / "SOURCE.md").read_text()
    assert "v1.7.0" in source and "59d663aeec13760646da3db9c1cf8cfe883e30b7" in source and "Apache" in source
    for kind in MANIFESTS:
        row = next(line for line in source.splitlines() if line.startswith(f"| `{kind}.schema.json.gz`"))
        (digest,) = re.findall(r"`([0-9a-f]{64})`", row)
        assert hashlib.sha256(_schema_json(kind)).hexdigest() == digest, f"{kind}: not the JSON SOURCE.md names"


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_manifest_validates_against_the_crd_schema(kind):
    manifest = _manifest(kind)
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == kind and manifest["metadata"]["name"]
    _validate(kind, manifest)


def _misspell(kind, m):
    head = _cluster(kind, m)["headGroupSpec"]
    head["rayStartParam"] = head.pop("rayStartParams")


def _misspell_env(kind, m):
    env = _ray_container(_cluster(kind, m)["workerGroupSpecs"][0])["env"][1]
    env["valueFrom"]["secretKeyRefs"] = env["valueFrom"].pop("secretKeyRef")


def _int_start_param(kind, m):
    _cluster(kind, m)["headGroupSpec"]["rayStartParams"]["metrics-export-port"] = 8080  # must be a string


def _string_replicas(kind, m):
    _cluster(kind, m)["workerGroupSpecs"][0]["maxReplicas"] = "two"


def _bad_quantity(kind, m):
    _ray_container(_cluster(kind, m)["workerGroupSpecs"][0])["resources"]["limits"]["nvidia.com/gpu"] = "one"


def _no_group_name(kind, m):
    del _cluster(kind, m)["workerGroupSpecs"][0]["groupName"]


def _bad_auth_mode(kind, m):
    _cluster(kind, m)["authOptions"]["mode"] = "tokens"


def _top_level_typo(kind, m):
    m["spec"]["shutdownAfterJobFinish" if kind == "RayJob" else "serveConfig"] = True


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
@pytest.mark.parametrize("breakage", [_misspell, _misspell_env, _int_start_param, _string_replicas, _bad_quantity,
                                      _no_group_name, _bad_auth_mode, _top_level_typo])
def test_schema_rejects_a_broken_manifest(kind, breakage):
    manifest = copy.deepcopy(_manifest(kind))
    _validate(kind, manifest)
    breakage(kind, manifest)
    with pytest.raises(jsonschema.ValidationError):
        _validate(kind, manifest)


def test_int_or_string_quantities_and_open_maps_are_accepted():
    manifest = copy.deepcopy(_manifest("RayJob"))
    limits = _ray_container(_cluster("RayJob", manifest)["workerGroupSpecs"][0])["resources"]["limits"]
    limits["nvidia.com/gpu"], limits["memory"] = "1", "24Gi"  # int-or-string: both spellings are quantities
    _cluster("RayJob", manifest)["headGroupSpec"]["rayStartParams"]["object-store-memory"] = "1000000000"
    _validate("RayJob", manifest)


# ---------------------------------------------------------------------------------------------------------------
# Security and observability, on every group


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_token_auth_on_every_ray_container_from_a_secret(kind):
    manifest = _manifest(kind)
    cluster = _cluster(kind, manifest)
    auth = cluster["authOptions"]
    assert auth["mode"] == "token" and auth["secretName"]
    assert cluster["rayVersion"] == ray.__version__ == "2.60.0"  # token auth needs >= 2.52; the pinned Ray
    for name, group in _groups(kind, manifest):
        container = _ray_container(group)
        assert _env_value(container, "RAY_AUTH_MODE") == "token", name
        ref = _secret_ref(container, "RAY_AUTH_TOKEN")
        assert ref == {"name": auth["secretName"], "key": AUTH_SECRET_KEY}, f"{name}: RAY_AUTH_TOKEN not from the secret"
        assert not any(env["name"] == "RAY_AUTH_TOKEN" and "value" in env for env in container["env"]), name


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_metrics_export_port_on_every_group(kind):
    for name, group in _groups(kind, _manifest(kind)):
        assert group["rayStartParams"]["metrics-export-port"] == "8080", name
        ports = {p.get("name"): p["containerPort"] for p in _ray_container(group).get("ports", [])}
        assert ports.get("metrics") == 8080, name


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_dashboard_is_not_world_exposed(kind):
    manifest = _manifest(kind)
    cluster = _cluster(kind, manifest)
    head = cluster["headGroupSpec"]
    # KubeRay's default for the head is 0.0.0.0 (common/pod.go setMissingRayStartParams): only with auth on
    host = head["rayStartParams"].get("dashboard-host", "0.0.0.0")
    if host not in ("127.0.0.1", "localhost"):
        assert cluster.get("authOptions", {}).get("mode") == "token"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not head.get("enableIngress", False)
    assert "headService" not in head  # a custom head Service could be a LoadBalancer
    if kind == "RayService":
        assert manifest["spec"].get("serveService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_image_is_the_pinned_ray_on_every_group(kind):
    pin = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    for name, group in _groups(kind, _manifest(kind)):
        assert _ray_container(group)["image"] == f"rayproject/ray:{pin}-py311-gpu", name


def _runtime_env_installs_the_project(runtime_env: dict) -> None:
    assert runtime_env["working_dir"].endswith(".zip")
    assert runtime_env["pip"] == ["${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}"]  # pip install of the working dir


# ---------------------------------------------------------------------------------------------------------------
# The RayJob: the encode job, resumable, on GPUs


def test_rayjob_runs_the_encode_script_with_its_real_flags():
    from edje.jobs.encode_cc12m import build_parser

    spec = _manifest("RayJob")["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["python", "jobs/encode_cc12m.py"] and (ROOT / argv[1]).is_file()
    args = build_parser().parse_args(argv[2:])  # an unknown or malformed flag exits here
    assert all(path.startswith("s3://") for path in args.input) and args.output.startswith("s3://")
    assert args.gpus_per_worker == 1
    _runtime_env_installs_the_project(yaml.safe_load(spec["runtimeEnvYAML"]))


def test_rayjob_cleans_up_and_retries():
    spec = _manifest("RayJob")["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["backoffLimit"] >= 1  # a retry runs the same command on a new cluster: it resumes from the markers
    assert spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and spec["submitterConfig"]["backoffLimit"] >= 1


def test_rayjob_has_a_cpu_head_that_does_no_work_and_gpu_workers():
    manifest = _manifest("RayJob")
    groups = dict(_groups("RayJob", manifest))
    head = groups.pop("head")
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in _ray_container(head)["resources"].get("limits", {})
    gpu = groups["gpu"]
    assert _ray_container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    argv = shlex.split(manifest["spec"]["entrypoint"])
    concurrency = int(argv[argv.index("--concurrency") + 1])
    assert gpu["minReplicas"] >= concurrency  # every encoder actor gets its GPU without an autoscaler


# ---------------------------------------------------------------------------------------------------------------
# The RayService: serve_config.yaml's application


def _serve_config_v2() -> dict:
    return yaml.safe_load(_manifest("RayService")["spec"]["serveConfigV2"])


def test_serve_config_v2_is_a_valid_serve_config():
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(_serve_config_v2())


def test_serve_config_v2_is_serve_config_yamls_application():
    from edje.serving.config import ServeConfig

    (app,) = _serve_config_v2()["applications"]
    ours = _serve_config_app()
    assert app["import_path"] == ours["import_path"] == "edje.serving.app:build_app"
    module, _, attr = app["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    assert set(app["args"]) <= fields and set(app["args"]) == set(ours["args"])
    for key, value in ours["args"].items():  # the same args; only the demo's local paths become s3:// placeholders
        if key in ("checkpoint", "token_tables", "caption_sources"):
            paths = [app["args"][key]] if isinstance(app["args"][key], str) else app["args"][key]
            assert all(p.startswith("s3://") for p in paths), key
        else:
            assert app["args"][key] == value, key
    ServeConfig.from_dict(app["args"])  # builds (no file is read): the values are of the right kinds
    assert [d["name"] for d in app["deployments"]] == [d["name"] for d in ours["deployments"]]
    assert app["runtime_env"]["env_vars"] == ours["runtime_env"]["env_vars"]
    _runtime_env_installs_the_project(app["runtime_env"])


def test_serve_proxy_on_all_interfaces_only_with_the_api_token():
    host = _serve_config_v2().get("http_options", {}).get("host", "0.0.0.0")
    if host not in ("127.0.0.1", "localhost"):
        for name, group in _groups("RayService", _manifest("RayService")):
            assert _secret_ref(_ray_container(group), "EDJE_API_TOKEN"), f"{name}: API open without EDJE_API_TOKEN"
