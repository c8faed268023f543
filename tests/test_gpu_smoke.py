"""benchmarks/gpu_smoke.py on the CPU (--device cpu --quick): every stage of the GPU smoke passes, and
its device arguments (evaluation, first stage, miner, backbone training, the CLIs) resolve as documented.
No GPU is needed: the same stages run on the CPU, where the device-vs-CPU checks are exact."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "benchmarks" / "gpu_smoke.py"
STAGES = ["encode-raw", "train", "train-backbone", "encode-int8", "evaluate", "serve"]


def test_gpu_smoke_passes_every_stage_on_the_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SMOKE), "--device", "cpu", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    report = json.loads(out.read_text())
    assert [s["stage"] for s in report["stages"]] == STAGES  # --quick: no throughput figures, no jobs
    assert all(s["status"] == "PASS" for s in report["stages"]), report["stages"]
    for stage in STAGES:
        assert f"[gpu-smoke] PASS {stage}" in proc.stdout
    assert f"{len(STAGES)}/{len(STAGES)} stages passed" in proc.stdout
    assert report["figures"] == {}


def test_gpu_smoke_refuses_cuda_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    proc = subprocess.run([sys.executable, str(SMOKE), "--device", "cuda", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "FAIL setup" in proc.stdout, proc.stdout + proc.stderr


def test_device_rule():
    from edje.model.device import pick_device

    assert pick_device(None) == pick_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            pick_device("cuda")


def test_clis_take_a_device(capsys, tmp_path):
    from edje.evaluation.rerank_eval import EvalConfig
    from edje.jobs.evaluate import main as evaluate_main
    from edje.jobs.serve import config_from_args, parse
    from edje.jobs.train_backbone import main as train_backbone_main

    assert EvalConfig(annotations="a.json", tokens=["t"], output="o", backbone_only=True).device is None
    (tmp_path / "t.parquet").write_bytes(b"")
    cfg = config_from_args(parse(["--checkpoint", "c", "--tokens", str(tmp_path / "t.parquet"), "--first-stage-gpus", "1",
                                  "--miner-gpus", "0.5", "--reranker-gpus", "1"]))
    assert (cfg.first_stage.num_gpus, cfg.miner.num_gpus, cfg.reranker.num_gpus) == (1, 0.5, 1)
    # Replica counts are left to Serve (or a config file's `deployments:`) unless a flag sets them.
    assert cfg.first_stage.num_replicas is None and cfg.reranker.max_ongoing_requests == 256
    for main in (evaluate_main, train_backbone_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "--device" in capsys.readouterr().out
