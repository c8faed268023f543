"""The jobs load models by the names users pass, with HF_ENDPOINT at a loopback hub and no offline variable set.

Each job runs as a user runs it (a subprocess with its own local Ray) with the real `huggingface_hub` client:
- the encode job encodes with `--backbone hf-hub:ORG/NAME` and records name, commit and the weights' sha256;
- serving loads the backbone those tables name (the first stage embeds queries with it), from an empty cache;
- with the hub stopped and nothing cached, each job fails with one line naming the model and why;
- offline (HF_HUB_OFFLINE=1) from the cache the first runs filled, the encode job runs again with the hub down.
Pretraining from `--language-model ORG/NAME` on the hub is run by tests/test_cluster_recipe.py (the recipe's
pretraining step names a hub language model, and that test checks the commit it logs and the checkpoint it exports).
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from hub_repos import BACKBONE_REPO, LANGUAGE_MODEL_REPO, hub_environment, publish_shipped, shipped_weights_sha256
from hub_server import LoopbackHub

from edje.schemas.shipped import REPO_ROOT
from edje.schemas.token_table import read_metadata
from edje.serving.ports import free_port

pytestmark = pytest.mark.slow
BACKBONE = f"hf-hub:{BACKBONE_REPO}"
WORLD = ["--world-images", "16", "--batch-size", "16", "--shard-size", "16", "--num-cpus", "2"]


@pytest.fixture(scope="module")
def hub():
    h = LoopbackHub()
    h.start()
    h.commits = publish_shipped(h)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("hub-jobs")


def _run(cmd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *cmd], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    return proc


def _one_line(proc: subprocess.CompletedProcess, expected: str) -> None:
    """The job failed, and its error is one line (no traceback) equal to `expected`."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    lines = [line for line in proc.stderr.splitlines() if "cannot be loaded" in line]
    assert lines == [expected], proc.stderr[-5000:]


@pytest.fixture(scope="module")
def raw(hub, work):
    """Raw tables of a 16-image sample world, encoded by the backbone of an hf-hub repository."""
    env = hub_environment(hub.url, work / "hf")
    out = work / "raw"
    _ok(_run(["jobs/encode_cc12m.py", "--backbone", BACKBONE, "--output", str(out), "--world-dir",
              str(work / "world"), *WORLD], env))
    return sorted(glob.glob(str(out / "tables" / "*.parquet")))


def test_the_encode_job_encodes_with_an_hf_hub_backbone(hub, raw):
    meta = read_metadata(raw[0])
    assert (meta.backbone, meta.pretrained, meta.backbone_revision, meta.pretrained_sha256) == (
        BACKBONE, None, hub.commits[BACKBONE_REPO], shipped_weights_sha256("edje-tiny-convvit"))
    assert meta.feature_layer == "final" and not meta.backbone_random_weights  # a mean-pooled tower: final tokens
    assert (meta.num_tokens, meta.width) == (64, 128)


@pytest.fixture(scope="module")
def checkpoint(work, raw, tiny_edje_config):
    """A small random EDJE over the backbone the tables name, as the hub named it (what serving checks them against)."""
    import dataclasses

    from edje.model.edje import EDJEModel, save_checkpoint

    config = dataclasses.replace(tiny_edje_config, backbone=read_metadata(raw[0]).backbone_config())
    out = work / "edje-hub"
    save_checkpoint(EDJEModel(config).eval(), str(out))
    return out


def _compressed(checkpoint: Path, raw_table: str, out: Path) -> str:
    """A compressed int8 table of the raw table's rows through the checkpoint's adapter (what serving reads)."""
    import dataclasses

    import torch

    from edje.model.edje import load_checkpoint
    from edje.schemas.token_table import build_table, decode_tokens, read_token_table, vector_matrix, write_token_table

    table, meta = read_token_table(raw_table)
    model = load_checkpoint(str(checkpoint)).eval()
    with torch.no_grad():
        tokens = model.adapter(torch.from_numpy(decode_tokens(table, meta))).numpy()
    cmeta = dataclasses.replace(meta, kind="compressed", num_tokens=tokens.shape[1], width=tokens.shape[2],
                                quantization="int8", adapter_hash=model.adapter_hash())
    write_token_table(build_table(cmeta, table.column("image_id").to_pylist(), tokens,
                                  vector_matrix(table.column("image_embedding"))), str(out))
    return str(out)


