"""What the HTTP API tells a drop-in client, in-process (no Ray): text documents are refused with a message that says
this server ranks images, over-long texts follow `truncate` (cut and reported, or 413), unknown fields are 422 named
while the fields real clients send are accepted, and a call whose replica was lost is made once more.

The ingress is the class Serve deploys, built without Serve; its texts are measured with the shipped checkpoint's
own tokenizer. The reranker and first stage behind it are stand-ins that record what they are asked (the scores
are not under test here: tests/test_serving.py compares served scores with the model's).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from world_serving import CHECKPOINT, Remote

from edje.serving.config import ServeConfig

IDS = ["img_a", "img_b", "img_c"]


class _Reranker:
    """Records the pairs the ingress asks it to score; pair i scores -i (so the order is the request's)."""

    def __init__(self):
        self.calls = []
        self.score_pairs = Remote(self._score)

    def _score(self, texts, image_ids, with_urls=False, text_embeddings=None, images=None):
        self.calls.append((list(texts), list(image_ids)))
        return SimpleNamespace(missing=[], rejected=None, logits=-np.arange(len(image_ids), dtype=np.float32),
                               urls=[None] * len(image_ids), replica="stand-in", batch_pairs=len(image_ids))


class _FirstStage:
    """Answers every text search with IDS, and records the texts it embedded."""

    def __init__(self):
        self.texts = []
        self.search_text = Remote(self._search_text)

    def _search_text(self, query, k):
        from edje.serving.first_stage import ImageQueryHits

        self.texts.append(query)
        return ImageQueryHits([(i, 0.5 - 0.1 * n) for n, i in enumerate(IDS[:k])], np.ones(4, np.float32), [])


@pytest.fixture(scope="module")
def api():
    """(TestClient, stand-in reranker, stand-in first stage) of an ingress over the shipped checkpoint's tokenizer."""
    from fastapi.testclient import TestClient

    from edje.model.edje import read_checkpoint_config
    from edje.model.ranking import RankingConfig
    from edje.serving.ingress import Ingress, TextLimit, build_api
    from edje.serving.shards import ShardedCorpus

    ing = object.__new__(Ingress.func_or_class)  # the class Serve deploys, without Serve
    ing.config = ServeConfig(miner_image_tables=("unused",), caption_sources=("unused",), auth_token_env=None)
    ing.auth_token, ing.ranking, ing.miner = None, RankingConfig(), None
    ing.checkpoint_meta = read_checkpoint_config(CHECKPOINT)
    ing.text_limit = TextLimit.of_checkpoint(CHECKPOINT, ing.checkpoint_meta)
    reranker, first_stage = _Reranker(), _FirstStage()
    ing.corpus = ShardedCorpus([reranker], [first_stage])
    return TestClient(build_api(ing)), reranker, first_stage


def _words(n: int) -> str:
    """A text of exactly n wordpieces for the checkpoint's tokenizer (checked where used)."""
    return " ".join(["red"] * n)


# ------------------------------------------------------------------------------------------ text documents
@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank"])
def test_a_text_document_is_refused_saying_the_server_ranks_images(api, route):
    client, reranker, _ = api
    before = len(reranker.calls)
    r = client.post(route, json={"query": "a red circle", "documents": ["img_a", {"text": "a red circle on grass"}]})
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert message == ("documents.1: this server ranks images: send a corpus image id as {'id': ...} or a plain "
                       "string, or an image as {'image': url | base64}"), message
    assert len(reranker.calls) == before  # refused before anything was scored


def test_image_documents_still_name_their_images(api):
    client, reranker, _ = api
    # Plain strings are image ids (what Cohere's SDK sends); a text beside an id is ignored; id/image_id/image objects.
    docs = ["img_a", {"id": "img_b", "text": "a caption"}, {"image_id": "img_c"}, {"image": "img_d"}]
    r = client.post("/v1/rerank", json={"query": "q", "documents": docs})
    assert r.status_code == 200, r.text
    assert reranker.calls[-1][1] == ["img_a", "img_b", "img_c", "img_d"]


@pytest.mark.parametrize("doc, needle", [
    ({"id": "img_a", "image_id": "img_b"}, "names its image once"),
    ({"id": "img_a", "title": "x"}, "unknown document fields ['title']"),
    ({}, "names its image by 'id', 'image_id' or 'image'"),
])
def test_malformed_document_objects_get_one_message(api, doc, needle):
    client, _, _ = api
    r = client.post("/v1/rerank", json={"query": "q", "documents": [doc]})
    assert r.status_code == 422 and r.json()["message"].startswith("documents.0: ") and needle in r.json()["message"], r.text


# ------------------------------------------------------------------------------------------ truncate
def test_an_over_long_query_is_cut_and_reported_or_refused(api):
    client, reranker, _ = api
    from edje.model.edje import read_checkpoint_config
    from edje.serving.ingress import TextLimit

    text_limit = TextLimit.of_checkpoint(CHECKPOINT, read_checkpoint_config(CHECKPOINT))
    long, exact = _words(80), _words(64)
    assert text_limit.count([long, exact]) == [80, 64] and text_limit.max_tokens == 64
    m = read_checkpoint_config(CHECKPOINT)["config"]["encoder"]["num_image_tokens"]

    r = client.post("/v1/rerank", json={"query": long, "documents": IDS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["truncated"] == {"kept": 64, "query_tokens": 80}
    assert "first 64 of its 80 wordpieces" in body["meta"]["warnings"][0]
    assert body["usage"]["total_tokens"] == 3 * (64 + 3 + m)  # what the encoder read: 64 wordpieces per pair
    assert reranker.calls[-1][0] == [long] * 3  # the joint encoder cuts it (model/joint_encoder.py)

    cohere = client.post("/v2/rerank", json={"query": long, "documents": IDS}).json()
    assert cohere["meta"]["truncated"] == {"kept": 64, "query_tokens": 80} and cohere["meta"]["warnings"]
    assert cohere["meta"]["api_version"] == {"version": "2"}
    search = client.post("/v1/search", json={"query": long, "top_k": 3})
    assert search.status_code == 200 and search.json()["meta"]["truncated"]["query_tokens"] == 80, search.text

    for route, body in (("/v1/rerank", {"documents": IDS}), ("/v2/rerank", {"documents": IDS}), ("/v1/search", {})):
        r = client.post(route, json={"query": long, "truncate": False, **body})
        assert r.status_code == 413, (route, r.text)
        assert r.json()["detail"].startswith("query: 80 wordpieces, more than the 64 the model reads"), r.text

    # At the limit nothing is said; truncate: false lets it through.
    for flag in (True, False):
        r = client.post("/v1/rerank", json={"query": exact, "documents": IDS, "truncate": flag})
        assert r.status_code == 200 and "meta" not in r.json(), r.text
        assert "truncated" not in client.post("/v2/rerank", json={"query": exact, "documents": IDS}).json()["meta"]


def test_over_long_candidate_texts_follow_truncate(api):
    client, _, _ = api
    texts = ["a red circle", _words(70), "a blue square", _words(90)]
    r = client.post("/v1/rerank/texts", json={"image": "img_a", "texts": texts})
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["truncated"] == {"kept": 64, "texts": [{"index": 1, "tokens": 70}, {"index": 3, "tokens": 90}]}
    r = client.post("/v1/rerank/texts", json={"image": "img_a", "texts": texts, "truncate": False})
    assert r.status_code == 413 and r.json()["detail"].startswith("texts.1: 70 wordpieces"), r.text


def test_the_cohere_sdk_reads_the_meta(api):
    pytest.importorskip("cohere")
    from cohere import V2RerankResponse

    client, _, _ = api
    body = client.post("/v2/rerank", json={"query": _words(80), "documents": IDS}).json()
    parsed = V2RerankResponse.model_validate(body)
    assert [x.index for x in parsed.results] == [0, 1, 2] and parsed.meta.warnings
    assert parsed.meta.truncated == {"kept": 64, "query_tokens": 80}  # Cohere's ApiMeta keeps fields it does not know


# ------------------------------------------------------------------------------------------ unknown fields
@pytest.mark.parametrize("route, body, field", [
    ("/v1/rerank", {"query": "q", "documents": IDS, "top_k": 3}, "top_k"),
    ("/v2/rerank", {"query": "q", "documents": IDS, "max_chunks": 2}, "max_chunks"),
    ("/v1/rerank/texts", {"image": "img_a", "texts": ["a"], "documents": ["x"]}, "documents"),
    ("/v1/search", {"query": "q", "top_m": 5}, "top_m"),
])
def test_unknown_fields_are_refused_by_name(api, route, body, field):
    client, _, _ = api
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith(f"unknown field '{field}': not part of this API"), r.text


@pytest.mark.parametrize("route, extra", [
    ("/v2/rerank", {"model": "rerank-v3.5", "top_n": 2, "max_tokens_per_doc": 4096, "priority": None}),  # Cohere v2 SDK
    ("/v1/rerank", {"model": "rerank-english-v3.0", "rank_fields": ["text"], "return_documents": True,
                    "max_chunks_per_doc": 10}),  # Cohere v1 SDK
    ("/v1/rerank", {"model": "jina-reranker-m0", "top_n": 2, "return_documents": False}),  # Jina
    ("/v1/rerank", {"raw_scores": True, "return_text": False, "truncate": True, "truncation_direction": "Right"}),  # TEI
])
def test_fields_that_real_clients_send_are_accepted(api, route, extra):
    client, _, _ = api
    r = client.post(route, json={"query": "q", "documents": IDS, **extra})
    assert r.status_code == 200, r.text


def test_a_left_truncation_is_refused_and_openapi_documents_the_ignored_fields(api):
    client, _, _ = api
    r = client.post("/v1/rerank", json={"query": "q", "documents": IDS, "truncation_direction": "left"})
    assert r.status_code == 422 and "truncation_direction" in r.json()["message"], r.text
    props = client.get("/openapi.json").json()["components"]["schemas"]["RerankRequest"]
    assert props["additionalProperties"] is False
    for field in ("max_tokens_per_doc", "priority", "rank_fields", "max_chunks_per_doc", "return_text"):
        assert props["properties"][field]["description"].startswith("ignored ("), field
    assert "max_chunks" in props["properties"]["max_chunks_per_doc"]["description"]  # says max_chunks is refused
    assert props["properties"]["truncate"]["default"] is True


# ------------------------------------------------------------------------------------------ a lost replica
class _Flaky:
    """A deployment method whose first `failures` calls fail with `error`."""

    def __init__(self, error: Exception, failures: int):
        self.error, self.failures, self.calls = error, failures, 0

    async def remote(self, *args):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return ("answer", args)


def test_a_call_whose_replica_died_is_made_once_more():
    import asyncio

    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from edje.serving.shards import call_with_retry

    died = _Flaky(ActorDiedError(), 1)
    assert asyncio.run(call_with_retry(died, 1, 2)) == ("answer", (1, 2)) and died.calls == 2
    gone = _Flaky(ActorUnavailableError("unreachable", b"\x00" * 16), 2)  # lost twice: the second failure is raised
    with pytest.raises(ActorUnavailableError):
        asyncio.run(call_with_retry(gone))
    assert gone.calls == 2
    bad = _Flaky(ValueError("a bad request"), 1)  # not a lost replica: never retried
    with pytest.raises(ValueError):
        asyncio.run(call_with_retry(bad))
    assert bad.calls == 1


def test_a_replica_lost_twice_is_503_with_retry_after(api):
    from ray.exceptions import ActorDiedError

    client, reranker, _ = api
    saved = reranker.score_pairs
    reranker.score_pairs = _Flaky(ActorDiedError(), 5)
    try:
        r = client.post("/v1/rerank", json={"query": "q", "documents": IDS})
    finally:
        reranker.score_pairs = saved
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "ActorDiedError" in r.json()["detail"], r.text


def test_the_admission_gate_refuses_beyond_its_limit_at_once_and_frees_each_slot():
    """AdmissionGate over an app whose requests wait on an event: with two in flight the third is 503 with Retry-After
    at once, public paths pass, and each slot comes back when its request ends (a failed one too)."""
    import asyncio

    import httpx
    from fastapi import FastAPI

    from edje.serving.http_guards import AdmissionGate

    release, entered = asyncio.Event(), []
    app = FastAPI()

    @app.get("/slow")
    async def slow():
        entered.append(1)
        await release.wait()
        return {"ok": True}

    @app.get("/fail")
    async def fail():
        raise ValueError("a handler that fails")

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    gate = AdmissionGate(app, limit=2, retry_after_s=1.5, exempt=frozenset({"/healthz"}))

    async def scenario():
        transport = httpx.ASGITransport(app=gate, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gate") as client:
            held = [asyncio.ensure_future(client.get("/slow")) for _ in range(2)]
            while len(entered) < 2:
                await asyncio.sleep(0.001)
            refused = await client.get("/slow")
            health = await client.get("/healthz")
            release.set()
            answered = await asyncio.gather(*held)
            failed = await client.get("/fail")
            after = [await client.get("/healthz"), await client.get("/slow"), await client.get("/slow")]
            return refused, health, answered, failed, after, gate.in_flight

    refused, health, answered, failed, after, in_flight = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "2", refused.text
    assert "2 requests in flight" in refused.json()["detail"]
    assert health.status_code == 200 and [r.status_code for r in answered] == [200, 200]
    assert failed.status_code == 500 and [r.status_code for r in after] == [200, 200, 200] and in_flight == 0


# ------------------------------------------------------------------------------------------ the ingress's weight
INGRESS_PROBE = """
import json, sys
import numpy as np
from edje.model.checkpoint_files import read_checkpoint_config
from edje.model.ranking import read_ranking
from edje.serving.ingress import TextLimit
ck, texts = sys.argv[1], json.loads(sys.argv[2])
limit = TextLimit.of_checkpoint(ck, read_checkpoint_config(ck))
read_ranking(ck).fuse(np.zeros(2, np.float32), [0.5, 0.25])
print(json.dumps([limit.count(texts), sorted(m for m in ("torch", "transformers") if m in sys.modules)]))
"""


def test_the_ingress_reads_a_checkpoint_without_torch_and_counts_as_the_model_does(tmp_path):
    """The ingress replica imports no torch or transformers: its module, the checkpoint's config and ranking rule, and
    the tokenizer.json it measures texts with; the counts equal transformers' on the same folder, and a checkpoint
    whose tokenizer has no tokenizer.json is measured by transformers."""
    from transformers import AutoTokenizer

    from edje.model.checkpoint_files import read_checkpoint_config
    from edje.serving.ingress import TextLimit

    texts = ["a small dog facing left", "dog (small, facing left) left of cat (large); Naïve café, über-long", "",
             _words(90)]
    out = subprocess.run([sys.executable, "-c", INGRESS_PROBE, str(CHECKPOINT), json.dumps(texts)],
                         capture_output=True, text=True, check=True).stdout
    counts, heavy = json.loads(out.strip().splitlines()[-1])
    assert heavy == [], f"the ingress imported {heavy}"
    slow = AutoTokenizer.from_pretrained(str(CHECKPOINT) + "/tokenizer")
    assert counts == [len(x) for x in slow(texts, add_special_tokens=False)["input_ids"]] and counts[2] == 0

    # A tokenizer saved without its fast file: transformers measures it, with the same counts.
    copy = tmp_path / "ck"
    shutil.copytree(CHECKPOINT, copy)
    (copy / "tokenizer" / "tokenizer.json").unlink()
    slow.save_pretrained(str(tmp_path / "vocab"), legacy_format=True)
    for f in (tmp_path / "vocab").iterdir():
        if f.name != "tokenizer.json":
            shutil.copy(f, copy / "tokenizer" / f.name)
    fallback = TextLimit.of_checkpoint(str(copy), read_checkpoint_config(str(copy)))
    assert not hasattr(fallback.tokenizer, "encode_batch") and fallback.count(texts) == counts
