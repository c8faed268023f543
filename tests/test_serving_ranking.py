"""The server ranks by the checkpoint's rule, the one evaluation reports: ITM logit + w x first-stage cosine.

Also mixed-modal search (a corpus image + a text) over the same app: the fused rule makes the first-stage
cosine that is added (the combined query's, not the text's) visible in the scores."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import requests
import torch

from edje.model.backbone import VisionBackbone
from edje.model.edje import load_checkpoint
from edje.model.ranking import RankingConfig, read_ranking, write_ranking
from edje.schemas.config import BackboneConfig
from edje.schemas.token_table import decode_tokens, read_token_tables, vector_matrix
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.ports import free_port
from edje.serving.random_corpus import write_random_corpus
from edje.serving.startup import StartupConfig, start_serve

pytestmark = pytest.mark.slow  # Ray Train / Serve on a local cluster

# The project's Serve proxy health checks (serving.startup), as the other serving modules set them: a local Ray
# started on a loaded machine otherwise loses its proxy mid-start (ActorDiedError in serve.start).
os.environ.update(StartupConfig().env())

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


@pytest.fixture(scope="module")
def fused_url(ray_local, fused_corpus):
    """One Serve app over the fused checkpoint for the module's tests (start-up is the slow part)."""
    from ray import serve

    from edje.serving.app import build

    corpus, fused = fused_corpus
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = ServeConfig(checkpoint=fused, token_tables=tuple(corpus.compressed_tables), auth_token_env=None,
                      reranker=DeploymentResources(num_cpus=0.25))
    try:
        # The jobs' start-up (bounded retries, waits for /healthz): a proxy starved by a busy machine is retried.
        start_serve(lambda: build(cfg), "fused", "/", "127.0.0.1", port, url, StartupConfig())
        yield url
    finally:
        serve.shutdown()


def test_served_scores_follow_the_checkpoints_fused_rule(fused_url, fused_corpus):
    corpus, fused = fused_corpus
    docs, query = corpus.image_ids[:10], corpus.captions[3]
    body = requests.post(f"{fused_url}/v1/rerank", timeout=120,
                         json={"query": query, "documents": docs, "raw_scores": True}).json()
    got = np.zeros(len(docs))
    for x in body["results"]:
        got[x["index"]] = x["relevance_score"]
    itm, expected = _expected(corpus, fused, query, docs)
    np.testing.assert_allclose(got, expected, atol=2e-3)
    assert not np.allclose(got, itm, atol=1e-2)  # the cosine term is really there
    assert [x["index"] for x in body["results"]] == list(np.argsort(-expected, kind="stable"))
    # relevance_score is the recorded Platt calibration of the fused score, not sigmoid(score).
    calibrated = requests.post(f"{fused_url}/v1/rerank", timeout=120,
                               json={"query": query, "documents": docs}).json()["results"]
    a, b = CALIBRATION
    np.testing.assert_allclose([x["relevance_score"] for x in calibrated],
                               1 / (1 + np.exp(-(a * np.sort(expected)[::-1] + b))), atol=1e-4)
    info = requests.get(f"{fused_url}/v1/info", timeout=60).json()["ranking"]
    assert info["first_stage_weight"] == WEIGHT and info["calibration_scale"] == a and info["calibrated_on"] == "test-val"
    assert info["rule"] == "score = ITM logit + 40 x first-stage cosine; relevance = sigmoid(0.05 x score - 1)"


# ------------------------------------------------------------------------------------ mixed-modal search
@pytest.fixture(scope="module")
def first_stage_reference(fused_corpus):
    """The first stage in-process: stored image embeddings, the text tower, ITM logits (for the served rule)."""
    corpus, fused = fused_corpus
    model = load_checkpoint(fused)
    table, meta = read_token_tables(corpus.compressed_tables)
    ids = table.column("image_id").to_pylist()
    tokens = decode_tokens(table, meta)
    backbone = VisionBackbone.create(BackboneConfig(meta.backbone, meta.pretrained, meta.feature_layer))

    @torch.no_grad()
    def itm(query, docs):
        return model.encoder.score([query] * len(docs), torch.from_numpy(tokens[[ids.index(d) for d in docs]])).numpy()

    return ids, vector_matrix(table.column("image_embedding")), lambda t: backbone.encode_text([t]).numpy()[0], itm


def _top(ids, scores, k, exclude=None):
    """The k best ids by score (ties by row), `exclude` left out."""
    order = [i for i in np.argsort(-scores, kind="stable") if ids[i] != exclude]
    return [ids[i] for i in order[:k]]


