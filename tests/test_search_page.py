"""The search page (GET /ui) and the routes it stands on: thumbnails, the search response's first-stage order and
the caption's own image, live images with a thumbnail.

Fast tests build the FastAPI app in-process (no Ray); the slow ones serve a small sample world with Ray Serve
whose stored image urls point at a loopback server that has stopped, as after the quickstart.
"""
from __future__ import annotations

import base64
import io
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image
from world_serving import Remote

from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.startup import StartupConfig

os.environ.update(StartupConfig().env())

TOKEN = "page-token"
UI = Path(__file__).resolve().parent.parent / "serving" / "ui"


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ in-process
class _Reranker:
    def __init__(self, urls=None):
        self.image_urls = Remote(lambda ids: [(urls or {}).get(i) for i in ids])


def _app(tmp_path, ui=True, **fields):
    """The app one Ingress replica would serve for a configuration, built without Ray (routes only)."""
    from edje.model.ranking import RankingConfig
    from edje.serving.ingress import Ingress, build_api
    from edje.serving.shards import ShardedCorpus

    reranker = fields.pop("reranker", None) or _Reranker()
    cls = Ingress.func_or_class
    ing = cls.__new__(cls)  # no __init__: nothing is loaded, the deployments are stand-ins
    ing.config = ServeConfig(miner_image_tables=("unused",), caption_sources=("unused",), ui=ui, auth_token=TOKEN,
                             live_dir=str(tmp_path / "live"), **fields)
    ing.auth_token, ing.checkpoint_meta, ing.ranking = TOKEN, None, RankingConfig()
    ing.corpus, ing.miner = ShardedCorpus([reranker], []), object()
    return build_api(ing)


def _client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)


def test_the_page_is_served_when_on_and_404_when_off(tmp_path):
    on = _client(_app(tmp_path))
    page = on.get("/ui")  # redirected to /ui/, where relative asset paths resolve
    assert page.status_code == 200 and page.url.path == "/ui/" and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "img-src 'self' blob:" in csp
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("index.html", "text/html")):
        r = on.get(f"/ui/{name}")  # public: the files hold no data
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and r.content == (UI / name).read_bytes()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for other in ("/ui/missing.js", "/ui/%2e%2e%2fsearch_page.py"):  # only the page's own files are public, or there
        assert on.get(other).status_code == 401 and on.get(other, headers=auth).status_code == 404
    assert "/ui" not in on.get("/openapi.json").json()["paths"]
    off = _client(_app(tmp_path, ui=False))
    for path in ("/ui", "/ui/", "/ui/app.js"):
        assert off.get(path).status_code in (401, 404)  # no page: not public, and no route behind the token
        assert off.get(path, headers=auth).status_code == 404


def test_no_api_route_becomes_public_with_the_page(tmp_path):
    client = _client(_app(tmp_path, image_dir=str(tmp_path)))
    spec = client.get("/openapi.json").json()["paths"]
    assert "/v1/images/{image_id}/thumbnail" in spec
    for path, ops in spec.items():
        if path in ("/healthz", "/readyz"):
            continue
        for method in ops:
            concrete = path.replace("{image_id}", "sw_000000")
            r = client.request(method, concrete, json={})
            assert r.status_code == 401, (method, path, r.status_code)


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.scripts, self.styles, self.urls = {}, [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids[a["id"]] = (tag, a)
        if tag == "script":
            self.scripts.append(a.get("src"))
        if tag == "link" and a.get("rel") == "stylesheet":
            self.styles.append(a.get("href"))
        self.urls += [v for k, v in attrs if k in ("src", "href", "action") and v]


def test_the_page_has_its_key_elements_and_loads_nothing_from_elsewhere(tmp_path):
    html = _client(_app(tmp_path)).get("/ui/").text
    page = _Elements()
    page.feed(html)
    want = {"query": "textarea", "search-form": "form", "search-button": "button", "top-k": "input",
            "first-stage": "ol", "reranked": "ol", "summary": "p", "picked": "div", "image-weight": "input",
            "add-form": "form", "add-url": "input", "add-file": "input", "token-dialog": "dialog",
            "token-input": "input", "corpus": "div"}
    assert {k: page.ids.get(k, (None,))[0] for k in want} == want
    assert page.ids["token-input"][1]["type"] == "password" and page.ids["add-file"][1]["type"] == "file"
    assert page.scripts == ["app.js"] and page.styles == ["style.css"]
    assert not [u for u in page.urls if "//" in u or u.startswith("/")], page.urls  # relative, same origin only
    js = (UI / "app.js").read_text()
    assert "sessionStorage" in js and "Authorization" in js and "createObjectURL" in js
    assert not re.search(r"https?://", js + (UI / "style.css").read_text())  # no CDN, no outside host


def test_the_script_calls_only_routes_the_app_has(tmp_path):
    app = _app(tmp_path)
    routes = {}
    for r in app.routes:
        if hasattr(r, "methods"):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path)  # {image_id:path} -> {image_id}
            routes.setdefault(path, set()).update(r.methods)
    js = (UI / "app.js").read_text()
    table = re.search(r"const ROUTES = \{(.*?)\};", js, re.S).group(1)
    called = dict(re.findall(r'(\w+): "([^"]+)"', table))
    assert set(called) == {"info", "search", "addImage", "thumbnail"}
    for name, path in called.items():
        assert "/" + path in routes, (name, path, sorted(routes))
    assert routes["/v1/info"] >= {"GET"} and routes["/v1/images/{image_id}/thumbnail"] >= {"GET"}
    assert routes["/v1/search"] >= {"POST"} and routes["/v1/images"] >= {"POST"}
    # Every request goes through the one helper that adds the token: no other fetch, no bare path.
    assert re.findall(r"\bfetch\(([^,)]*)", js) == ["routeUrl(name"]
    assert set(re.findall(r'api\("(\w+)"', js)) == set(called)
    assert not re.findall(r'["\'`]/?v\d/', js.replace(table, ""))  # no api path outside ROUTES


