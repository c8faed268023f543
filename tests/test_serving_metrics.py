"""Observability of the served application, and serve_config.yaml deployed the way `serve run`/`serve deploy` do.

Fast tests: the request-metrics middleware's route and status labels, and /readyz's 503 naming a deployment that
does not answer (stand-ins, no Ray). Slow tests: one local Ray with a Prometheus export port; serve_config.yaml as
shipped (demo paths pointed at a small random corpus, a free port, a bearer token) handed to Serve's controller
as a config, so that its `deployments:` section applies; then the Reranker's options, the metrics Ray exports
after N requests, /readyz, X-Request-ID and the Cohere `id`, and a redeploy that changes only the Reranker.
"""
from __future__ import annotations

import asyncio
import copy
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import yaml

from edje.serving.ports import free_port
from edje.serving.random_corpus import write_random_corpus
from edje.serving.startup import StartupConfig

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "metrics-token"
APP = "edje"



# ------------------------------------------------------------------------------------ without Ray
class _Recorder:
    """Stands in for IngressMetrics: keeps what the middleware records."""

    def __init__(self):
        self.seen = []

    def record(self, route, status, seconds):
        self.seen.append((route, status))


def test_request_metrics_label_by_route_template_and_count_every_status():
    from fastapi import FastAPI, HTTPException
    from fastapi.testclient import TestClient

    from edje.serving.http_guards import BearerAuth
    from edje.serving.serve_metrics import OTHER_ROUTE, RequestMetrics

    app = FastAPI()

    @app.get("/v1/items/{item_id}")
    async def item(item_id: str):
        if item_id == "ghost":
            raise HTTPException(404, "no such item")
        return {"id": item_id}

    @app.post("/v1/boom")
    async def boom():
        raise RuntimeError("a bug")

    app.add_middleware(BearerAuth, token="t")
    recorder = _Recorder()
    app.add_middleware(RequestMetrics, metrics=recorder, routes=lambda: app.routes)
    client = TestClient(app, raise_server_exceptions=False)
    auth = {"Authorization": "Bearer t"}
    assert client.get("/v1/items/a", headers=auth).status_code == 200
    assert client.get("/v1/items/ghost", headers=auth).status_code == 404
    assert client.get("/v1/items/a").status_code == 401  # answered by BearerAuth, inside the metrics middleware
    assert client.post("/v1/boom", headers=auth).status_code == 500
    assert client.post("/v1/items/a", headers=auth).status_code == 405  # the route, another method
    assert client.get("/wp-admin/x.php", headers=auth).status_code == 404
    assert recorder.seen == [("/v1/items/{item_id}", 200), ("/v1/items/{item_id}", 404), ("/v1/items/{item_id}", 401),
                             ("/v1/boom", 500), ("/v1/items/{item_id}", 405), (OTHER_ROUTE, 404)]


class _SetRecorder:
    """Stands in for a Ray gauge: keeps every value set."""

    def __init__(self):
        self.values = []

    def set(self, value):
        self.values.append(value)


def test_a_held_gauge_records_its_value_again_until_its_owner_drops_it():
    import gc

    from edje.serving.serve_metrics import HeldGauge

    recorder = _SetRecorder()
    held = HeldGauge(recorder, refresh_s=0.05)
    time.sleep(0.2)
    assert recorder.values == []  # nothing before the first set
    held.set(7)
    deadline = time.time() + 10
    while len(recorder.values) < 4:
        assert time.time() < deadline, recorder.values
        time.sleep(0.05)
    assert set(recorder.values) == {7}  # recorded again: Ray would evict a series left alone for two intervals
    del held
    gc.collect()
    time.sleep(0.2)
    seen = len(recorder.values)
    time.sleep(0.3)
    assert len(recorder.values) == seen  # the refresh thread left with its gauge


class _Never:
    """A deployment response that never comes."""

    cancelled = False

    def __await__(self):
        return asyncio.sleep(3600).__await__()

    def cancel(self):
        _Never.cancelled = True


async def _answer():
    return 24


