"""Live images over real HTTP on loopback: POST /v1/images, image documents by url and base64, bad input, restart.

One Serve app with two reranker replicas and a live folder; images are served to it by the sample
world's loopback file server. Corpus image 0 is added once more as `copy-0` (the `copy_0` fixture), for every test
that reads it, so each test also runs alone. The restart tests run last (the first compacts the live log before
redeploying).
"""
from __future__ import annotations

import base64
import io
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from edje.sampleworld.server import serve_directory
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.ingress import REPLICA_HEADER
from edje.serving.live_log import LiveLog
from edje.serving.random_corpus import write_random_corpus
from edje.serving.startup import StartupConfig

os.environ.update(StartupConfig().env())

TOKEN = "live-token"
MAX_IMAGE_BYTES = 200_000
MAX_IMAGE_PIXELS = 1_000_000
pytestmark = pytest.mark.slow


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_edje_config):
    return write_random_corpus(str(tmp_path_factory.mktemp("live-corpus")), tiny_edje_config, num_images=48)


@pytest.fixture(scope="module")
def images(tmp_path_factory, corpus):
    """A loopback file server with: corpus image 0 as PNG (the stored pixels), a too-large file, a bomb, junk."""
    from edje.model.backbone import VisionBackbone

    root = tmp_path_factory.mktemp("images")
    size = VisionBackbone.create(corpus.config.backbone).preprocess.size
    # write_random_corpus's images: the same generator, seed 0, drawn in one call.
    pixels = np.random.default_rng(0).integers(0, 256, (48, size, size, 3), dtype=np.uint8)
    (root / "img0.png").write_bytes(_png(pixels[0]))
    (root / "img1.png").write_bytes(_png(pixels[1]))
    (root / "big.png").write_bytes(_png(np.random.default_rng(1).integers(0, 256, (400, 400, 3), dtype=np.uint8)))
    assert (root / "big.png").stat().st_size > MAX_IMAGE_BYTES
    (root / "bomb.png").write_bytes(_png(np.zeros((1200, 1200, 3), np.uint8)))  # small file, 1.44 M pixels
    (root / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    server = serve_directory(root)
    yield server, root
    server.stop()


def _config(corpus, live_dir) -> ServeConfig:
    return ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables), auth_token=TOKEN,
                       live_dir=live_dir, max_image_bytes=MAX_IMAGE_BYTES, max_image_pixels=MAX_IMAGE_PIXELS,
                       max_image_documents=4, image_fetch_timeout_s=5.0, image_url_hosts=("127.0.0.1",),
                       image_url_allow=("127.0.0.1/32",),  # the test's image server is on loopback, refused by default
                       reranker=DeploymentResources(num_replicas=2, num_cpus=0.5))


@pytest.fixture(scope="module")
def served(ray_local, corpus, tmp_path_factory):
    from world_serving import serving

    cfg = _config(corpus, str(tmp_path_factory.mktemp("live")))
    with serving(("live", "/", cfg), token=TOKEN) as (url, http):
        yield url, http, cfg


@pytest.fixture(scope="module")
def copy_0(served, images):
    """Corpus image 0 added again over HTTP, by url, as `copy-0`: the add's response."""
    url, http, _ = served
    server, _ = images
    return http.post(url + "/v1/images", json={"url": server.url("img0.png"), "id": "copy-0"}, timeout=120)


def _raw(http, url, query, documents):
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": documents, "raw_scores": True}, timeout=120)
    assert r.status_code == 200, r.text
    out = np.zeros(len(documents))
    for x in r.json()["results"]:
        out[x["index"]] = x["relevance_score"]
    return out, r


def test_an_added_image_scores_like_the_same_stored_image_on_every_replica(served, corpus, copy_0):
    url, http, _ = served
    r = copy_0
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "copy-0" and r.json()["corpus_size"] == 49 and r.json()["url"].endswith("img0.png")
    query = corpus.captions[0]

    def call(_):
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {TOKEN}"
        return _raw(s, url, query, ["img_00000", "copy-0", "img_00001"])

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, range(16)))
    # The same pixels through the live path (decode, backbone, adapter, int8) score as the offline-encoded row.
    for scores, _ in got:
        assert scores[1] == pytest.approx(scores[0], abs=1e-3) and scores[2] != pytest.approx(scores[0], abs=1e-6)
    assert len({resp.headers[REPLICA_HEADER] for _, resp in got}) == 2  # both replicas hold it
    hits = http.post(url + "/v1/search", json={"query": query, "top_k": 60, "raw_scores": True}, timeout=120).json()
    assert "copy-0" in [h["image_id"] for h in hits["results"]]  # the first stage indexed it too
    info = http.get(url + "/v1/info").json()
    assert info["corpus_size"] == 49 and info["live_images"]["enabled"]


