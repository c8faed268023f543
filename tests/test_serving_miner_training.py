"""Corpus-wide hard negatives in training: `jobs/pretrain.py --negatives miner` against a Serve miner on
loopback, two Ray Train workers, a few steps; the miner's own record shows what it answered to whom."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edje.schemas.token_table import read_token_tables
from edje.serving.config import ServeConfig
from edje.serving.random_corpus import write_random_corpus
from edje.serving.startup import StartupConfig

# The project's Serve proxy health checks (serving.startup): the local Ray these tests start inherits them,
# so that a loaded machine does not kill the proxy mid-start.
os.environ.update(StartupConfig().env())

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
STEPS, WORKERS, BATCH, K = 3, 2, 4, 2


def test_pretrain_takes_its_negatives_from_the_miner_service(ray_local, tmp_path, tiny_edje_config):
    from ray import serve
    from world_serving import serving

    corpus = write_random_corpus(str(tmp_path / "corpus"), tiny_edje_config, num_images=32, num_tables=1)
    miner_cfg = ServeConfig(miner_image_tables=(corpus.raw_table,), caption_sources=(corpus.raw_table,),
                            auth_token_env=None)
    with serving(("miner", "/", miner_cfg)) as (base, _):
        args = [sys.executable, str(ROOT / "jobs" / "pretrain.py"),
                "--tables", corpus.raw_table, "--storage-path", str(tmp_path / "runs"), "--name", "mined",
                "--num-workers", str(WORKERS), "--cpus-per-worker", "0.5", "--batch-size", str(BATCH), "--k", str(K),
                "--negatives", "miner", "--miner-url", base,
                "--max-steps", str(STEPS), "--checkpoint-every", str(STEPS), "--log-every", "1", "--warmup-steps", "1",
                "--adapter", "compressed", "--num-queries", "8", "--adapter-hidden", "64", "--adapter-heads", "4",
                "--random-bert", "hidden_size=64", "num_hidden_layers=1", "num_attention_heads=2",
                "intermediate_size=128", "--ray-address", ray_local.get_runtime_context().gcs_address]
        run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        served = serve.get_deployment_handle("Miner", app_name="miner").recent.remote().result()

    table, _ = read_token_tables([corpus.raw_table], columns=["image_id", "caption"])
    pairs = set(zip(table.column("image_id").to_pylist(), table.column("caption").to_pylist()))
    # Every training step of every worker asked the miner for its batch's negatives.
    assert len(served) >= STEPS * WORKERS, served
    assert len({r["client"] for r in served}) == WORKERS  # two processes: the two Ray Train workers
    for r in served:
        assert r["client"].startswith("edje-miner-client/")
        assert set(zip(r["image_ids"], r["captions"])) <= pairs  # the anchors are the training batch's pairs
        for anchor, caption, images, captions in zip(r["image_ids"], r["captions"], r["negative_images"],
                                                     r["negative_captions"]):
            assert len(images) == K and len(captions) == K
            assert anchor not in images and caption not in captions  # the miner's false-negative masks