def test_readyz_names_the_deployment_that_does_not_answer(tmp_path):
    from fastapi.testclient import TestClient

    from edje.model.ranking import RankingConfig
    from edje.serving.config import ServeConfig
    from edje.serving.ingress import Ingress, build_api

    cfg = ServeConfig(miner_image_tables=("unused",), caption_sources=("unused",), auth_token="t", ready_timeout_s=0.3)
    ing = object.__new__(Ingress.func_or_class)  # the class Serve deploys, without Serve's replica wrapper
    ing.config, ing.auth_token, ing.checkpoint_meta, ing.ranking = cfg, "t", None, RankingConfig()
    ing.corpus = None
    ing.miner = SimpleNamespace(info=SimpleNamespace(remote=_answer))
    client = TestClient(build_api(ing))
    r = client.get("/readyz")  # no token: open like /healthz
    assert r.status_code == 200 and r.json() == {"status": "ready", "deployments": {"Ingress": "ok", "Miner": "ok"}}
    ing.miner = SimpleNamespace(info=SimpleNamespace(remote=_Never))
    r = client.get("/readyz")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "not ready" and body["deployments"]["Miner"] == "no answer within 0.3 s"
    assert body["detail"] == "not answering: Miner (no answer within 0.3 s)" and _Never.cancelled
    assert client.get("/healthz").status_code == 200  # liveness stays up


def test_dashboard_and_readme_name_the_series_the_code_defines():
    """docs/grafana_edje.json and docs/operations.md "Monitoring" query `ray_edje_*` series: each is one serve_metrics.py
    makes."""
    import json
    import re

    defined = set(re.findall(r'\b(?:Counter|Histogram|Gauge)\(\s*"(edje_\w+)"', (ROOT / "serving/serve_metrics.py").read_text()))
    assert {"edje_http_requests", "edje_forward_seconds", "edje_corpus_rows"} <= defined, defined
    dashboard = json.loads((ROOT / "docs/grafana_edje.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    operations = (ROOT / "docs/operations.md").read_text()
    monitoring = operations[operations.index("## Monitoring"):]
    end = monitoring.find("\n## ", 1)  # the section, up to the next one
    monitoring = monitoring if end < 0 else monitoring[:end]
    for where, text in (("dashboard", exprs), ("docs/operations.md", monitoring)):
        used = {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in re.findall(r"\bray_(edje_\w+)", text)}
        assert used and used <= defined, (where, sorted(used - defined))
    assert defined <= {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in re.findall(r"\bray_(edje_\w+)", monitoring)}


# ------------------------------------------------------------------------------------ served
def shipped_config(corpus, port: int) -> dict:
    """serve_config.yaml as shipped, its demo paths pointed at `corpus`, its port at `port`, with a bearer token."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    assert "reranker" not in app["args"], "replica counts and resources belong in `deployments:`, not in args"
    app["args"].update(checkpoint=corpus.checkpoint, token_tables=list(corpus.compressed_tables),
                       caption_sources=[corpus.raw_table], auth_token=TOKEN)
    return config


def deploy(config: dict, timeout_s: float = 600) -> None:
    """What `serve run config.yaml` and `serve deploy` do: the whole config to Serve's controller, which applies
    each deployment's options from the file's `deployments:` over the code's. (`serve.run(app)` takes a built
    application only: a file's `deployments:` section never reaches it.)"""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    serve.start(proxy_location=schema.proxy_location, http_options=schema.http_options.model_dump())
    _get_global_client().deploy_apps(schema)
    wait_running(timeout_s)


def wait_running(timeout_s: float) -> None:
    from ray import serve

    deadline, status = time.time() + timeout_s, None
    while time.time() < deadline:
        app = serve.status().applications.get(APP)
        status = app and app.status
        if status == "RUNNING":
            return
        assert status not in ("DEPLOY_FAILED", "UNHEALTHY"), app.message
        time.sleep(2)
    raise AssertionError(f"application {APP} not RUNNING within {timeout_s} s: {status}")


def details() -> dict:
    """The controller's view of the application's deployments (what `GET /api/serve/applications/` shows)."""
    from ray.serve.context import _get_global_client

    return _get_global_client().get_serve_details()["applications"][APP]["deployments"]


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_edje_config):
    return write_random_corpus(str(tmp_path_factory.mktemp("metrics")), tiny_edje_config, num_images=24)


@pytest.fixture(scope="module")
def served(corpus, metrics_port):
    """The shipped config deployed on a fresh local Ray whose metrics agent serves Prometheus text on metrics_port."""
    import ray
    from ray import serve

    os.environ.update(StartupConfig().env())  # patient proxy health checks on a busy machine (serving.startup)
    # Workers report their metrics every second (Ray's default: 10 s), so that the scrapes below settle soon.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=512 * 1024 * 1024, _metrics_export_port=metrics_port,
             _system_config={"metrics_report_interval_ms": 1000})
    config = shipped_config(corpus, free_port())
    try:
        deploy(config)
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {TOKEN}"
        yield SimpleNamespace(url=f"http://127.0.0.1:{config['http_options']['port']}", http=http, config=config)
    finally:
        serve.shutdown()
        ray.shutdown()