def test_image_documents_by_url_and_base64_are_encoded_and_scored(served, images, corpus, copy_0):
    url, http, _ = served
    server, root = images
    b64 = base64.b64encode((root / "img0.png").read_bytes()).decode()
    query = corpus.captions[3]
    docs = ["img_00000", {"image": server.url("img0.png")}, {"image": b64}, {"image": "data:image/png;base64," + b64},
            {"image": server.url("img1.png")}]
    scores, r = _raw(http, url, query, docs)
    np.testing.assert_allclose(scores[1:4], scores[0], atol=1e-3)
    assert scores[4] == pytest.approx(_raw(http, url, query, ["img_00001"])[0][0], abs=1e-3)
    echoed = {x["index"]: x["document"] for x in r.json()["results"]}
    assert echoed[1]["url"] == server.url("img0.png") and echoed[1]["text"].startswith("sha256:")
    assert echoed[2]["text"] == echoed[1]["text"] and "url" not in echoed[2]  # same bytes, same content hash
    # Not raw: an uncalibrated checkpoint's relevance is sigmoid(score).
    plain = http.post(url + "/v1/rerank", json={"query": query, "documents": docs}).json()["results"]
    got = {x["index"]: x["relevance_score"] for x in plain}
    np.testing.assert_allclose([got[i] for i in range(5)], 1 / (1 + np.exp(-scores)), atol=1e-5)
    # Cohere's v2 SDK against /v2/rerank: documents are strings (image ids), the token its api key.
    import cohere

    co = cohere.ClientV2(api_key=TOKEN, base_url=url)
    ids = ["img_00002", "img_00000", "copy-0", "img_00005"]
    res = co.rerank(model="rerank-v3.5", query=query, documents=ids, top_n=3)
    expected, _ = _raw(http, url, query, ids)
    assert [x.index for x in res.results] == list(np.argsort(-expected, kind="stable")[:3])
    np.testing.assert_allclose([x.relevance_score for x in res.results],
                               1 / (1 + np.exp(-np.sort(expected)[::-1][:3])), atol=1e-5)
    with pytest.raises(cohere.errors.UnauthorizedError):
        cohere.ClientV2(api_key="wrong", base_url=url).rerank(model="m", query=query, documents=ids)
    # An over-long query is cut (truncate defaults to true) and the SDK's meta carries what was cut.
    res = co.rerank(model="rerank-v3.5", query=" ".join(["a"] * 80), documents=ids, max_tokens_per_doc=512)
    assert len(res.results) == 4 and res.meta.warnings and res.meta.truncated == {"kept": 64, "query_tokens": 80}


