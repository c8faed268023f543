"""The serving cores are plain classes: importing them (and the Python API) loads no Ray Serve."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORES = ["serving.reranker_core", "serving.first_stage", "serving.miner", "serving.token_store", "serving.live_images",
         "model.scoring", "model.token_encoder", "model.embedding_index", "edje"]


def test_cores_import_no_ray_serve():
    code = "; ".join(f"import {m}" for m in CORES) + "; import sys; print(sorted(m for m in sys.modules if m.startswith('ray.serve')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_app_builds_deployments_around_the_plain_classes():
    from serving.app import FirstStageDeployment, MinerDeployment
    from serving.first_stage import FirstStage
    from serving.miner import Miner

    # The first stage's deployment is a thin subclass that adds metrics (serving/deployments.py).
    assert issubclass(FirstStageDeployment.func_or_class, FirstStage) and MinerDeployment.func_or_class is Miner
    assert (FirstStageDeployment.name, MinerDeployment.name) == ("FirstStage", "Miner")