def scrape(port: int) -> list:
    """Every sample Ray's metrics agent exports now: (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def total(samples: list, name: str, **labels) -> float:
    """Sum of the samples named `name` whose labels include `labels` (over replicas and workers)."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


SERIES = {  # what the metrics test reads: (sample name, labels)
    "ok": ("ray_edje_http_requests_total", dict(application=APP, route="/v1/rerank", status_code="200")),
    "unauthorized": ("ray_edje_http_requests_total", dict(application=APP, route="/v1/rerank", status_code="401")),
    "invalid": ("ray_edje_http_requests_total", dict(application=APP, route="/v1/rerank", status_code="422")),
    "forwards": ("ray_edje_forward_seconds_count", dict(application=APP, deployment="Reranker")),
    # Buckets, not _sum: Ray 2.60 rebuilds exported histograms from bucket counts, so _sum is approximate.
    "pairs_le4": ("ray_edje_forward_batch_pairs_bucket", dict(application=APP, deployment="Reranker", le="4.0")),
    "gathers": ("ray_edje_gather_seconds_count", dict(application=APP, deployment="Reranker", inline="false")),
    "searches": ("ray_edje_first_stage_seconds_count", dict(application=APP, deployment="FirstStage", kind="text")),
}


def series(samples: list) -> dict:
    return {key: total(samples, name, **labels) for key, (name, labels) in SERIES.items()}


def read(port: int) -> dict:
    return series(scrape(port))


def settled(port: int, quiet_s: float = 3.0, timeout_s: float = 60.0) -> dict:
    """The series once two reads quiet_s apart agree: every earlier request is in them (export is periodic)."""
    deadline, last = time.time() + timeout_s, read(port)
    while time.time() < deadline:
        time.sleep(quiet_s)
        now = read(port)
        if now == last:
            return now
        last = now
    raise AssertionError(f"metrics did not settle within {timeout_s} s: {last}")


@pytest.mark.slow
def test_the_config_files_deployments_section_sets_the_reranker_options(served):
    deployments = details()
    reranker = deployments["Reranker"]["deployment_config"]
    wanted = served.config["applications"][0]["deployments"][0]
    assert wanted["name"] == "Reranker" and wanted["num_replicas"] == "auto"
    auto = reranker["autoscaling_config"]
    for key in ("min_replicas", "max_replicas", "target_ongoing_requests"):
        assert auto[key] == wanted["autoscaling_config"][key], (key, auto)
    assert reranker["max_ongoing_requests"] == wanted["max_ongoing_requests"]
    assert reranker["ray_actor_options"]["num_cpus"] == wanted["ray_actor_options"]["num_cpus"]
    assert deployments["Reranker"]["target_num_replicas"] == wanted["autoscaling_config"]["min_replicas"]
    for name in ("FirstStage", "Miner", "Ingress"):
        assert deployments[name]["target_num_replicas"] == 1 and deployments[name]["status"] == "HEALTHY", name


@pytest.mark.slow
def test_readyz_is_open_and_names_every_deployment(served):
    r = requests.get(served.url + "/readyz", timeout=60)  # no token
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready",
                        "deployments": {"Ingress": "ok", "Reranker": "ok", "FirstStage": "ok", "Miner": "ok"}}
    assert requests.get(served.url + "/v1/info", timeout=60).status_code == 401  # the token is on


