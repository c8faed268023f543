"""The shipped checkpoint's calibrated relevance_score, over HTTP, on a sample world nobody trained or tuned on.

checkpoints/edje-local-bind records its ranking rule (ITM + 2 x first-stage cosine) and a Platt calibration, both
fitted on the val split of world seed 100. Seed 23 is used by nothing else.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import requests

from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.startup import StartupConfig

os.environ.update(StartupConfig().env())

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = str(REPO / "checkpoints" / "edje-local-bind")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unseen_world(tmp_path_factory):
    """Seed-23 test split (48 images in families of twins), compressed int8 tables made with the checkpoint's adapter."""
    from conftest import encode_world_with_checkpoint

    from edje.evaluation.rerank_eval import family_groups
    from edje.schemas.annotations import load_annotations
    from edje.schemas.token_table import build_table, write_token_table

    root = tmp_path_factory.mktemp("unseen")
    ann_path, table, tokens, cmeta = encode_world_with_checkpoint(root, 23, 48, CHECKPOINT)
    emb = np.stack([np.asarray(v, np.float32) for v in table.column("image_embedding").to_pylist()])
    write_token_table(build_table(cmeta, table.column("image_id").to_pylist(), tokens, emb), str(root / "compressed.parquet"))
    ann = load_annotations(ann_path)
    return ann, family_groups(ann), str(root / "compressed.parquet")


def test_relevance_is_calibrated_on_an_unseen_world(ray_local, unseen_world):
    from world_serving import serving

    from edje.model.ranking import read_ranking

    ann, families, tables = unseen_world
    rule = read_ranking(CHECKPOINT)
    assert rule.calibrated and rule.first_stage_weight > 0  # the shipped rule fuses and is calibrated
    cfg = ServeConfig(checkpoint=CHECKPOINT, token_tables=(tables,), auth_token_env=None,
                      reranker=DeploymentResources(num_cpus=0.25))
    with serving(("calibrated", "/", cfg)) as (url, _):
        info = requests.get(url + "/v1/info", timeout=60).json()["ranking"]
        assert info["calibration_scale"] == rule.calibration_scale and "relevance = sigmoid(" in info["rule"]
        true_rel, twin_rel, top = [], [], []
        first_caption = [c[0] for c in ann.image_to_captions()]
        for i, image_id in enumerate(ann.image_ids):
            family = [ann.image_ids[j] for j in np.flatnonzero(families == families[i])]  # the image and its twins
            query = ann.captions[first_caption[i]]
            body = requests.post(url + "/v1/rerank", timeout=120,
                                 json={"query": query, "documents": family, "return_documents": False}).json()
            rel = {family[x["index"]]: x["relevance_score"] for x in body["results"]}
            true_rel.append(rel[image_id])
            twin_rel.extend(v for k, v in rel.items() if k != image_id)
            top.append(body["results"][0]["relevance_score"])
        top = np.array(top)
        # Not saturated: the best result of each query gets its own probability, none of them 1.0.
        assert top.max() < 0.999 and np.ptp(top) > 0.05, top
        assert np.mean(true_rel) > np.mean(twin_rel), (np.mean(true_rel), np.mean(twin_rel))
        # raw_scores is the uncalibrated score; relevance is sigmoid(a x score + b) of it.
        docs = ann.image_ids[:6]
        raw = requests.post(url + "/v1/rerank", timeout=120, json={"query": ann.captions[0], "documents": docs,
                                                                  "raw_scores": True}).json()["results"]
        cal = requests.post(url + "/v1/rerank", timeout=120, json={"query": ann.captions[0], "documents": docs}).json()
        np.testing.assert_allclose([x["relevance_score"] for x in cal["results"]],
                                   rule.probability([x["relevance_score"] for x in raw]), atol=1e-5)
