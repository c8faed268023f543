"""The serving application on a fresh local Ray, called over real HTTP on loopback (requests).

One Serve instance per module (start-up is the slow part): the full app at / (with a bearer
token and two reranker replicas), the miner-only app at /miner and an app without a miner at
/nominer. The replica-kill test runs last.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch
from ray_nodes import our_processes
from world_serving import serving

from edje.model.edje import load_checkpoint
from edje.schemas.token_table import decode_tokens, read_token_tables
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.ingress import BATCH_HEADER, REPLICA_HEADER
from edje.serving.random_corpus import write_random_corpus
from edje.serving.startup import StartupConfig
from edje.training.miner_client import MinerError, fetch_negatives, neighbour_batch

# The project's Serve proxy health checks (serving.startup): the local Ray these tests start inherits them,
# so that a loaded machine does not kill the proxy mid-start.
os.environ.update(StartupConfig().env())

TOKEN = "test-token"
MAX_DOCS = 24
MAX_CHARS = 300
FUZZ_EXAMPLES = 25  # per operation and app: ~400 requests in all

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_edje_config):
    return write_random_corpus(str(tmp_path_factory.mktemp("served")), tiny_edje_config, num_images=48)


@pytest.fixture(scope="module")
def served(ray_local, corpus, tmp_path_factory):
    # A 50 ms batch window: concurrent requests reliably meet in one forward pass on a loaded machine.
    cfg = ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables),
                      caption_sources=(corpus.raw_table,), max_documents=MAX_DOCS, max_text_chars=MAX_CHARS,
                      auth_token=TOKEN, max_batch_pairs=32, batch_wait_timeout_s=0.05,
                      # Live images on, urls on loopback only: the fuzz below reaches /v1/images and fetches nothing else.
                      live_dir=str(tmp_path_factory.mktemp("live")), image_url_hosts=("127.0.0.1",),
                      reranker=DeploymentResources(num_replicas=2, num_cpus=0.5, max_ongoing_requests=64))
    miner_only = ServeConfig(miner_image_tables=(corpus.raw_table,), caption_sources=(corpus.annotations,), auth_token_env=None)
    # Admits one request at a time and holds one more: the overload test's app (its other tests call it one by one).
    no_miner = ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables), auth_token_env=None,
                           reranker=DeploymentResources(num_cpus=0.25),
                           ingress=DeploymentResources(max_ongoing_requests=1, max_queued_requests=1))
    # The ingress's own gate: one request in flight and no queue (Serve's limits out of its way).
    gated = no_miner.replace(ingress=DeploymentResources(max_ongoing_requests=32, max_queued_requests=-1), admit_in_flight=1)
    with serving(("edje", "/", cfg), ("miner", "/miner", miner_only), ("nominer", "/nominer", no_miner),
                 ("gated", "/gated", gated), token=TOKEN) as (url, http):
        yield url, http


@pytest.fixture(scope="module")
def reference(corpus):
    """The in-process model and the decoded tokens of every image, for exact score comparisons."""
    model = load_checkpoint(corpus.checkpoint)
    table, meta = read_token_tables(corpus.compressed_tables)
    tokens = decode_tokens(table, meta)
    row = {i: r for r, i in enumerate(table.column("image_id").to_pylist())}

    @torch.no_grad()
    def score(texts, image_ids):
        return model.encoder.score(list(texts), torch.from_numpy(tokens[[row[i] for i in image_ids]])).numpy()

    return score


def sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64)))


def test_the_ingress_replicas_hold_no_torch(served):
    """Each app's ingress replica, as Serve runs it, has not loaded torch (its memory map holds no libtorch), while a
    reranker replica has: the ingress reads the checkpoint's config and tokenizer without the model."""
    def maps(deployment: str) -> dict:
        """pid -> memory map of the live Serve replicas of a deployment (Ray titles them ray::ServeReplica:<app>:<name>)."""
        found = {}
        for pid in our_processes(f":{deployment}"):
            try:
                found[pid] = open(f"/proc/{pid}/maps").read()
            except OSError:  # gone since it was listed
                pass
        return found

    ingress, rerankers = maps("Ingress"), maps("Reranker")
    assert len(ingress) >= 4 and rerankers, (ingress.keys(), rerankers.keys())  # four apps, one ingress each
    assert not [pid for pid, m in ingress.items() if "libtorch" in m]
    assert all("libtorch" in m for m in rerankers.values())