@pytest.mark.slow
def test_every_response_echoes_the_request_id_and_cohere_id_is_it(served, corpus):
    body = {"query": corpus.captions[1], "documents": corpus.image_ids[:3]}
    r = served.http.post(served.url + "/v2/rerank", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.raw.headers.getlist("X-Request-ID")) == 1  # Serve's proxy sets it once; the ingress adds none
    assert r.json()["id"] == r.headers["X-Request-ID"] and r.headers["X-Request-ID"]
    mine = "trace-0001"  # a client's own id is kept, in the header and as the Cohere id
    r = served.http.post(served.url + "/v2/rerank", json=body, headers={"X-Request-ID": mine}, timeout=120)
    assert r.status_code == 200 and r.headers["X-Request-ID"] == mine and r.json()["id"] == mine
    for response in (requests.post(served.url + "/v2/rerank", json=body, timeout=60),  # 401
                     served.http.post(served.url + "/v2/rerank", json={"query": "q", "documents": ["ghost"]}),  # 404
                     served.http.post(served.url + "/v2/rerank", json={"query": ""}),  # 422
                     requests.get(served.url + "/healthz", timeout=60)):
        assert len(response.raw.headers.getlist("X-Request-ID")) == 1, (response.status_code, response.headers)


@pytest.mark.slow
def test_requests_and_forward_passes_are_exported(served, corpus, metrics_port):
    from edje.serving.ingress import BATCH_HEADER

    before = settled(metrics_port)
    n, sizes = 5, [2, 3, 4, 5, 6]
    for i, size in enumerate(sizes[:n]):
        r = served.http.post(served.url + "/v1/rerank", json={"query": corpus.captions[i],
                                                                "documents": corpus.image_ids[:size]}, timeout=120)
        assert r.status_code == 200, r.text
        # One request at a time: each forward pass scored that request's pairs alone, one batch per request.
        assert int(r.headers[BATCH_HEADER]) == size
    assert requests.post(served.url + "/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 401
    assert served.http.post(served.url + "/v1/rerank", json={"query": ""}).status_code == 422
    assert served.http.post(served.url + "/v1/search", json={"query": corpus.captions[0], "top_k": 4}).status_code == 200
    want = {**before, "ok": before["ok"] + n, "unauthorized": before["unauthorized"] + 1,
            "invalid": before["invalid"] + 1, "forwards": before["forwards"] + n + 1,  # + the search's rerank
            "pairs_le4": before["pairs_le4"] + sum(s <= 4 for s in sizes) + 1, "gathers": before["gathers"] + n + 1,
            "searches": before["searches"] + 1}
    # A gauge is exported only while its replica re-reports it (Ray keeps one for two report intervals), so a loaded
    # machine may scrape between reports: poll for it as for the counters.
    want_rows = {"Reranker": len(corpus.image_ids), "FirstStage": len(corpus.image_ids)}
    deadline, got, rows = time.time() + 90, None, None
    while time.time() < deadline:
        samples = scrape(metrics_port)
        got = series(samples)
        rows = {lab["deployment"]: v for name, lab, v in samples
                if name == "ray_edje_corpus_rows" and lab.get("application") == APP}
        if got == want and rows == want_rows:
            break
        time.sleep(1)
    assert got == want, {k: (got[k], want[k]) for k in want}
    assert rows == want_rows
    # Ray's own Serve series, named as docs/operations.md "Monitoring" says.
    http = [lab for name, lab, _ in samples if name == "ray_serve_num_http_requests_total"]
    assert total(samples, "ray_serve_num_http_requests_total", application=APP, status_code="200") > n, http
    assert total(samples, "ray_serve_deployment_processing_latency_ms_count", application=APP, deployment="Reranker") > 0


@pytest.mark.slow
def test_redeploying_a_new_reranker_max_replicas_restarts_no_replica(served):
    """The deployments section is not part of the application's code version (args and import path are): a change
    there updates the Reranker's autoscaling in place, and no replica, FirstStage's included, is restarted."""
    def replicas():
        return {name: sorted((r["replica_id"], r["actor_id"]) for r in d["replicas"]) for name, d in details().items()}

    before = replicas()
    assert all(before.values()), before
    config = copy.deepcopy(served.config)
    reranker = config["applications"][0]["deployments"][0]
    reranker["autoscaling_config"]["max_replicas"] += 1
    deploy(config)
    deadline = time.time() + 120
    while details()["Reranker"]["deployment_config"]["autoscaling_config"]["max_replicas"] != \
            reranker["autoscaling_config"]["max_replicas"]:
        assert time.time() < deadline, "the new max_replicas was not applied"
        time.sleep(1)
    wait_running(120)
    assert replicas() == before
    assert requests.get(served.url + "/readyz", timeout=60).status_code == 200