@pytest.fixture(scope="module")
def compressed(work, raw, checkpoint) -> str:
    return _compressed(checkpoint, raw[0], work / "compressed.parquet")


def test_serving_loads_the_backbone_the_tables_name(hub, work, raw, checkpoint, compressed):
    tables = compressed
    env = hub_environment(hub.url, work / "hf-serve")  # an empty cache: the weights come from the hub
    env.pop("EDJE_API_TOKEN", None)
    port = free_port()
    log = work / "serve.log"
    hub.requests.clear()
    cmd = [sys.executable, "jobs/serve.py", "--address", "local", "--checkpoint", str(checkpoint), "--tokens", tables,
           "--captions", raw[0], "--port", str(port), "--block"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.time() + 540
        while time.time() < deadline and '{"application"' not in log.read_text():
            assert proc.poll() is None, log.read_text()[-5000:]
            time.sleep(2)
        url = f"http://127.0.0.1:{port}"
        table = read_metadata(tables)
        ids, captions = _ids_and_captions(raw[0])
        r = requests.post(url + "/v1/search", json={"query": captions[0], "top_k": 8, "top_n": 3}, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == 3 and r.json()["reranked"]
        r = requests.post(url + "/v1/rerank", json={"query": captions[0], "documents": ids[:4]}, timeout=120)
        assert r.status_code == 200 and len(r.json()["results"]) == 4, r.text
        # The first stage rebuilt the tables' backbone from the hub, at the commit they record.
        commit = table.backbone_revision
        assert ("GET", f"/{BACKBONE_REPO}/resolve/{commit}/open_clip_model.safetensors") in hub.requests
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _ids_and_captions(raw_table: str):
    from edje.schemas.token_table import read_token_table

    table, _ = read_token_table(raw_table, columns=["image_id", "caption"])
    return table.column("image_id").to_pylist(), table.column("caption").to_pylist()


def test_with_the_hub_down_and_nothing_cached_each_job_fails_with_one_line(work, raw, checkpoint, compressed,
                                                                        refused_url):
    # A hub that does not answer, and an empty cache. Its port stays bound (not listening) while the jobs run: a
    # stopped server's port is free, and one of the Ray processes these jobs start could bind it and answer.
    env = hub_environment(refused_url, work / "hf-empty")
    cache = work / "hf-empty" / "hub"
    down = f"the hub ({refused_url}) could not be reached and the hub cache ({cache}) holds no copy of it"
    # The three side by side: huggingface_hub retries a refused connection for about 23 s before giving up.
    jobs = {
        f"[encode] backbone {BACKBONE} cannot be loaded: {down}":
            ["jobs/encode_cc12m.py", "--backbone", BACKBONE, "--output", str(work / "raw-down"),
             "--world-dir", str(work / "world"), *WORLD],
        f"[train] language model {LANGUAGE_MODEL_REPO} cannot be loaded: {down}":
            ["jobs/pretrain.py", "--tables", str(work / "raw" / "tables"), "--storage-path", str(work / "t2"),
             "--name", "down", "--language-model", LANGUAGE_MODEL_REPO],
        f"[serve] backbone {BACKBONE} cannot be loaded: {down}":
            ["jobs/serve.py", "--address", "local", "--checkpoint", str(checkpoint), "--tokens", compressed,
             "--port", str(free_port())],
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        runs = {expected: pool.submit(_run, cmd, env) for expected, cmd in jobs.items()}
    for expected, run in runs.items():
        _one_line(run.result(), expected)


def test_offline_from_the_cache_the_first_runs_filled(hub, work, raw):
    hub.stop()
    env = {**hub_environment(hub.url, work / "hf"), "HF_HUB_OFFLINE": "1"}
    out = work / "raw-offline"
    _ok(_run(["jobs/encode_cc12m.py", "--backbone", BACKBONE, "--output", str(out), "--world-dir", str(work / "world"),
              *WORLD], env))
    again = read_metadata(sorted(glob.glob(str(out / "tables" / "*.parquet")))[0])
    assert again == read_metadata(raw[0])  # the same name, commit and weights, from the cache alone
