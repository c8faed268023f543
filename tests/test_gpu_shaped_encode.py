"""The GPU-shaped simulation runs the real encode job with a fixed-rate stand-in actor, labelled as such,
and the costed plan takes its CPU per image."""
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_simulation_feeds_one_actor_and_cost_plan_uses_it(tmp_path):
    out = tmp_path / "sim.json"
    run = subprocess.run([sys.executable, "benchmarks/gpu_shaped_encode.py", "--images", "96", "--shard-size", "48",
                          "--batch-size", "32", "--source-size", "96", "--rates", "500", "--workdir", str(tmp_path / "w"),
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[SIMULATED-GPU]" in run.stdout
    res = json.loads(out.read_text())
    assert res["label"] == "SIMULATED-GPU" and res["input_size"] == 384
    (r,) = res["results"]
    assert r["images"] == 96 and r["simulated_img_s"] == 500
    # a fixed-rate actor can never be faster than its rate; the feed's CPU was counted
    assert 0 < r["delivered_img_s"] <= 500 * 1.05 and 0 < r["actor_busy_share"] <= 1
    assert r["feed_cpu_s"] > 0 and r["operators_cpu_s"]["MapBatches(decode_batch)"] > 0
    # the tables it wrote say what wrote them, so they are never mistaken for a model's
    tables = sorted((tmp_path / "w" / "out-simulated" / "tables").glob("*.parquet"))
    assert tables
    meta = pq.read_schema(tables[0]).metadata
    assert b"SIMULATED-GPU" in b"".join(meta.values())
    plan = subprocess.run([sys.executable, "benchmarks/cost_plan.py", "--decode-per-core", "300", "--sim-json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert f"`feed_cpu_ms` = {r['feed_cpu_ms_per_image']:.4g} (measured)" in plan.stdout
    assert "measured pipeline CPU per image (simulation)" in plan.stdout
