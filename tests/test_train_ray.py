"""Pretraining on Ray Train over tables written by the encode pipeline: two CPU workers, DDP,
checkpoints every N steps, and a run killed mid-way that resumes from its checkpointed step."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRETRAIN = [sys.executable, str(ROOT / "jobs" / "pretrain.py")]


@pytest.fixture(scope="module")
def pipeline_tables(ray_local, tmp_path_factory):
    """Raw token tables of a 48-image sample world, written by the encode pipeline (jobs/encode_cc12m.py)."""
    from pipeline.job import run_encode_job
    from schemas.encode_job import EncodeJobConfig

    root = tmp_path_factory.mktemp("trainworld")
    summary = run_encode_job(EncodeJobConfig(output=str(root / "enc"), world_dir=str(root / "world"),
                                             world_images=48, batch_size=16, shard_size=24))
    assert summary["complete"] and summary["images_ok"] == summary["images_in"] > 40
    return root / "enc" / "tables"


def _checkpoints(storage: Path, name: str):
    """(step, dir) of every complete checkpoint of a run."""
    found = []
    for d in sorted((storage / name).glob("checkpoint_*")):
        cfg = d / "config.json"
        if cfg.exists() and (d / "model.safetensors").exists() and (d / "optimizer.pt").exists():
            found.append((json.loads(cfg.read_text())["position"]["step"], d))
    return sorted(found)


def test_two_worker_pretrain_checkpoints_and_resumes_after_kill(ray_local, pipeline_tables, tmp_path):
    storage = tmp_path / "runs"
    address = ray_local.get_runtime_context().gcs_address
    args = PRETRAIN + [
        "--tables", str(pipeline_tables), "--storage-path", str(storage), "--name", "r1",
        "--num-workers", "2", "--cpus-per-worker", "0.5", "--batch-size", "4", "--k", "2",
        "--max-steps", "6", "--checkpoint-every", "2", "--log-every", "1", "--warmup-steps", "2",
        "--adapter", "compressed", "--num-queries", "8", "--adapter-hidden", "64", "--adapter-heads", "4",
        "--random-bert", "hidden_size=64", "num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=128",
        "--ray-address", address,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log1 = open(tmp_path / "run1.log", "w")
    first = subprocess.Popen(args, cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 420
        while time.time() < deadline and not _checkpoints(storage, "r1") and first.poll() is None:
            time.sleep(1)
        assert _checkpoints(storage, "r1"), (tmp_path / "run1.log").read_text()[-4000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # a hard kill: no clean shutdown, no final checkpoint
        first.wait()
        log1.close()
    killed_at = _checkpoints(storage, "r1")[-1][0]
    text1 = (tmp_path / "run1.log").read_text()
    assert killed_at >= 2
    # Losses per head and ITM accuracy are reported as it trains.
    row = json.loads(next(line[line.index("{"):] for line in text1.splitlines() if '"loss_itm"' in line and line.strip().endswith("}")))
    assert {"loss_itm", "loss_mlm", "loss_recovery", "itm_acc", "step", "lr"} <= set(row)

    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    text2 = second.stdout + second.stderr
    assert second.returncode == 0, text2[-4000:]
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+)", text2)]
    assert resumed and min(resumed) >= killed_at and min(resumed) < 6, text2[-4000:]
    assert f"resumed from step 0" not in text2
    final_step, final_dir = _checkpoints(storage, "r1")[-1]
    assert final_step == 6
    # The checkpoint inside is our format: it loads as an EDJE model.
    from model.edje import load_checkpoint
    model = load_checkpoint(str(final_dir))
    assert model.config.adapter.num_queries == 8 and model.encoder.hidden_size == 64
