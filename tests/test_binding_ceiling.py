"""benchmarks/binding_ceiling.py end to end at toy size: world -> perfect-token tables -> the curriculum's
two pretraining phases on Ray Train -> evaluation, and the checkpoint says what it was trained on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _on(ray_local) -> dict:
    """The environment that sends the script's training jobs to this module's Ray instance (RAY_ADDRESS, as on a
    cluster): one Ray start for the module instead of one per training phase."""
    return {**os.environ, "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}


def test_ceiling_runs_through_the_jobs_on_perfect_tokens(tmp_path, ray_local):
    work = tmp_path / "ceiling"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "binding_ceiling.py"), "--seed", "5", "--workdir", str(work),
           "--n-train", "48", "--n-val", "16", "--n-single", "16", "--phase1-steps", "2", "--phase1-batch-size", "8",
           "--steps", "2", "--batch-size", "8", "--warmup-steps", "1", "--cpus", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=_on(ray_local))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    metrics = json.loads((work / "eval" / "metrics.json").read_text())
    for d in ("t2i", "i2t"):
        fam = metrics[d]["within_family"]
        assert fam["reranked"]["queries"] > 0 and set(fam["by_kind"]["reranked"]) <= {
            "colour", "shape", "size", "relation", "two swaps"}
    config = json.loads((work / "model" / "config.json").read_text())
    # Trained on perfect tokens: its backbone is the scene-token source, so no job can take it for a reranker
    # of backbone tokens; it started from phase 1 and kept the recipe's binding levers.
    assert config["config"]["backbone"]["name"] == "sampleworld-scene-tokens"
    assert config["config"]["encoder"]["word_context"] == 3
    times = json.loads((work / "times.json").read_text())
    assert {"world", "world1", "pretrain_phase1", "pretrain", "evaluate"} <= set(times)


def test_a_reranker_is_retrained_on_a_backbones_tokens_from_a_shipped_encoder(tmp_path, ray_local):
    # How a new backbone ships with its reranker: the shipped joint encoder, a fresh adapter for the new tokens.
    work, source = tmp_path / "retrain", ROOT / "checkpoints" / "edje-local-bind"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "binding_ceiling.py"), "--seed", "5", "--workdir", str(work),
           "--tokens", "backbone", "--init-encoder-from", str(source), "--n-train", "48", "--n-val", "16",
           "--steps", "2", "--batch-size", "8", "--warmup-steps", "1", "--cpus", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=_on(ray_local))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    config = json.loads((work / "model" / "config.json").read_text())["config"]
    shipped = json.loads((source / "config.json").read_text())["config"]
    assert config["encoder"]["bert_config"]["hidden_size"] == shipped["encoder"]["bert_config"]["hidden_size"]
    assert config["encoder"]["word_context"] == shipped["encoder"]["word_context"] == 3
    assert config["backbone"]["name"] == "edje-tiny-convvit" and config["adapter"]["kind"] == "local"
    times = json.loads((work / "times.json").read_text())
    assert "pretrain_phase1" not in times and {"pretrain", "evaluate"} <= set(times)