def test_thumbnails_from_the_image_folder_and_live_bytes_behind_the_token(tmp_path):
    from edje.serving.live_sources import keep_source

    folder = tmp_path / "images"
    folder.mkdir()
    big = np.random.default_rng(0).integers(0, 256, (300, 500, 3), dtype=np.uint8)
    Image.fromarray(big).save(folder / "sw_000001.jpg", quality=90)
    (tmp_path / "secret.png").write_bytes(_png(big[:10, :10]))
    keep_source(str(tmp_path / "live"), "live-abc", _png(big[:64, :32]))
    client = _client(_app(tmp_path, image_dir=str(folder),
                          reranker=_Reranker({"remote": "http://127.0.0.1:9/x.jpg"})))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/images/sw_000001/thumbnail").status_code == 401
    r = client.get("/v1/images/sw_000001/thumbnail", headers=auth)
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg" and "private" in r.headers["cache-control"]
    assert Image.open(io.BytesIO(r.content)).size == (256, 154)  # shrunk to fit 256, aspect kept
    again = client.get("/v1/images/sw_000001/thumbnail", headers={**auth, "If-None-Match": r.headers["etag"]})
    assert again.status_code == 304
    live = client.get("/v1/images/live-abc/thumbnail", headers=auth)
    assert live.status_code == 200 and Image.open(io.BytesIO(live.content)).size == (32, 64)  # never enlarged
    assert client.get("/v1/images/..%2Fsecret/thumbnail", headers=auth).status_code == 404  # not out of the folder
    assert client.get("/v1/images/nobody/thumbnail", headers=auth).status_code == 404
    # A stored url is fetched under the image-url policy: loopback is refused by default (502 naming why).
    refused = client.get("/v1/images/remote/thumbnail", headers=auth)
    assert refused.status_code == 502 and "loopback" in refused.json()["detail"]


def test_thumbnail_helpers():
    from edje.serving.thumbnails import make_thumbnail, prefix_url

    assert prefix_url("https://cdn.example/i/", "a b/c") == "https://cdn.example/i/a%20b%2Fc"
    assert prefix_url("https://cdn.example/{image_id}.jpg?s=1", "x/../y") == "https://cdn.example/x%2F..%2Fy.jpg?s=1"
    tall = _png(np.zeros((1000, 100, 3), np.uint8))
    assert Image.open(io.BytesIO(make_thumbnail(tall))).size == (26, 256)
    with pytest.raises(ValueError):
        ServeConfig(miner_image_tables=("a",), caption_sources=("b",), image_url_prefix="file:///etc/")


# ------------------------------------------------------------------------------------------ served
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """16 test images; the table's urls name a loopback server that is stopped before anything is served."""
    from world_serving import encode_world

    from edje.sampleworld.server import serve_directory

    root = tmp_path_factory.mktemp("page-world")
    holder = root / "www"
    holder.mkdir()
    server = serve_directory(holder)
    base = server.base_url
    server.stop()
    return encode_world(root, 43, 16, base), base


@pytest.fixture(scope="module")
def served(ray_local, world, tmp_path_factory):
    from world_serving import CHECKPOINT, serving

    w, _ = world
    cfg = ServeConfig(checkpoint=CHECKPOINT, token_tables=(w.table,), caption_sources=(w.annotations,), ui=True,
                      image_dir=str(w.images), live_dir=str(tmp_path_factory.mktemp("page-live")), auth_token=TOKEN,
                      reranker=DeploymentResources(num_cpus=0.25))
    with serving(("edje", "/", cfg), token=TOKEN) as (url, http):
        yield url, http, cfg


