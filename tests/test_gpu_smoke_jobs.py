"""The GPU smoke through the jobs as subprocesses (needs Ray), on the --device of tests/test_gpu_smoke.py:
jobs/encode_cc12m.py (raw), jobs/pretrain.py [--use-gpu], jobs/encode_cc12m.py --adapter (int8), and jobs/serve.py
[--reranker-gpus 1] answering one /v1/rerank request. Slow, and run only when asked:

    .venv/bin/pytest -q tests/test_gpu_smoke_jobs.py --device cuda --gpu-smoke-jobs

The ordinary suite already runs each job end to end on the CPU (tests/test_encode_e2e.py, tests/test_train_ray.py,
tests/test_serving_startup.py); here the same chain runs once with the GPU given to each job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import pytest
from gpu_smoke_pieces import SMALL_BERT, TRAIN_STEPS

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"

pytestmark = pytest.mark.slow


@dataclass
class JobsWork:
    """The jobs' shared folder, whether each job is given a GPU, and what each job leaves for the next."""

    root: Path
    gpu: bool
    done: set = field(default_factory=set)

    def need(self, job: str) -> None:
        """Skip, naming the earlier job, when it failed or did not run."""
        if job not in self.done:
            pytest.skip(f"needs the output of {job}, which failed or did not run")

    def run(self, cmd: List[object], timeout: int) -> str:
        """Run a job to its end; its output, or a failure with its tail."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{Path(str(cmd[1])).name} exited {proc.returncode}: {text[-2000:]}"
        return text

    def encode_cmd(self, output: Path, *extra) -> list:
        """jobs/encode_cc12m.py over the jobs' own sample world, one GPU per encoder actor where given one."""
        cmd = [sys.executable, JOBS / "encode_cc12m.py", "--output", output, "--world-dir", self.root / "world",
               "--world-images", "48", "--batch-size", "16", "--shard-size", "24", "--address", "local", *extra]
        return cmd + (["--gpus-per-worker", "1", "--concurrency", "1"] if self.gpu else [])


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    """The jobs' work folder; skips unless --gpu-smoke-jobs is given, fails when Ray is missing."""
    if not request.config.getoption("--gpu-smoke-jobs"):
        pytest.skip("the jobs as subprocesses run with --gpu-smoke-jobs (the suite tests each job end to end)")
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("--gpu-smoke-jobs needs Ray, which is not importable", pytrace=False)
    device = request.getfixturevalue("torch_device")  # after the skip: without the option, no device is asked for
    return JobsWork(tmp_path_factory.mktemp("gpu-smoke-jobs"), gpu=device.type == "cuda")


def test_encode_raw_job(jobs):
    jobs.run(jobs.encode_cmd(jobs.root / "raw"), 900)
    summary = json.loads((jobs.root / "raw" / "summary.json").read_text())
    assert summary["complete"] and summary["images_ok"] > 40, f"summary {summary}"
    jobs.done.add("test_encode_raw_job")
    print(f"encode raw: {summary['images_ok']} images, {summary.get('images_per_second')} img/s")


def test_pretrain_job(jobs):
    jobs.need("test_encode_raw_job")
    export = jobs.root / "export"
    cmd = [sys.executable, JOBS / "pretrain.py", "--tables", jobs.root / "raw" / "tables", "--storage-path",
           jobs.root / "train", "--name", "smoke", "--export", export, "--num-workers", "1", "--batch-size", "8",
           "--k", "2", "--max-steps", str(TRAIN_STEPS), "--checkpoint-every", str(TRAIN_STEPS), "--warmup-steps", "5",
           "--adapter", "compressed", "--num-queries", "16", "--adapter-hidden", "128", "--adapter-heads", "4",
           "--random-bert", *[f"{k}={v}" for k, v in SMALL_BERT]]
    text = jobs.run(cmd + (["--use-gpu"] if jobs.gpu else []), 900)
    assert (export / "config.json").exists(), "no exported checkpoint: " + text[-1000:]
    jobs.done.add("test_pretrain_job")


def test_encode_int8_job(jobs):
    jobs.need("test_pretrain_job")
    jobs.run(jobs.encode_cmd(jobs.root / "int8", "--adapter", jobs.root / "export", "--quant", "int8"), 900)
    summary = json.loads((jobs.root / "int8" / "summary.json").read_text())
    assert summary["complete"], f"summary {summary}"
    jobs.done.add("test_encode_int8_job")
    print(f"encode int8: {summary['images_ok']} images, {summary.get('images_per_second')} img/s")


def test_serve_job_answers_a_request(jobs):
    import pyarrow.parquet as pq

    from edje.serving.ports import free_port

    jobs.need("test_encode_int8_job")
    port, log_path = free_port(), jobs.root / "serve.log"
    tables = sorted(str(p) for p in (jobs.root / "int8" / "tables").glob("*.parquet"))
    cmd = [sys.executable, JOBS / "serve.py", "--checkpoint", jobs.root / "export", "--tokens", *tables, "--address",
           "local", "--port", str(port), "--block", "--reranker-gpus", "1" if jobs.gpu else "0"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline and proc.poll() is None and '"url"' not in log_path.read_text():
                time.sleep(2)
            assert proc.poll() is None, "serve.py exited: " + log_path.read_text()[-2000:]
            ids = pq.read_table(tables[0], columns=["image_id"]).column("image_id").to_pylist()[:4]
            body = json.dumps({"query": "a red circle", "documents": ids}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/rerank", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                answer = json.loads(r.read())
            assert len(answer["results"]) == len(ids), f"answer {answer}"
            info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=60).read())
            print(f"serve: {len(ids)} documents ranked at precision {info.get('precision')}, "
                  f"{'1 GPU' if jobs.gpu else 'no GPU'}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # the job's own process group (start_new_session), nothing else
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
