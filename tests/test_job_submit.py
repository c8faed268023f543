"""The README's door to a cluster, as users take it: `ray start --head`, then `ray job submit --working-dir .`
of jobs/encode_cc12m.py (a 64-image sample world) and of a short jobs/pretrain.py on the tables it wrote.

Ray 2.60 guards the Jobs API with token authentication: the head enables it when RAY_AUTH_MODE=token (or when a
token already sits in ~/.ray/auth_token), and `ray job submit` sends the token only when its own environment says
RAY_AUTH_MODE=token. The token here is a fresh one in RAY_AUTH_TOKEN (which takes precedence over the file), so the
test neither reads nor writes the user's ~/.ray."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ray_nodes import our_processes

from edje.serving.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")
IMAGES = 64
# What `--working-dir .` would carry besides the code: the venv, run outputs and git history stay home.
RUNTIME_ENV = {"excludes": ["/.venv/", "/runs/", "/.git/"]}



def auth_env(token: str) -> dict:
    """The environment the README asks for, on the head and in the submitting shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def head():
    """A head node in its own temp dir (short: Ray's unix sockets live there); yields (dashboard url, env, token)."""
    temp = tempfile.mkdtemp(prefix="rjs", dir="/tmp")
    token = secrets.token_hex(32)
    env = auth_env(token)
    dash = free_port()
    # Every fixed default port is named: another Ray on this machine may hold 10001 or 52365 already.
    cmd = [RAY, "start", "--head", "--block", "--port", str(free_port()), "--num-cpus", "2",
           "--include-dashboard", "true", "--dashboard-port", str(dash),
           "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
           "--object-store-memory", str(512 * 1024 * 1024), "--temp-dir", temp]
    log = open(Path(temp) / "ray_start.log", "w")
    # --block keeps the node's lifetime tied to this process: SIGTERM to it stops exactly this head, where
    # `ray stop` would stop every Ray on the machine (it takes no address or temp dir).
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", dash), timeout=1):
                    break
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, (Path(temp) / "ray_start.log").read_text()[-4000:]
        time.sleep(2)  # the dashboard's job module comes up just after the port opens
        yield url, env, token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        for pid in our_processes(temp):  # anything that outlived the head's own shutdown
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def submit(head, job_id: str, *job_args: str) -> None:
    """`ray job submit --working-dir <repo> -- <venv python> jobs/...` through the CLI, as the README does."""
    url, env, _ = head
    # The venv is not uploaded, so the entrypoint names its interpreter by absolute path.
    cmd = [RAY, "job", "submit", "--address", url, "--working-dir", str(ROOT),
           "--runtime-env-json", json.dumps(RUNTIME_ENV), "--submission-id", job_id, "--no-wait",
           "--", sys.executable, *job_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def wait_for(head, job_id: str, timeout: float) -> str:
    """Poll the Jobs API until the job ends; its logs. Fails with the logs unless it SUCCEEDED."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    url, _, token = head
    # An explicit bearer header: this process's own Ray auth mode is whatever earlier tests left behind.
    client = JobSubmissionClient(url, headers={"Authorization": f"Bearer {token}"})
    deadline = time.time() + timeout
    status = client.get_job_status(job_id)
    while not status.is_terminal() and time.time() < deadline:
        time.sleep(2)
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)
    if not status.is_terminal():
        client.stop_job(job_id)
    assert status == JobStatus.SUCCEEDED, f"{job_id}: {status}\n{logs[-6000:]}"
    return logs


def test_submit_without_auth_mode_is_refused(head):
    """The failure the README's auth sentence prevents: no RAY_AUTH_MODE=token in the submitting shell."""
    url, env, _ = head
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH_")}
    proc = subprocess.run([RAY, "job", "list", "--address", url], env=bare, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Authentication required" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def encoded(head, tmp_path_factory):
    """The encode job's output folder (raw tables of a 64-image sample world)."""
    out = tmp_path_factory.mktemp("submit")
    submit(head, "encode-sw", "jobs/encode_cc12m.py", "--output", str(out / "enc"), "--world-dir", str(out / "world"),
           "--world-images", str(IMAGES), "--batch-size", "16", "--shard-size", "32")
    logs = wait_for(head, "encode-sw", timeout=420)
    return out, logs


def test_encode_job_writes_raw_tables(encoded):
    from edje.schemas.shipped import DEFAULT_BACKBONE
    from edje.schemas.token_table import read_token_tables

    out, logs = encoded
    assert "[encode] summary:" in logs
    summary = json.loads((out / "enc" / "summary.json").read_text())
    assert summary["complete"] and summary["images_in"] == summary["images_ok"] == IMAGES, summary
    assert summary["failed"] == {} and summary["shards"] == 2
    tables = sorted(str(p) for p in (out / "enc" / "tables").glob("*.parquet"))
    assert len(tables) == 2 and sorted(summary["tables"]) == tables
    table, meta = read_token_tables(tables)
    assert table.num_rows == IMAGES and len(set(table.column("image_id").to_pylist())) == IMAGES
    assert meta.kind == "raw" and meta.backbone == DEFAULT_BACKBONE and meta.adapter_hash is None
    assert {"caption", "text_embedding"} <= set(table.column_names)


def test_pretrain_job_on_the_encoded_tables(head, encoded):
    from edje.model.edje import load_checkpoint

    out, _ = encoded
    export = out / "export"
    submit(head, "pretrain-sw", "jobs/pretrain.py", "--tables", str(out / "enc" / "tables"),
           "--storage-path", str(out / "train"), "--name", "sub", "--export", str(export),
           "--num-workers", "1", "--cpus-per-worker", "0.5", "--batch-size", "4", "--k", "2",
           "--max-steps", "2", "--checkpoint-every", "2", "--log-every", "1", "--warmup-steps", "1",
           "--adapter", "compressed", "--num-queries", "8", "--adapter-hidden", "64", "--adapter-heads", "4",
           "--random-bert", "hidden_size=64", "num_hidden_layers=1", "num_attention_heads=2",
           "intermediate_size=128")
    logs = wait_for(head, "pretrain-sw", timeout=480)
    assert f"exported to {export}" in logs, logs[-3000:]
    # The training loop's progress reaches the job's log, total and ETA included.
    assert re.search(r"step 2/2 \(100%\), [\d.]+ s/step, eta 0:00:00 \{", logs), logs[-3000:]
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    model = load_checkpoint(str(export))
    assert model.config.adapter.num_queries == 8 and model.encoder.hidden_size == 64
