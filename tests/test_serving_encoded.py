"""The encode job's defaults and the serving of its tables: jobs/encode_cc12m.py without --pretrained
encodes with the shipped trained backbone, refuses a backbone without weights, and the Serve
application serves the compressed tables it writes (scores equal to the in-process model's)."""
from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import pytest
import requests
import torch

from edje.jobs.encode_cc12m import config_from_args
from edje.jobs.encode_cc12m import main as encode_main
from edje.schemas.shipped import DEFAULT_BACKBONE
from edje.schemas.token_table import decode_tokens, read_metadata, read_token_tables
from edje.schemas.weights import find_weights
from edje.serving.startup import StartupConfig

# The project's Serve proxy health checks (serving.startup): the local Ray these tests start inherits them,
# so that a loaded machine does not kill the proxy mid-start.
os.environ.update(StartupConfig().env())


def test_encode_job_defaults_to_the_shipped_weights_and_refuses_random_ones(capsys):
    assert config_from_args(["--output", "o"]).pretrained == find_weights(backbone=DEFAULT_BACKBONE)
    assert config_from_args(["--output", "o", "--pretrained", "w.safetensors"]).pretrained == "w.safetensors"
    assert config_from_args(["--output", "o", "--random-weights"]).pretrained is None
    with pytest.raises(SystemExit):
        config_from_args(["--output", "o", "--backbone", "edje-tiny-timm"])
    assert "'edje-tiny-timm' has no weights" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config_from_args(["--output", "o", "--random-weights", "--pretrained", "w.safetensors"])


@pytest.mark.slow
def test_serving_the_tables_the_encode_job_wrote(ray_local, tmp_path, tiny_edje_config):
    from world_serving import serving

    from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint
    from edje.serving.config import DeploymentResources, ServeConfig

    world = ["--world-dir", str(tmp_path / "world"), "--world-images", "24", "--batch-size", "16", "--shard-size", "12"]
    # Raw tables with every default: the shipped trained backbone, not random weights.
    assert encode_main(["--output", str(tmp_path / "raw"), *world]) == 0
    raw = sorted(glob.glob(str(tmp_path / "raw" / "tables" / "*.parquet")))
    assert raw and read_metadata(raw[0]).pretrained == find_weights(backbone=DEFAULT_BACKBONE)
    # An EDJE checkpoint over that backbone; compressed int8 tables made with its adapter by the encode job.
    cfg = dataclasses.replace(tiny_edje_config, backbone=dataclasses.replace(
        tiny_edje_config.backbone, name=DEFAULT_BACKBONE, pretrained=find_weights(backbone=DEFAULT_BACKBONE)))
    torch.manual_seed(0)
    save_checkpoint(EDJEModel(cfg), str(tmp_path / "ckpt"))
    assert encode_main(["--output", str(tmp_path / "c16"), "--adapter", str(tmp_path / "ckpt"), "--quant", "int8", *world]) == 0
    tables = sorted(glob.glob(str(tmp_path / "c16" / "tables" / "*.parquet")))
    assert tables and all(read_metadata(t).kind == "compressed" for t in tables)

    cfg = ServeConfig(checkpoint=str(tmp_path / "ckpt"), token_tables=tuple(tables), caption_sources=tuple(raw),
                      auth_token_env=None, reranker=DeploymentResources(num_cpus=0.5))
    with serving(("encoded", "/", cfg)) as (base, _):
        table, meta = read_token_tables(tables)
        ids, captions = table.column("image_id").to_pylist(), read_token_tables(raw)[0].column("caption").to_pylist()
        query, docs = captions[0], ids[:8]
        r = requests.post(f"{base}/v1/rerank", json={"query": query, "documents": docs, "raw_scores": True},
                          timeout=120)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        model = load_checkpoint(str(tmp_path / "ckpt"))
        with torch.no_grad():
            want = model.encoder.score([query] * 8, torch.from_numpy(decode_tokens(table, meta)[:8])).numpy()
        np.testing.assert_allclose([got[i] for i in range(8)], want, atol=1e-4)
        r = requests.post(f"{base}/v1/search", json={"query": query, "top_k": 5}, timeout=120)
        assert r.status_code == 200 and len(r.json()["results"]) == 5, r.text
        info = requests.get(f"{base}/v1/info", timeout=60).json()
        assert info["corpus_size"] == len(ids) and info["miner"]["captions"] == len(captions)