def test_bad_images_are_4xx_naming_the_problem(served, images, corpus, refused_url, copy_0):
    url, http, _ = served
    server, root = images
    junk64 = base64.b64encode(b"not an image at all").decode()
    dead = refused_url + "/x.png"
    cases = [
        ({"url": server.url("junk.png")}, 422, "not_an_image"),
        ({"image": junk64}, 422, "not_an_image"),
        ({"image": "%%% not base64 %%%"}, 422, "base64"),
        ({"url": server.url("missing.png")}, 422, "404"),
        ({"url": dead}, 422, "could not fetch"),
        ({"url": "http://images.example/x.png"}, 422, "not fetched by this server"),  # never resolved: not allowed
        ({"url": server.url("big.png")}, 413, "limit"),
        ({"image": base64.b64encode((root / "big.png").read_bytes()).decode()}, 422, "image"),  # over maxLength
        ({"url": server.url("bomb.png")}, 413, "decompression_bomb"),
        ({"url": server.url("img0.png"), "id": "copy-0"}, 409, "already in the corpus"),
        ({"url": server.url("img0.png"), "id": "img_00003"}, 409, "already in the corpus"),
        ({}, 422, "exactly one"),
        ({"url": server.url("img0.png"), "image": junk64}, 422, "exactly one"),
        ({"url": "ftp://127.0.0.1/x.png"}, 422, "url"),
    ]
    for body, status, needle in cases:
        r = http.post(url + "/v1/images", json=body, timeout=60)
        assert r.status_code == status, (body if len(str(body)) < 300 else list(body), r.text[:300])
        payload = r.json()
        assert needle in str(payload.get("message") or payload["detail"]), (needle, r.text[:300])
    # A short bare string is an id (404 when unknown); a data: url is image bytes whatever its length.
    r = http.post(url + "/v1/rerank", json={"query": "q", "documents": ["img_00000", {"image": junk64}]})
    assert r.status_code == 404 and junk64 in r.json()["detail"], r.text
    r = http.post(url + "/v1/rerank", json={"query": "q", "documents": ["img_00000",
                                                                     {"image": "data:image/png;base64," + junk64}]})
    assert r.status_code == 422 and "documents.1: not_an_image" in r.json()["detail"], r.text
    r = http.post(url + "/v1/rerank", json={"query": "q", "documents": [{"image": dead}]})
    assert r.status_code == 422 and "documents.0: could not fetch" in r.json()["detail"], r.text
    r = http.post(url + "/v1/rerank", json={"query": "q", "documents": [{"image": server.url("img0.png")}] * 5})
    assert r.status_code == 422 and "at most 4 image documents" in r.json()["message"], r.text
    assert http.get(url + "/v1/info").json()["corpus_size"] == 49  # nothing bad was added
    schema = requests.get(url + "/openapi.json").json()["components"]["schemas"]["AddImageRequest"]["properties"]
    image = [s for s in schema["image"]["anyOf"] if s.get("type") == "string"][0]
    assert image["maxLength"] == 4 * -(-MAX_IMAGE_BYTES // 3) + 64
    assert [s for s in schema["url"]["anyOf"] if s.get("type") == "string"][0]["pattern"].startswith("^https?://")


def test_added_images_survive_a_restart(served, images, corpus, copy_0):
    from ray import serve

    from edje.serving.app import build

    url, http, cfg = served
    _, root = images
    data = (root / "img1.png").read_bytes()
    r = http.post(url + "/v1/images", json={"image": base64.b64encode(data).decode()}, timeout=120)
    assert r.status_code == 200, r.text
    new_id = r.json()["id"]
    assert new_id.startswith("live-") and r.json()["sha256"].startswith(new_id[5:])
    query = corpus.captions[7]
    before, _ = _raw(http, url, query, ["copy-0", new_id, "img_00001"])
    live = LiveLog(cfg.live_dir)
    assert live.poll().num_rows == 2 and not os.path.exists(os.path.join(cfg.live_dir, "tables"))  # no file per image

    serve.delete("live")
    assert live.compact()["rows"] == 2  # the redeployed replicas read the images from a compacted part
    serve.run(build(cfg), name="live", route_prefix="/")
    after, _ = _raw(http, url, query, ["copy-0", new_id, "img_00001"])
    np.testing.assert_allclose(after, before, atol=1e-5)
    assert after[1] == pytest.approx(after[2], abs=1e-3)  # the base64 image is img_00001's pixels
    assert http.get(url + "/v1/info").json()["corpus_size"] == 50
    r = http.post(url + "/v1/images", json={"image": base64.b64encode(data).decode()}, timeout=120)
    assert r.status_code == 409, r.text  # the same content again: its default id is taken


def test_images_added_through_both_replicas_while_compactions_run_are_served_once_after_a_restart(served, corpus):
    import threading

    from ray import serve

    from edje.model.backbone import VisionBackbone
    from edje.serving.app import build

    url, http, cfg = served
    before = http.get(url + "/v1/info").json()["corpus_size"]
    size = VisionBackbone.create(corpus.config.backbone).preprocess.size
    rng = np.random.default_rng(7)
    n = 24
    bodies = [{"image": base64.b64encode(_png(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))).decode(),
               "id": f"burst-{i:02d}"} for i in range(n)]
    stop, compactions = threading.Event(), []

    def compact_meanwhile():  # a third process's compactions (an operator's `live_log compact`) beside the replicas
        live = LiveLog(cfg.live_dir)
        while not stop.is_set():
            got = live.compact()
            if got:
                compactions.append(got)
            stop.wait(0.05)

    def add(body):
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {TOKEN}"
        return s.post(url + "/v1/images", json=body, timeout=120)

    compactor = threading.Thread(target=compact_meanwhile)
    compactor.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(add, bodies))
    finally:
        stop.set()
        compactor.join()
    assert [r.status_code for r in answers] == [200] * n, [r.text for r in answers if r.status_code != 200]
    assert compactions, "no compaction ran while the images were added"
    def info(_):
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {TOKEN}"
        return s.get(url + "/v1/info", timeout=120).json()["live_images"]

    added_by = {}
    with ThreadPoolExecutor(8) as pool:  # concurrent calls spread over both replicas (an idle router may keep one)
        for _ in range(10):
            added_by.update({live["replica"]: live["added_here"] for live in pool.map(info, range(16))})
            if len(added_by) == 2:
                break
    assert len(added_by) == 2 and all(added_by.values()), added_by  # both replicas took adds

    serve.delete("live")
    serve.run(build(cfg), name="live", route_prefix="/")
    ids = [b["id"] for b in bodies]
    assert http.get(url + "/v1/info").json()["corpus_size"] == before + n
    hits = http.post(url + "/v1/search", json={"query": corpus.captions[0], "top_k": before + n}, timeout=120)
    assert hits.status_code == 200, hits.text
    found = [h["image_id"] for h in hits.json()["results"]]
    assert len(found) == before + n and len(set(found)) == len(found) and set(ids) <= set(found)  # each once
    r = http.post(url + "/v1/rerank", json={"query": corpus.captions[0], "documents": ids}, timeout=120)
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()["results"]) == list(range(n))