# ------------------------------------------------------------------------------------------ scores
def test_rerank_jina_shape_scores_equal_in_process(served, corpus, reference):
    url, http = served
    docs = corpus.image_ids[5:17]
    query = corpus.captions[9]
    r = http.post(url + "/v1/rerank", json={"model": "jina-reranker-m0", "query": query, "documents": docs,
                                            "top_n": 5, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "jina-reranker-m0" and body["usage"]["total_tokens"] > 0
    expected = reference([query] * len(docs), docs)
    order = np.argsort(-expected, kind="stable")[:5]
    assert [x["index"] for x in body["results"]] == list(order)
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], sigmoid(expected[order]), atol=1e-4)
    assert [x["document"]["text"] for x in body["results"]] == [docs[i] for i in order]
    assert body["results"][0]["document"]["url"].endswith(f"{docs[order[0]]}.jpg")

    raw = http.post(url + "/v1/rerank", json={"query": query, "documents": docs, "raw_scores": True,
                                              "return_documents": False}).json()
    got = np.zeros(len(docs))
    for x in raw["results"]:
        got[x["index"]] = x["relevance_score"]
        assert "document" not in x
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_rerank_cohere_shape(served, corpus, reference):
    url, http = served
    docs = corpus.image_ids[:6]
    query = corpus.captions[2]
    # What Cohere's v2 SDK posts: model, query, documents as strings, top_n, max_tokens_per_doc (ignored here).
    r = http.post(url + "/v2/rerank", json={"model": "rerank-v3.5", "query": query, "documents": docs, "top_n": 3,
                                            "max_tokens_per_doc": 4096})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "results", "meta"} and body["id"]
    expected = reference([query] * 6, docs)
    order = np.argsort(-expected, kind="stable")[:3]
    assert [x["index"] for x in body["results"]] == list(order)
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], sigmoid(expected[order]), atol=1e-4)
    assert body["meta"]["api_version"]["version"] == "2"


def test_document_objects_resolve_to_their_images(served, corpus, reference):
    url, http = served
    ids = corpus.image_ids
    docs = [ids[0], {"id": ids[1]}, ids[2], {"image_id": ids[3]}, {"image": ids[4]},
            {"id": ids[5], "text": ids[6]}]  # a text beside an id is ignored: the id names the image
    meant = ids[:6]
    query = corpus.captions[1]
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": docs, "raw_scores": True})
    assert r.status_code == 200, r.text
    got = {x["index"]: x for x in r.json()["results"]}
    assert [got[i]["document"]["text"] for i in range(6)] == meant
    np.testing.assert_allclose([got[i]["relevance_score"] for i in range(6)], reference([query] * 6, meant), atol=1e-4)
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": [{"id": 7}]})
    assert r.status_code == 422, r.text
    # A text document (Jina's {"text": ...}) is not read as an image id: 422 saying what the server ranks.
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": [{"text": ids[0]}]})
    assert r.status_code == 422 and "documents.0: this server ranks images" in r.json()["message"], r.text


