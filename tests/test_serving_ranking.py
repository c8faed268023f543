"""The server ranks by the checkpoint's rule, the one evaluation reports: ITM logit + w x first-stage cosine."""
from __future__ import annotations

import shutil
import socket

import numpy as np
import pytest
import requests
import torch

from model.backbone import VisionBackbone
from model.edje import load_checkpoint
from model.ranking import RankingConfig, read_ranking, write_ranking
from schemas.config import BackboneConfig
from schemas.token_table import decode_tokens, read_token_tables, vector_matrix
from serving.config import DeploymentResources, ServeConfig
from serving.random_corpus import write_random_corpus

WEIGHT = 40.0  # large enough that the cosine term reorders a random model's logits
CALIBRATION = (0.05, -1.0)  # relevance = sigmoid(0.05 x score - 1): no saturation at scores ~ 40 x cosine


@pytest.fixture(scope="module")
def fused_corpus(tmp_path_factory, tiny_edje_config):
    root = tmp_path_factory.mktemp("fused")
    corpus = write_random_corpus(str(root / "corpus"), tiny_edje_config, num_images=24, num_tables=1)
    fused = str(root / "fused-checkpoint")
    shutil.copytree(corpus.checkpoint, fused)
    write_ranking(fused, RankingConfig(WEIGHT, chosen_on="test").with_calibration(*CALIBRATION, "test-val"))
    return corpus, fused


def _expected(corpus, checkpoint, query, docs):
    """The rule evaluated in-process, as jobs/evaluate.py does: ITM logit + w x cosine(text, image)."""
    model = load_checkpoint(checkpoint)
    table, meta = read_token_tables(corpus.compressed_tables)
    row = {i: r for r, i in enumerate(table.column("image_id").to_pylist())}
    rows = [row[d] for d in docs]
    with torch.no_grad():
        itm = model.encoder.score([query] * len(docs), torch.from_numpy(decode_tokens(table, meta)[rows])).numpy()
    backbone = VisionBackbone.create(BackboneConfig(meta.backbone, meta.pretrained, meta.feature_layer))
    cos = vector_matrix(table.column("image_embedding"))[rows] @ backbone.encode_text([query]).numpy()[0]
    return itm, read_ranking(checkpoint).fuse(itm, cos)


def test_served_scores_follow_the_checkpoints_fused_rule(ray_local, fused_corpus):
    from ray import serve

    from serving.app import build

    corpus, fused = fused_corpus
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        cfg = ServeConfig(checkpoint=fused, token_tables=tuple(corpus.compressed_tables), auth_token_env=None,
                          reranker=DeploymentResources(num_cpus=0.25))
        serve.run(build(cfg), name="fused", route_prefix="/")
        docs, query = corpus.image_ids[:10], corpus.captions[3]
        body = requests.post(f"http://127.0.0.1:{port}/v1/rerank", timeout=120,
                             json={"query": query, "documents": docs, "raw_scores": True}).json()
        got = np.zeros(len(docs))
        for x in body["results"]:
            got[x["index"]] = x["relevance_score"]
        itm, expected = _expected(corpus, fused, query, docs)
        np.testing.assert_allclose(got, expected, atol=2e-3)
        assert not np.allclose(got, itm, atol=1e-2)  # the cosine term is really there
        assert [x["index"] for x in body["results"]] == list(np.argsort(-expected, kind="stable"))
        # relevance_score is the recorded Platt calibration of the fused score, not sigmoid(score).
        calibrated = requests.post(f"http://127.0.0.1:{port}/v1/rerank", timeout=120,
                                   json={"query": query, "documents": docs}).json()["results"]
        a, b = CALIBRATION
        np.testing.assert_allclose([x["relevance_score"] for x in calibrated],
                                   1 / (1 + np.exp(-(a * np.sort(expected)[::-1] + b))), atol=1e-4)
        info = requests.get(f"http://127.0.0.1:{port}/v1/info", timeout=60).json()["ranking"]
        assert info["first_stage_weight"] == WEIGHT and info["calibration_scale"] == a and info["calibrated_on"] == "test-val"
        assert info["rule"] == "score = ITM logit + 40 x first-stage cosine; relevance = sigmoid(0.05 x score - 1)"
    finally:
        serve.shutdown()
