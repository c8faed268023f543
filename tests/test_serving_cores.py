"""The serving cores are plain classes: importing them (and the Python API) loads no Ray Serve."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORES = ["edje.serving.reranker_core", "edje.serving.first_stage", "edje.serving.miner", "edje.storage.token_store",
         "edje.serving.live_images", "edje.model.scoring", "edje.model.token_encoder", "edje.storage.embedding_index", "edje"]


def test_cores_import_no_ray_serve():
    code = "; ".join(f"import {m}" for m in CORES) + "; import sys; print(sorted(m for m in sys.modules if m.startswith('ray.serve')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_app_builds_deployments_around_the_plain_classes():
    from edje.serving.app import FirstStageDeployment, MinerDeployment
    from edje.serving.first_stage import FirstStage
    from edje.serving.miner import Miner

    # The first stage's deployment is a thin subclass that adds metrics (serving/deployments.py).
    assert issubclass(FirstStageDeployment.func_or_class, FirstStage) and MinerDeployment.func_or_class is Miner
    assert (FirstStageDeployment.name, MinerDeployment.name) == ("FirstStage", "Miner")