def test_mixed_modal_search_combines_image_and_text_and_reranks_against_the_text(fused_url, fused_corpus,
                                                                                  first_stage_reference):
    corpus, _ = fused_corpus
    ids, emb, text_of, itm = first_stage_reference
    image, query = corpus.image_ids[5], corpus.captions[11]
    r = requests.post(fused_url + "/v1/search", timeout=120,
                      json={"image": image, "query": query, "top_k": 8, "raw_scores": True})
    assert r.status_code == 200, r.text
    body = r.json()
    got = [x["image_id"] for x in body["results"]]
    # First stage: normalise(0.5 x image + 0.5 x text) (the default weight), the query image excluded.
    q = 0.5 * emb[ids.index(image)] + 0.5 * text_of(query)
    q /= np.linalg.norm(q)
    cos = emb @ q
    assert image not in got and len(got) == 8
    assert set(got) == set(_top(ids, cos, 8, exclude=image))
    assert set(got) != set(_top(ids, emb @ text_of(query), 8))  # the image changed the candidates
    np.testing.assert_allclose([x["first_stage_score"] for x in body["results"]], cos[[ids.index(i) for i in got]],
                               atol=1e-4)
    # Reranked against the text by the fused rule, with the cosine of the combined query (the first stage's).
    itm_got = itm(query, got)
    expected = itm_got + WEIGHT * cos[[ids.index(i) for i in got]]
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], expected, atol=2e-3)
    assert [x["relevance_score"] for x in body["results"]] == sorted(x["relevance_score"] for x in body["results"])[::-1]
    with_text_cos = itm_got + WEIGHT * (emb[[ids.index(i) for i in got]] @ text_of(query))
    assert not np.allclose(expected, with_text_cos, atol=1e-1)
    assert body["reranked"] and body["usage"]["total_tokens"] > 0
    assert r.headers["X-EDJE-Replica"]
    # The weight is the request's: w = 0.9 leans on the image.
    w = requests.post(fused_url + "/v1/search", timeout=120,
                      json={"image": image, "query": query, "top_k": 3, "image_weight": 0.9}).json()["results"]
    q9 = 0.9 * emb[ids.index(image)] + 0.1 * text_of(query)
    q9 /= np.linalg.norm(q9)
    top9 = _top(ids, emb @ q9, 3, exclude=image)
    assert {x["image_id"] for x in w} == set(top9)
    np.testing.assert_allclose(sorted(x["first_stage_score"] for x in w), sorted(emb[[ids.index(i) for i in top9]] @ q9),
                               atol=1e-4)


def test_image_only_search_is_first_stage_order_and_says_so(fused_url, fused_corpus, first_stage_reference):
    corpus, _ = fused_corpus
    ids, emb, _, _ = first_stage_reference
    image = corpus.image_ids[7]
    body = requests.post(fused_url + "/v1/search", timeout=120, json={"image": image, "top_k": 6, "top_n": 4}).json()
    cos = emb @ emb[ids.index(image)]
    assert [x["image_id"] for x in body["results"]] == _top(ids, cos, 4, exclude=image)
    assert body["reranked"] is False and body["usage"]["total_tokens"] == 0
    for x in body["results"]:
        assert x["relevance_score"] == x["first_stage_score"] == pytest.approx(float(cos[ids.index(x["image_id"])]), abs=1e-4)
        assert x["url"].endswith(f"{x['image_id']}.jpg")
    # A corpus smaller than top_k: every other image, never the query image.
    body = requests.post(fused_url + "/v1/search", timeout=120, json={"image": image, "top_k": 100}).json()
    assert sorted(x["image_id"] for x in body["results"]) == sorted(set(ids) - {image})


def test_text_only_search_is_unchanged(fused_url, fused_corpus, first_stage_reference):
    corpus, _ = fused_corpus
    ids, emb, text_of, itm = first_stage_reference
    query = corpus.captions[4]
    body = requests.post(fused_url + "/v1/search", timeout=120, json={"query": query, "top_k": 5, "raw_scores": True}).json()
    cos = emb @ text_of(query)
    got = [x["image_id"] for x in body["results"]]
    assert set(got) == set(_top(ids, cos, 5)) and body["reranked"]
    rows = [ids.index(i) for i in got]
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], itm(query, got) + WEIGHT * cos[rows],
                               atol=2e-3)


@pytest.mark.parametrize("body, status, needle", [
    ({"image": "ghost-9", "query": "a red circle"}, 404, "ghost-9"),
    ({"image": "ghost-8"}, 404, "ghost-8"),
    ({}, 422, "give a 'query', an 'image'"),
    ({"query": ""}, 422, "query"),
    ({"query": "", "image": "img_00001"}, 422, "query"),
    ({"image": " "}, 422, "image"),
    ({"image": "img_00001", "query": "q", "image_weight": 1.5}, 422, "image_weight"),
    ({"image": "img_00001", "top_k": 0}, 422, "top_k"),
])
def test_search_request_errors(fused_url, body, status, needle):
    r = requests.post(fused_url + "/v1/search", json=body, timeout=120)
    assert r.status_code == status, r.text
    payload = r.json()
    assert needle in (payload.get("message") or payload["detail"])


def test_openapi_states_the_search_query_shapes(fused_url):
    schema = requests.get(fused_url + "/openapi.json", timeout=60).json()["components"]["schemas"]["SearchRequest"]
    props = schema["properties"]
    assert "query" not in schema.get("required", [])
    image = [s for s in props["image"]["anyOf"] if s.get("type") == "string"][0]
    assert image["maxLength"] == 512 and image["pattern"] == r"\S"
    assert props["image_weight"]["minimum"] == 0 and props["image_weight"]["maximum"] == 1
    assert props["image_weight"]["default"] == 0.5