@pytest.mark.slow
def test_the_served_page_loads_without_a_token(served):
    url, _, _ = served
    r = requests.get(url + "/ui", timeout=60)
    assert r.status_code == 200 and 'id="first-stage"' in r.text
    assert requests.get(url + "/ui/app.js", timeout=60).status_code == 200
    assert requests.get(url + "/v1/info", timeout=60).status_code == 401  # the API behind it keeps its token


@pytest.mark.slow
def test_a_corpus_thumbnail_comes_from_the_image_folder_after_the_image_server_stopped(served, world):
    url, http, _ = served
    w, base = world
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/images/{w.image_ids[0]}.jpg", timeout=5)  # the stored url is dead
    assert requests.get(f"{url}/v1/images/{w.image_ids[0]}/thumbnail", timeout=60).status_code == 401
    r = http.get(f"{url}/v1/images/{w.image_ids[0]}/thumbnail", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg", r.text[:200]
    shown = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), np.float32)
    source = np.asarray(Image.open(w.images / f"{w.image_ids[0]}.jpg").convert("RGB"), np.float32)
    assert shown.shape == source.shape and np.abs(shown - source).mean() < 8  # the same picture, re-encoded
    assert http.get(f"{url}/v1/images/not-an-image/thumbnail", timeout=60).status_code == 404


@pytest.mark.slow
def test_search_gives_the_first_stage_order_and_marks_the_captions_image(served, world):
    url, http, _ = served
    w, _ = world
    target = 5
    body = http.post(url + "/v1/search", json={"query": w.captions[target], "top_k": 8, "return_first_stage": True},
                     timeout=120).json()
    first = body["first_stage"]
    assert len(first) == 8 and [x["first_stage_score"] for x in first] == sorted(
        (x["first_stage_score"] for x in first), reverse=True)
    assert body["expected_image_id"] == w.image_ids[target] and body["reranked"]
    ranks = {x["image_id"]: n for n, x in enumerate(first, 1)}
    for res in body["results"]:
        assert res["first_stage_rank"] == ranks[res["image_id"]] and "ranking_score" in res
    assert [r["ranking_score"] for r in body["results"]] == sorted((r["ranking_score"] for r in body["results"]),
                                                                   reverse=True)
    # Backwards compatible: without the flag and for a text that is nobody's caption, neither field is there.
    plain = http.post(url + "/v1/search", json={"query": "a shape somewhere", "top_k": 4}, timeout=120).json()
    assert "first_stage" not in plain and "expected_image_id" not in plain and len(plain["results"]) == 4
    # Mixed-modal: a corpus image and a text; the image is never among its own results.
    mixed = http.post(url + "/v1/search", json={"image": w.image_ids[0], "query": w.captions[target], "top_k": 6,
                                                "return_first_stage": True}, timeout=120).json()
    assert mixed["reranked"] and w.image_ids[0] not in [x["image_id"] for x in mixed["first_stage"]]
    assert mixed["expected_image_id"] == w.image_ids[target]
    alone = http.post(url + "/v1/search", json={"image": w.image_ids[0], "top_k": 5, "return_first_stage": True},
                      timeout=120).json()
    assert not alone["reranked"] and [x["image_id"] for x in alone["results"]] == [
        x["image_id"] for x in alone["first_stage"]]


@pytest.mark.slow
def test_an_added_image_has_a_thumbnail_and_is_searched_at_once(served, world):
    url, http, cfg = served
    w, _ = world
    pixels = np.asarray(Image.open(w.images / f"{w.image_ids[3]}.jpg").convert("RGB"))[:, ::-1].copy()  # mirrored
    data = _png(pixels)
    r = http.post(url + "/v1/images", json={"image": "data:image/png;base64," + base64.b64encode(data).decode(),
                                            "id": "mirrored-3"}, timeout=120)
    assert r.status_code == 200, r.text
    from edje.serving.live_sources import source_path

    assert Path(source_path(cfg.live_dir, "mirrored-3")).read_bytes() == data  # the bytes are kept
    thumb = http.get(url + "/v1/images/mirrored-3/thumbnail", timeout=60)
    assert thumb.status_code == 200 and Image.open(io.BytesIO(thumb.content)).size == pixels.shape[1::-1]
    near = http.post(url + "/v1/search", json={"image": "mirrored-3", "top_k": 3}, timeout=120)
    assert near.status_code == 200 and len(near.json()["results"]) == 3
    found = http.post(url + "/v1/search", json={"query": w.captions[3], "top_k": 17, "return_first_stage": True},
                      timeout=120).json()
    assert "mirrored-3" in [x["image_id"] for x in found["first_stage"]]  # indexed by the first stage already