def test_an_over_long_query_is_scored_as_its_first_wordpieces_or_refused(served, corpus, reference):
    """truncate (default true): the query scores as the joint encoder reads it, its first max_text_tokens
    wordpieces, and meta says so; truncate false: 413 naming the limit."""
    from edje.serving.ingress import TextLimit

    url, http = served
    limit = TextLimit.of_checkpoint(corpus.checkpoint, {"config": {"encoder": {"max_text_tokens": 64}}})
    query = " ".join(corpus.captions[2].split() + ["a"] * 80)  # within MAX_CHARS: one wordpiece per 2 characters
    n = limit.count([query])[0]
    assert n > 80 and corpus.config.encoder.max_text_tokens == 64
    docs = corpus.image_ids[:5]
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": docs, "raw_scores": True})
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["truncated"] == {"kept": 64, "query_tokens": n}
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    longer = query + " and red beyond the cut"  # the same first 64 wordpieces: the same scores
    np.testing.assert_allclose([got[i] for i in range(5)], reference([longer] * 5, docs), atol=1e-4)
    r = http.post(url + "/v2/rerank", json={"query": query, "documents": docs, "truncate": False})
    assert r.status_code == 413 and f"{n} wordpieces, more than the 64" in r.json()["detail"], r.text


def test_rerank_texts_ranks_captions_for_an_image(served, corpus, reference):
    url, http = served
    texts = corpus.captions[:7]
    image = corpus.image_ids[3]
    r = http.post(url + "/v1/rerank/texts", json={"image": image, "texts": texts, "raw_scores": True})
    assert r.status_code == 200, r.text
    expected = reference(texts, [image] * 7)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(7)], expected, atol=1e-4)
    assert [x["document"]["text"] for x in r.json()["results"]][0] == texts[int(np.argmax(expected))]


def test_concurrent_requests_are_batched_without_changing_scores(served, corpus, reference):
    url, http = served
    jobs = [(corpus.captions[i], corpus.image_ids[i:i + 3]) for i in range(24)]

    def call(job):
        q, docs = job
        r = requests.post(url + "/v1/rerank", json={"query": q, "documents": docs, "raw_scores": True},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        assert r.status_code == 200, r.text
        return {x["index"]: x["relevance_score"] for x in r.json()["results"]}, r.headers

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(call, jobs))
    for (q, docs), (got, _) in zip(jobs, results):
        np.testing.assert_allclose([got[i] for i in range(3)], reference([q] * 3, docs), atol=1e-4)
    # The replica reports the pairs of the forward pass that scored each request: > 3 means merged requests.
    batch_pairs = [int(h[BATCH_HEADER]) for _, h in results]
    assert max(batch_pairs) > 3, batch_pairs
    assert all(b % 3 == 0 for b in batch_pairs)  # whole requests of 3 pairs each
    assert len({h[REPLICA_HEADER] for _, h in results}) == 2  # both reranker replicas served


