"""docs/cluster.md "Going to a real cluster", run as written: the commands between `<!-- cluster:recipe -->` and the end of its
bash block, each submitted with `ray job submit` to a two-node Ray cluster on loopback (`ray start --head`, then
`ray start --address` with its own resources; token auth as the docs say), with `s3://bucket` on moto's S3
server and the hub on loopback. Each command's output is the next one's input on that storage: raw tables,
pretraining (exported to the storage path), distillation, compressed tables (jobs/compress.py: the raw tables through
the student's adapter), serving. It ends with one
`POST /v1/rerank` and one `POST /v1/search` answered from the served tables. Along the way it checks what the hub
gave: the raw tables pin the backbone's commit and weights, and pretraining logs the language model's commit and
exports it cut to one layer with its tokenizer (tests/test_hub_jobs.py has the hub's failure paths).

Sizes are scaled down by the substitutions in SCALED_DOWN, each of which must match docs/cluster.md (it lists
them); nothing else of the commands changes. The nodes' environment carries what a user's would: AWS credentials
and `AWS_ENDPOINT_URL` (moto), `HF_ENDPOINT` and `HF_HOME` (the loopback hub), `RAY_AUTH_MODE=token` and the token.
The same cluster shows that a shell without `RAY_AUTH_MODE=token` is refused.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from hub_repos import BACKBONE_REPO, LANGUAGE_MODEL_REPO, hub_environment, publish_shipped, shipped_weights_sha256
from hub_server import LoopbackHub
from ray_nodes import our_processes

from edje.serving.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RECIPE_DOC = ROOT / "docs" / "cluster.md"  # the recipe's home (the README links to it)
MARKER = "<!-- cluster:recipe -->"
IMAGES = 24
SERVE_PORT = free_port()
# The doc's text -> the test's, in the order its "What it scales down" names them; each must occur.
SCALED_DOWN = [
    ("--backbone ViT-L-16-SigLIP2-384 --pretrained webli", "--backbone hf-hub:edje-ray/tiny-convvit"),
    ("--language-model microsoft/MiniLM-L12-H384-uncased", "--language-model edje-ray/minilm-l6 --encoder-layers 1"),
    ("--num-workers 16 --use-gpu", "--num-workers 2 --batch-size 8 --k 2 --max-steps 2 --warmup-steps 1 "
                                   "--checkpoint-every 2 --adapter-hidden 64"),
    ("--num-queries 64", "--num-queries 4 --adapter-heads 4"),
    ("--gpus-per-worker 1 --concurrency 16", "--gpus-per-worker 0 --concurrency 1"),
    ("--reranker-replicas 4 --reranker-gpus 1", f"--reranker-replicas 1 --reranker-gpus 0 --port {SERVE_PORT}"),
]


def recipe(doc: str) -> list:
    """The commands of the bash block after the marker: continuation lines joined, comments dropped."""
    lines = doc[doc.index(MARKER) + len(MARKER):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("```"))
    body = []
    for line in lines[start + 1:]:
        if line.strip().startswith("```"):
            break
        body.append(line.strip())
    commands, current = [], ""
    for line in body:
        if not line or line.startswith("#"):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(" ".join(current.split()))
            current = ""
    return commands


def scaled_down(commands: list) -> list:
    """The commands with SCALED_DOWN applied; a substitution that matches nothing is the doc moving away."""
    out = list(commands)
    for doc_text, ours in SCALED_DOWN:
        hits = sum(c.count(doc_text) for c in out)
        assert hits, f"the recipe in {RECIPE_DOC.name} no longer says {doc_text!r}: update SCALED_DOWN and its list"
        out = [c.replace(doc_text, ours) for c in out]
    return out


def test_the_recipe_is_one_chain():
    """Every s3:// path a command reads was written by an earlier command (or is the input list), and every
    scaling-down substitution still finds its text."""
    commands = recipe(RECIPE_DOC.read_text())
    scaled_down(commands)
    assert [re.search(r"python (jobs/\w+\.py)", c).group(1) for c in commands] == [
        "jobs/encode_cc12m.py", "jobs/pretrain.py", "jobs/distill.py", "jobs/compress.py", "jobs/serve.py"]
    written = {"s3://bucket/cc12m.tsv"}
    for c in commands:
        args = shlex.split(c)
        reads = [args[i + 1] for i, a in enumerate(args[:-1])
                 if a in ("--input", "--tables", "--teacher", "--adapter", "--checkpoint", "--tokens", "--init")
                 and args[i + 1].startswith("s3://")]
        for path in reads:
            assert any(path == w or path.startswith(w.rstrip("/") + "/") for w in written), (c, path, written)
        outs = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--output", "--export")]
        written |= {p + "/tables" for p in outs if "--output" in args} | set(outs)  # the table jobs' layout


# ----------------------------------------------------------------------------- the world the recipe runs in
def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Moto's S3 with `bucket` holding the url list of a sample world served on loopback, and the loopback hub."""
    import boto3
    from moto.server import ThreadedMotoServer

    from edje.sampleworld.server import serve_directory
    from edje.sampleworld.world import WorldConfig, generate, url_rows

    root = tmp_path_factory.mktemp("recipe")
    generate(WorldConfig(seed=4545, n_train=IMAGES, n_val=0, n_test=0), root / "world")
    images = serve_directory(root / "world")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    hub = LoopbackHub()
    hub.start()
    commits = publish_shipped(hub)
    try:
        host, port = moto.get_host_and_port()
        s3 = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": s3}
        client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket="bucket")
        rows = url_rows(root / "world", images.base_url)
        tsv = "url\tcaption\timage_id\n" + "".join(f"{r['url']}\t{r['caption']}\t{r['image_id']}\n" for r in rows)
        client.put_object(Bucket="bucket", Key="cc12m.tsv", Body=tsv.encode())
        token = secrets.token_hex(32)
        env = {**hub_environment(hub.url, root / "hf"), **creds, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env.pop("EDJE_API_TOKEN", None)
        yield {"root": root, "env": env, "rows": rows, "s3": client, "hub": hub, "commits": commits}
    finally:
        hub.stop()
        moto.stop()
        images.stop()


@pytest.fixture(scope="module")
def cluster(world):
    """`ray start --head` and a second `ray start --address` with its own resources, both on loopback, token auth;
    yields the dashboard url that `ray job submit` talks to."""
    temp = tempfile.mkdtemp(prefix="rcr", dir="/tmp")  # short: Ray's unix sockets live there
    env = world["env"]
    gcs, dash = free_port(), free_port()
    # Every default port is named: another Ray on this machine may hold it.
    head = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
            "--num-cpus", "2", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port",
            str(dash), "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
            "--object-store-memory", str(400 * 1024 * 1024), "--temp-dir", temp]
    second = [str(BIN / "ray"), "start", "--block", "--address", f"127.0.0.1:{gcs}", "--node-ip-address", "127.0.0.1",
              "--num-cpus", "2", "--resources", json.dumps({"second_node": 1}), "--node-manager-port", str(free_port()),
              "--object-manager-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
              "--dashboard-agent-grpc-port", str(free_port()), "--metrics-export-port", str(free_port()),
              "--runtime-env-agent-port", str(free_port()), "--object-store-memory", str(400 * 1024 * 1024)]
    logs = [open(Path(temp) / "head.log", "w"), open(Path(temp) / "second.log", "w")]
    procs = [subprocess.Popen(head, env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        deadline = time.time() + 240
        while not _port_open(dash) and time.time() < deadline:
            assert procs[0].poll() is None, (Path(temp) / "head.log").read_text()[-4000:]
            time.sleep(1)
        procs.append(subprocess.Popen(second, env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))
        url = f"http://127.0.0.1:{dash}"
        while time.time() < deadline and len(_alive_nodes(url, env)) < 2:
            assert all(p.poll() is None for p in procs), [(Path(temp) / n).read_text()[-3000:] for n in ("head.log", "second.log")]
            time.sleep(2)
        nodes = _alive_nodes(url, env)
        assert len(nodes) == 2 and any(n.get("second_node") for n in nodes), nodes
        yield url
    finally:
        # Killed outright: the test is over and nothing on these nodes needs a clean stop (SIGTERM to both
        # nodes took 31 s, one after the other 63 s).
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for log in logs:
            log.close()
        for pid in our_processes(temp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def _alive_nodes(url: str, env: dict) -> list:
    """Total resources of the cluster's alive nodes (`ray list nodes`, token auth); empty while it is not up."""
    proc = subprocess.run([str(BIN / "ray"), "list", "nodes", "--address", url, "--format", "json"], env=env,
                          capture_output=True, text=True, timeout=120)
    try:
        nodes = json.loads(proc.stdout)
    except ValueError:
        return []
    return [n.get("resources_total", {}) for n in nodes if n.get("state") == "ALIVE"]


@pytest.mark.slow
def test_a_submit_without_auth_mode_is_refused(world, cluster):
    """The failure docs/jobs.md's auth sentence prevents: no RAY_AUTH_MODE=token in the submitting shell (the
    head enables token auth; `ray job` sends the token only when its own environment says so)."""
    bare = {k: v for k, v in world["env"].items() if not k.startswith("RAY_AUTH_")}
    proc = subprocess.run([str(BIN / "ray"), "job", "list", "--address", cluster], env=bare, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "Authentication required" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_the_cluster_recipe_runs_as_written(world, cluster):
    commands = scaled_down(recipe(RECIPE_DOC.read_text()))
    env = {**world["env"], "RAY_ADDRESS": cluster}
    outputs = {}
    for command in commands:
        started = time.time()
        proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "succeeded" in out, f"{command}\n{out[-8000:]}"
        outputs[re.search(r"python jobs/(\w+)\.py", command).group(1)] = out
        print(f"{time.time() - started:6.1f} s  {command[:120]}", flush=True)
    s3 = world["s3"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="bucket")["Contents"]}
    for written in ("raw/summary.json", "models/edje-local/config.json", "models/edje-local/tokenizer/tokenizer.json",
                    "models/edje-c64/model.safetensors", "c64-int8/summary.json"):
        assert written in keys, sorted(keys)[:50]
    _check_what_the_hub_gave(s3, keys, world["commits"], outputs["pretrain"], world["root"])
    summary = json.loads(s3.get_object(Bucket="bucket", Key="c64-int8/summary.json")["Body"].read())
    assert summary["complete"] and summary["images_ok"] == IMAGES, summary

    url = f"http://127.0.0.1:{SERVE_PORT}"
    rows = world["rows"]
    r = requests.post(f"{url}/v1/rerank", json={"query": rows[0]["caption"],
                                               "documents": [x["image_id"] for x in rows[:5]]}, timeout=120)
    assert r.status_code == 200 and len(r.json()["results"]) == 5, r.text
    r = requests.post(f"{url}/v1/search", json={"query": rows[1]["caption"], "top_k": 10, "top_n": 3}, timeout=120)
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert len(hits) == 3 and r.json()["reranked"] and {h["image_id"] for h in hits} <= {x["image_id"] for x in rows}


def _check_what_the_hub_gave(s3, keys: set, commits: dict, pretrain_output: str, tmp: Path) -> None:
    """The raw tables name the hub's backbone at its commit with the shipped weights' sha256; pretraining logged the hub
    language model's commit and exported MiniLM's width cut to one layer, with its tokenizer inside."""
    import dataclasses

    from edje.schemas.token_table import read_metadata

    part = tmp / "raw-part.parquet"
    part.write_bytes(s3.get_object(Bucket="bucket", Key=min(k for k in keys if k.startswith("raw/tables/")
                                                              and k.endswith(".parquet")))["Body"].read())
    meta = read_metadata(str(part))
    assert (meta.backbone, meta.pretrained, meta.backbone_revision, meta.pretrained_sha256) == (
        f"hf-hub:{BACKBONE_REPO}", None, commits[BACKBONE_REPO], shipped_weights_sha256("edje-tiny-convvit"))
    assert f"language model {LANGUAGE_MODEL_REPO} at {commits[LANGUAGE_MODEL_REPO]}" in pretrain_output
    config = json.loads(s3.get_object(Bucket="bucket", Key="models/edje-local/config.json")["Body"].read())
    assert config["config"]["backbone"] == dataclasses.asdict(meta.backbone_config())  # the backbone as loaded, pinned
    assert (config["bert_config"]["num_hidden_layers"], config["bert_config"]["hidden_size"]) == (1, 384)  # MiniLM's, cut