def test_search_first_stage_then_rerank(served, corpus, reference):
    url, http = served
    query = corpus.captions[11]
    r = http.post(url + "/v1/search", json={"query": query, "top_k": 8, "top_n": 3, "raw_scores": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 3
    ids = [x["image_id"] for x in results]
    np.testing.assert_allclose([x["relevance_score"] for x in results], reference([query] * 3, ids), atol=1e-4)
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    # The candidates are the first stage's top 8 by cosine: check against the stored embeddings.
    from edje.model.backbone import VisionBackbone

    table, _ = read_token_tables(corpus.compressed_tables, columns=["image_id", "image_embedding"])
    emb = np.stack(table.column("image_embedding").to_numpy(zero_copy_only=False))
    q = VisionBackbone.create(corpus.config.backbone).encode_text([query]).numpy()[0]
    top8 = {table.column("image_id")[i].as_py() for i in np.argsort(-(emb @ q))[:8]}
    assert set(ids) <= top8
    for x in results:
        i = table.column("image_id").to_pylist().index(x["image_id"])
        assert x["first_stage_score"] == pytest.approx(float(emb[i] @ q), abs=1e-4)


# --------------------------------------------------------------------------------------- negatives
def test_negatives_mask_false_negatives(served, corpus):
    url, http = served
    pairs = [{"image_id": corpus.image_ids[i], "caption": corpus.captions[i]} for i in (0, 6, 13)]
    r = http.post(url + "/v1/negatives", json={"pairs": pairs, "k": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["k"] == 4 and not body["rescored"]
    for pair, row in zip(pairs, body["negatives"]):
        imgs = [n["image_id"] for n in row["negative_images"]]
        caps = [n["caption"] for n in row["negative_captions"]]
        assert len(imgs) == 4 and len(caps) == 4
        assert pair["image_id"] not in imgs
        assert pair["caption"] not in caps and len(set(caps)) == 4
        assert all(n["image_id"] != pair["image_id"] for n in row["negative_captions"])
        sims = [n["similarity"] for n in row["negative_images"]]
        assert sims == sorted(sims, reverse=True)


def test_negatives_rescored_by_the_joint_encoder(served, corpus, reference):
    url, http = served
    pair = {"image_id": corpus.image_ids[4], "caption": corpus.captions[4]}
    r = http.post(url + "/v1/negatives", json={"pairs": [pair], "k": 3, "rescore": True, "pool": 10})
    assert r.status_code == 200, r.text
    row = r.json()["negatives"][0]
    imgs = [n["image_id"] for n in row["negative_images"]]
    logits = [n["itm_logit"] for n in row["negative_images"]]
    assert logits == sorted(logits, reverse=True)
    np.testing.assert_allclose(logits, reference([pair["caption"]] * 3, imgs), atol=1e-4)


def test_miner_client_and_neighbour_batches(served, corpus):
    url, _ = served
    mined = fetch_negatives(url, corpus.image_ids[:4], corpus.captions[:4], k=3, auth_token=TOKEN)
    assert [len(r) for r in mined.image_ids] == [3] * 4 and [len(r) for r in mined.captions] == [3] * 4
    batch = neighbour_batch(corpus.image_ids[:4], mined, 10)
    assert batch[:4] == corpus.image_ids[:4] and len(batch) == len(set(batch)) and len(batch) <= 10
    with pytest.raises(MinerError, match="401"):
        fetch_negatives(url, corpus.image_ids[:1], corpus.captions[:1], k=2)
    with pytest.raises(MinerError, match="unknown image ids: \\['ghost'\\]"):
        fetch_negatives(url, ["ghost"], ["a caption"], k=2, auth_token=TOKEN)


def test_miner_only_app_serves_negatives_from_raw_tables_and_annotations(served, corpus):
    url, _ = served
    mined = fetch_negatives(url + "/miner", corpus.image_ids[:2], corpus.captions[:2], k=2)
    assert all(corpus.image_ids[i] not in mined.image_ids[i] for i in range(2))
    for route in ("/v1/rerank", "/v2/rerank", "/v1/rerank/texts", "/v1/search"):  # no checkpoint: no such routes
        r = requests.post(url + "/miner" + route, json={"query": "q", "documents": ["img_00001"]})
        assert r.status_code == 404, (route, r.text)
    r = requests.post(url + "/miner/v1/negatives", json={"pairs": [{"image_id": "img_00001", "caption": "x"}], "rescore": True})
    assert r.status_code == 422 and "rescore" in r.json()["message"]
    spec = requests.get(url + "/miner/openapi.json").json()
    assert set(spec["paths"]) == {"/v1/negatives", "/healthz", "/readyz", "/v1/info"}
    assert spec["components"]["schemas"]["NegativesRequest"]["properties"]["rescore"]["const"] is False
    info = requests.get(url + "/miner/v1/info").json()
    assert info["miner"]["captions"] == 96 and info["corpus_size"] == 48 and info["token_store"] is None


# ------------------------------------------------------------------------------------------ errors
def test_unknown_image_ids_are_404_and_named(served, corpus):
    url, http = served
    r = http.post(url + "/v1/rerank", json={"query": "a red circle", "documents": [corpus.image_ids[0], "ghost-1", "ghost-2"]})
    assert r.status_code == 404 and "ghost-1" in r.json()["detail"] and "ghost-2" in r.json()["detail"]
    r = http.post(url + "/v1/rerank/texts", json={"image": "ghost-3", "texts": ["a"]})
    assert r.status_code == 404 and "ghost-3" in r.json()["detail"]
    r = http.post(url + "/v1/negatives", json={"pairs": [{"image_id": "ghost-4", "caption": "a"}]})
    assert r.status_code == 404 and "ghost-4" in r.json()["detail"]


@pytest.mark.parametrize("route, body, needle", [
    ("/v1/rerank", {"query": "", "documents": ["img_00001"]}, "query"),
    ("/v1/rerank", {"query": "   ", "documents": ["img_00001"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"documents": ["img_00001"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": [f"img_{i:05d}" for i in range(MAX_DOCS + 1)]}, f"at most {MAX_DOCS} items"),
    ("/v1/rerank", {"query": "x" * (MAX_CHARS + 1), "documents": ["img_00001"]}, f"at most {MAX_CHARS} characters"),
    ("/v1/rerank", {"query": "q", "documents": ["img_00001", " "]}, "documents.1"),
    ("/v1/rerank", {"query": "q", "documents": ["img_00001"], "top_n": 0}, "top_n"),
    ("/v2/rerank", {"query": "", "documents": ["img_00001"]}, "query"),
    ("/v1/rerank/texts", {"image": "img_00001", "texts": ["ok", "y" * (MAX_CHARS + 1)]}, "texts.1"),
    ("/v1/rerank/texts", {"image": "img_00001", "texts": []}, "texts"),
    ("/v1/search", {"query": ""}, "query"),
    ("/v1/search", {"query": "q", "top_k": 5000}, "top_k"),
    ("/v1/negatives", {"pairs": []}, "pairs"),
    ("/v1/negatives", {"pairs": [{"image_id": "img_00001", "caption": "c"}], "k": 0}, "k"),
    ("/v1/negatives", {"pairs": [{"image_id": "img_00001", "caption": "c" * (MAX_CHARS + 1)}]}, "caption"),
])
def test_bad_requests_are_422_with_a_message(served, route, body, needle):
    url, http = served
    r = http.post(url + route, json=body)
    assert r.status_code == 422, r.text
    payload = r.json()
    assert needle in (payload.get("message") or payload["detail"])


def test_malformed_json_is_422(served):
    url, http = served
    r = http.post(url + "/v1/rerank", data=b'{"query": "q", "documents": [', headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "malformed JSON" in r.json()["message"]
    r = http.post(url + "/v1/rerank", data=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 422


def test_auth_health_info_and_openapi(served, corpus):
    url, http = served
    assert requests.get(url + "/healthz").json() == {"status": "ok"}
    r = requests.post(url + "/v1/rerank", json={"query": "q", "documents": [corpus.image_ids[0]]})
    assert r.status_code == 401
    r = requests.post(url + "/v1/rerank", json={"query": "q", "documents": [corpus.image_ids[0]]},
                      headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    info = http.get(url + "/v1/info").json()
    assert info["corpus_size"] == 48 and info["token_store"]["metadata"]["kind"] == "compressed"
    # The ranking rule and its calibration: this random checkpoint records neither a weight nor a calibration.
    assert info["ranking"]["first_stage_weight"] == 0.0 and info["ranking"]["calibration_scale"] is None
    assert info["ranking"]["rule"] == "score = ITM logit; relevance = sigmoid(score) (not calibrated)"
    assert info["adapter_hash"] == info["token_store"]["metadata"]["adapter_hash"]
    assert info["token_store"]["memory_bytes"] > 0 and info["precision"] == "fp32"
    assert info["limits"]["max_documents"] == MAX_DOCS
    spec = requests.get(url + "/openapi.json").json()
    for path in ("/v1/rerank", "/v2/rerank", "/v1/rerank/texts", "/v1/search", "/v1/negatives", "/v1/images", "/healthz",
                 "/v1/info"):
        assert path in spec["paths"], path


def _valid_requests(corpus):
    """A request that succeeds, for each route that needs the token (a route added later needs one here)."""
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(png, format="PNG")
    ids = corpus.image_ids
    return {("post", "/v1/rerank"): {"query": "q", "documents": ids[:2]},
            ("post", "/v2/rerank"): {"query": "q", "documents": ids[:2]},
            ("post", "/v1/rerank/texts"): {"image": ids[0], "texts": ["a", "b"]},
            ("post", "/v1/search"): {"query": "q", "top_k": 2},
            ("post", "/v1/negatives"): {"pairs": [{"image_id": ids[0], "caption": "c"}], "k": 1},
            ("post", "/v1/images"): {"image": base64.b64encode(png.getvalue()).decode(), "id": "auth-probe"},
            ("get", "/v1/info"): None}


def test_every_route_checks_the_token_before_anything_else(served, corpus):
    """Generated from the app's own route table (its OpenAPI paths): 401 without the right token whatever the
    body (auth runs before validation), success with it."""
    from edje.serving.http_guards import PUBLIC_PATHS

    url, http = served
    spec = requests.get(url + "/openapi.json").json()
    routes = {(method, path) for path, ops in spec["paths"].items() for method in ops if path not in PUBLIC_PATHS}
    valid = _valid_requests(corpus)
    assert routes == set(valid), "a route without a valid request in _valid_requests: add one"
    for method, path in sorted(routes):
        for body in ({}, valid[(method, path)], "not json", None):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}):
                kw = {"data": body} if isinstance(body, str) else {"json": body}
                r = requests.request(method, url + path, headers=headers, timeout=60, **kw)
                assert r.status_code == 401, (method, path, body, headers, r.status_code, r.text[:200])
                assert r.headers.get("WWW-Authenticate") == "Bearer"
        r = http.request(method, url + path, json=valid[(method, path)], timeout=120)
        assert r.status_code == 200, (method, path, r.text[:300])
    for path in PUBLIC_PATHS & set(spec["paths"]) | {"/openapi.json"}:
        assert requests.get(url + path, timeout=60).status_code == 200, path


def test_openapi_states_the_limits_the_server_enforces(served):
    url, _ = served
    schemas = requests.get(url + "/openapi.json").json()["components"]["schemas"]
    rerank = schemas["RerankRequest"]["properties"]
    assert rerank["documents"]["maxItems"] == MAX_DOCS and rerank["documents"]["minItems"] == 1
    query = rerank["query"]
    assert query["maxLength"] == MAX_CHARS and query["minLength"] == 1 and query["pattern"] == r"\S"
    assert {"type": "integer", "minimum": 1} in rerank["top_n"]["anyOf"]
    ids = [s for s in rerank["documents"]["items"]["anyOf"] if s.get("type") == "string"][0]
    assert ids["minLength"] == 1 and ids["pattern"] == r"\S"
    texts = schemas["TextRerankRequest"]["properties"]["texts"]
    assert texts["maxItems"] == MAX_DOCS and texts["items"]["maxLength"] == MAX_CHARS
    assert schemas["SearchRequest"]["properties"]["top_k"]["maximum"] == 1000
    assert schemas["Pair"]["properties"]["caption"]["maxLength"] == MAX_CHARS
    assert schemas["NegativesRequest"]["properties"]["pairs"]["maxItems"] == 1024


def test_a_route_that_is_not_deployed_is_404_and_absent_from_openapi(served, corpus):
    url, _ = served
    r = requests.post(url + "/nominer/v1/negatives", json={"pairs": [{"image_id": corpus.image_ids[0], "caption": "c"}]})
    assert r.status_code == 404, r.text
    assert "/v1/negatives" not in requests.get(url + "/nominer/openapi.json").json()["paths"]
    r = requests.post(url + "/nominer/v1/rerank", json={"query": "q", "documents": corpus.image_ids[:2]})
    assert r.status_code == 200, r.text


def _burst(url: str, corpus, n: int = 16) -> list:
    """n rerank requests sent at once: (status, Retry-After, seconds, body) of each."""
    start = threading.Barrier(n)
    body = {"query": corpus.captions[0], "documents": corpus.image_ids[:8]}

    def call(_):
        start.wait()
        t0 = time.perf_counter()
        r = requests.post(url, json=body, timeout=120)
        return r.status_code, r.headers.get("Retry-After"), time.perf_counter() - t0, r.text

    with ThreadPoolExecutor(n) as pool:
        got = list(pool.map(call, range(n)))
    refused = [g for g in got if g[0] == 503]
    assert refused and any(g[0] == 200 for g in got), [g[:3] for g in got]
    assert {g[0] for g in got} <= {200, 503}, [g[:3] for g in got]
    assert all(g[1] == "1" for g in refused), refused  # ServeConfig.retry_after_s
    # Refused without waiting for the admitted requests (each holds the one ingress slot for a forward pass).
    assert max(g[2] for g in refused) < min(g[2] for g in got if g[0] == 200) + 0.5, [g[:3] for g in got]
    return got


def test_overload_is_refused_at_once_with_503_and_retry_after(served, corpus):
    """Beyond the ingress's max_ongoing_requests + max_queued_requests, Serve's proxy answers 503 with Retry-After at
    once instead of holding the request; the admitted ones are answered."""
    got = _burst(served[0] + "/nominer/v1/rerank", corpus)
    assert all("backpressure" in g[3] for g in got if g[0] == 503), got  # Serve's own refusal, not a failed request


def test_the_ingress_gate_admits_its_limit_and_refuses_the_rest_at_once(served, corpus):
    """With admit_in_flight, the ingress's own gate answers each request beyond its limit 503 with Retry-After at once
    (no queue); a request that failed gives its slot back, and health is never gated."""
    url = served[0] + "/gated"
    got = _burst(url + "/v1/rerank", corpus)
    assert all("1 requests in flight" in g[3] for g in got if g[0] == 503), got  # the gate's refusal, not Serve's
    missing = requests.post(url + "/v1/rerank", json={"query": "q", "documents": ["nope"]}, timeout=60)
    assert missing.status_code == 404, missing.text
    for _ in range(3):  # one at a time, each is admitted: every slot taken by the burst and the 404 came back
        r = requests.post(url + "/v1/rerank", json={"query": "q", "documents": corpus.image_ids[:2]}, timeout=60)
        assert r.status_code == 200, r.text
    assert requests.get(url + "/healthz", timeout=60).status_code == 200


def _replicas_seen(url, http, corpus, n=24):
    """Reranker replica ids that answer n concurrent requests (sequential ones may all go to one replica)."""
    def call(_):
        r = requests.post(url + "/v1/rerank", json={"query": "q", "documents": corpus.image_ids[:2]},
                          headers=dict(http.headers), timeout=60)
        assert r.status_code == 200, r.text
        return r.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(12) as pool:
        return set(pool.map(call, range(n)))


def test_bad_input_does_not_take_a_replica_down(served, corpus):
    url, http = served
    before = _replicas_seen(url, http, corpus)
    assert len(before) == 2  # two reranker replicas answer
    bad = [({"query": "q", "documents": ["nope"]}, 404), ({"query": "q", "documents": [corpus.image_ids[0], "x" * 600]}, 422),
           ({"query": ""}, 422), ("garbage", 422), ({"query": "q", "documents": [{"id": None}]}, 422),
           ({"query": "q", "documents": corpus.image_ids[:2], "top_n": -1}, 422)]
    for _ in range(3):
        for body, status in bad:
            r = http.post(url + "/v1/rerank", data=body) if isinstance(body, str) else http.post(url + "/v1/rerank", json=body)
            assert r.status_code == status, (body, r.text)
    # The same two replicas still answer: none was replaced.
    assert _replicas_seen(url, http, corpus) == before


# ------------------------------------------------------------------------------------------ fuzzing
@pytest.mark.parametrize("prefix, auth", [("", True), ("/miner", False), ("/nominer", False)])
def test_schema_fuzz_finds_no_server_error(served, prefix, auth):
    """Schemathesis generates requests from each app's /openapi.json (valid and invalid); none may get a 5xx."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    url, _ = served
    schema = schemathesis.openapi.from_url(url + prefix + "/openapi.json")
    headers = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
    seen = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call(base_url=url + prefix, headers=headers, timeout=60)
            seen.append(response.status_code)
            assert response.status_code < 500, f"{case.method} {case.path} {case.body!r} -> {response.status_code} {response.text}"

        check()
    assert 200 in seen and any(400 <= s < 500 for s in seen), sorted(set(seen))


# ------------------------------------------------------------------------------- fault tolerance
def test_killed_reranker_replica_is_replaced_under_load(served, corpus):
    import ray
    from ray import serve

    url, http = served
    before = _replicas_seen(url, http, corpus)
    handle = serve.get_deployment_handle("Reranker", app_name="edje")
    victim = handle.actor_name.remote().result()
    stop, statuses = threading.Event(), []

    def load():
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {TOKEN}"
        while not stop.is_set():
            try:
                statuses.append(s.post(url + "/v1/rerank", json={"query": "q", "documents": corpus.image_ids[:4]},
                                       timeout=30).status_code)
            except requests.RequestException:
                statuses.append(-1)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    deadline, replacement = time.time() + 120, None
    while time.time() < deadline and replacement is None:
        time.sleep(1.0)
        try:
            r = http.post(url + "/v1/rerank", json={"query": "q", "documents": corpus.image_ids[:4]}, timeout=30)
            if r.status_code == 200 and r.headers[REPLICA_HEADER] not in before:
                replacement = r.headers[REPLICA_HEADER]
        except requests.RequestException:
            pass
    stop.set()
    for t in threads:
        t.join(60)
    assert replacement, f"no new replica served within 120 s; statuses seen: {sorted(set(statuses))}"
    assert statuses.count(200) > 0
    # Later requests succeed, every one, from the surviving replica and its replacement.
    after = _replicas_seen(url, http, corpus)
    assert len(after) == 2 and replacement in after and len(after & before) == 1
    # While the replica was gone, requests failed fast with a 5xx (or a dropped connection), never a 4xx.
    assert all(s == 200 or s >= 500 or s == -1 for s in statuses), sorted(set(statuses))


def test_python_api_rank_equals_http_rerank(served, corpus):
    """`EDJEReranker.rank` over the served tables gives the scores of POST /v1/rerank (fp32, within 1e-4)."""
    from edje import EDJEReranker

    url, http = served
    docs = corpus.image_ids[3:15]
    query = corpus.captions[4]
    api = EDJEReranker.from_pretrained(corpus.checkpoint).open_tables(corpus.compressed_tables)
    ranked = api.rank(query, docs)
    body = http.post(url + "/v1/rerank", json={"query": query, "documents": docs, "raw_scores": True}).json()
    assert [h["corpus_id"] for h in ranked] == [x["index"] for x in body["results"]]
    np.testing.assert_allclose([h["score"] for h in ranked], [x["relevance_score"] for x in body["results"]], atol=1e-4)
    calibrated = http.post(url + "/v1/rerank", json={"query": query, "documents": docs}).json()
    np.testing.assert_allclose([h["relevance"] for h in ranked], [x["relevance_score"] for x in calibrated["results"]],
                               atol=1e-4)
