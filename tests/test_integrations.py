"""Other frameworks' clients against a live server, with the real packages (`pip install -e ".[integrations]"`):
LangChain's CohereRerank over /v2/rerank, and edje.llama_index.EDJERerank (a LlamaIndex node postprocessor)
over /v1/rerank. Also: a plain string document that is an http(s) url is an image url on both rerank routes.

A small sample world is served by Ray Serve (the slow tests); its images are on a loopback file server, which
the app may reach because `image_url_allow` names loopback (refused by default). The url-string rule is also
checked in-process, against a stand-in reranker.
"""
from __future__ import annotations

import base64
import os
from types import SimpleNamespace

import numpy as np
import pytest
from world_serving import Remote

from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.startup import StartupConfig

os.environ.update(StartupConfig().env())

TOKEN = "integrations-token"
# The same JPEG through the live path (decode, backbone, adapter, int8) and through the offline encode of the
# world: two separately quantised token sets, ITM logits within 0.09 of each other (of a +-10 range), calibrated
# relevance within 0.011 on this world (measured); relevance across its images spans 0.3.
SAME_IMAGE_ATOL = 0.02


# ------------------------------------------------------------------------------------------ in-process
class _Reranker:
    """Records what the ingress asks it to score; every pair scores 0."""

    def __init__(self):
        self.calls = []
        self.score_pairs = Remote(self._score)

    def _score(self, texts, image_ids, with_urls=False, text_embeddings=None, images=None):
        self.calls.append((list(image_ids), images))
        return SimpleNamespace(missing=[], rejected=None, logits=np.zeros(len(image_ids)), urls=[None] * len(image_ids),
                               replica="stand-in", batch_pairs=len(image_ids))


def _api(tmp_path, **config):
    from fastapi.testclient import TestClient

    from edje.model.ranking import RankingConfig
    from edje.serving.ingress import Ingress, build_api
    from edje.serving.shards import ShardedCorpus

    ing = object.__new__(Ingress.func_or_class)  # the class Serve deploys, without Serve: routes and fetches only
    ing.config = ServeConfig(miner_image_tables=("unused",), caption_sources=("unused",), auth_token_env=None, **config)
    ing.auth_token, ing.ranking, ing.miner = None, RankingConfig(), None
    ing.checkpoint_meta = {"config": {"encoder": {"num_image_tokens": 16, "max_text_tokens": 32}}}
    reranker = _Reranker()
    ing.corpus = ShardedCorpus([reranker], [])
    return TestClient(build_api(ing)), reranker


def test_a_url_string_document_is_an_image_url_under_the_fetch_policy(tmp_path):
    from edje.sampleworld.server import serve_directory

    body = b"\x89PNG not decoded here: the stand-in reranker scores bytes unseen"
    (tmp_path / "a.png").write_bytes(body)
    with serve_directory(tmp_path) as server:
        image = server.url("a.png")
        refused, reranker = _api(tmp_path)  # default policy: loopback is refused before any connection
        for route in ("/v1/rerank", "/v2/rerank"):
            r = refused.post(route, json={"query": "q", "documents": [image, "img_1"]})
            assert r.status_code == 422 and r.json()["detail"].startswith("documents.0: ") and "loopback" in r.text, r.text
        assert reranker.calls == []
        allowed, reranker = _api(tmp_path, image_url_allow=("loopback",))
        for route in ("/v1/rerank", "/v2/rerank"):
            r = allowed.post(route, json={"query": "q", "documents": [image, "img_1"]})
            assert r.status_code == 200, r.text
        for ids, images in reranker.calls:  # the url was fetched and sent as image bytes; the id stayed an id
            assert ids[0].startswith("sha256:") and ids[1] == "img_1" and images == {0: body}
        echoed = allowed.post("/v1/rerank", json={"query": "q", "documents": [image]}).json()["results"][0]["document"]
        assert echoed["url"] == image


# ------------------------------------------------------------------------------------------ served


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """12 test images, served on loopback for the whole module; the table stores their urls."""
    from world_serving import encode_world

    from edje.sampleworld.server import serve_directory

    root = tmp_path_factory.mktemp("integrations-world")
    (root / "world").mkdir()
    server = serve_directory(root / "world")  # the world is generated into this folder below
    w = encode_world(root, 47, 12, server.base_url)
    yield w, server
    server.stop()


@pytest.fixture(scope="module")
def served(ray_local, world):
    from world_serving import CHECKPOINT, serving

    w, _ = world
    cfg = ServeConfig(checkpoint=CHECKPOINT, token_tables=(w.table,), auth_token=TOKEN,
                      image_url_allow=("loopback",),  # the test's image server; refused by default
                      reranker=DeploymentResources(num_cpus=0.25))
    with serving(("edje", "/", cfg), token=TOKEN) as (url, http):
        yield url, http


def _relevance(http, url, query, ids):
    """The server's calibrated relevance of each id, in id order."""
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": ids, "return_documents": False}, timeout=120)
    assert r.status_code == 200, r.text
    out = np.zeros(len(ids))
    for x in r.json()["results"]:
        out[x["index"]] = x["relevance_score"]
    return out


@pytest.mark.slow
def test_url_strings_are_image_urls_on_both_rerank_routes(served, world):
    url, http = served
    w, server = world
    query = w.captions[1]
    ids = w.image_ids[:3]
    expected = _relevance(http, url, query, ids)
    docs = [server.url(f"images/{ids[0]}.jpg"), ids[1], server.url(f"images/{ids[2]}.jpg")]
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": docs}, timeout=120)
    assert r.status_code == 200, r.text  # was: 404 "unknown image ids" naming the url
    got = {x["index"]: x for x in r.json()["results"]}
    np.testing.assert_allclose([got[i]["relevance_score"] for i in range(3)], expected, atol=SAME_IMAGE_ATOL)
    assert got[0]["document"]["url"] == docs[0] and got[0]["document"]["text"].startswith("sha256:")
    v2 = http.post(url + "/v2/rerank", json={"model": "m", "query": query, "documents": docs}, timeout=120)
    assert v2.status_code == 200, v2.text
    np.testing.assert_allclose(sorted(x["relevance_score"] for x in v2.json()["results"]),
                               sorted(got[i]["relevance_score"] for i in range(3)), atol=1e-5)
    dead = server.url("images/no-such-image.jpg")
    r = http.post(url + "/v1/rerank", json={"query": query, "documents": [dead]}, timeout=120)
    assert r.status_code == 422 and "documents.0: could not fetch" in r.json()["detail"], r.text


@pytest.mark.slow
def test_langchain_cohere_rerank_ranks_image_id_documents(served, world):
    pytest.importorskip("langchain_cohere")
    import cohere
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    url, http = served
    w, server = world
    ids, query = w.image_ids[:8], w.captions[2]
    expected = _relevance(http, url, query, ids)
    # langchain-cohere builds cohere.ClientV2(api_key, base_url=...): the token is the api key, our url the base.
    rerank = CohereRerank(base_url=url, cohere_api_key=TOKEN, model="edje", top_n=3)
    docs = [Document(page_content=i, metadata={"source": f"images/{i}.jpg"}) for i in ids]
    out = rerank.compress_documents(docs, query)
    order = np.argsort(-expected, kind="stable")[:3]
    assert [d.page_content for d in out] == [ids[i] for i in order]
    np.testing.assert_allclose([d.metadata["relevance_score"] for d in out], expected[order], atol=1e-5)
    assert out[0].metadata["source"] == f"images/{out[0].page_content}.jpg"  # metadata travels along
    # A page_content that is an image url is fetched and scored as that image.
    by_url = rerank.compress_documents([Document(page_content=server.url(f"images/{ids[0]}.jpg")),
                                        Document(page_content=ids[1])], query)
    scored = {d.page_content: d.metadata["relevance_score"] for d in by_url}
    assert scored[server.url(f"images/{ids[0]}.jpg")] == pytest.approx(expected[0], abs=SAME_IMAGE_ATOL)
    with pytest.raises(cohere.errors.UnauthorizedError):
        CohereRerank(base_url=url, cohere_api_key="wrong", model="edje").compress_documents(docs, query)


@pytest.mark.slow
def test_llama_index_postprocessor_reranks_nodes_by_their_images(served, world):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import ImageNode, MetadataMode, NodeWithScore, TextNode

    from edje.llama_index import EDJEError, EDJERerank

    url, http = served
    w, server = world
    ids, query = w.image_ids[:6], w.captions[4]
    expected = _relevance(http, url, query, ids)
    order = np.argsort(-expected, kind="stable")

    # Ids in metadata (the default key), arbitrary text as the node's content.
    nodes = [NodeWithScore(node=TextNode(text=f"a picture ({n})", metadata={"image_id": i}), score=0.1 * n)
             for n, i in enumerate(ids)]
    out = EDJERerank(base_url=url, api_key=TOKEN, top_n=3, keep_retrieval_score=True).postprocess_nodes(
        nodes, query_str=query)
    assert [n.node.metadata["image_id"] for n in out] == [ids[i] for i in order[:3]]
    np.testing.assert_allclose([n.score for n in out], expected[order[:3]], atol=1e-5)
    assert out[0].node.metadata["retrieval_score"] == pytest.approx(0.1 * order[0])

    # The id as the node's text, with metadata that LlamaIndex would attach to it: the bare id is sent.
    bare = [NodeWithScore(node=TextNode(text=i, metadata={"family": "twins"})) for i in ids]
    assert bare[0].node.get_content(metadata_mode=MetadataMode.EMBED) != ids[0]
    out = EDJERerank(base_url=url, api_key=TOKEN, top_n=6, batch_size=4).postprocess_nodes(bare, query_str=query)
    assert len(out) == 6  # two requests (batch_size 4), one ranking
    np.testing.assert_allclose([n.score for n in out], expected[order], atol=1e-5)

    # Images the nodes carry: an ImageNode's url, base64 or file, and an image url in metadata (a custom key).
    path = w.images / f"{ids[2]}.jpg"
    images = [ImageNode(image_url=server.url(f"images/{ids[0]}.jpg")),
              TextNode(text="", metadata={"picture": server.url(f"images/{ids[1]}.jpg")}),
              ImageNode(image=base64.b64encode(path.read_bytes()).decode()),
              ImageNode(image_path=str(w.images / f"{ids[3]}.jpg"))]
    rerank = EDJERerank(base_url=url, api_key=TOKEN, top_n=4, url_key="picture", max_images_per_request=3)
    out = rerank.postprocess_nodes([NodeWithScore(node=n) for n in images], query_str=query)
    got = {n.node.node_id: n.score for n in out}
    np.testing.assert_allclose([got[n.node_id] for n in images], expected[:4], atol=SAME_IMAGE_ATOL)

    with pytest.raises(EDJEError, match="404.*unknown image ids"):
        EDJERerank(base_url=url, api_key=TOKEN).postprocess_nodes(
            [NodeWithScore(node=TextNode(text="x", metadata={"image_id": "not-in-the-corpus"}))], query_str=query)
    with pytest.raises(EDJEError, match="401"):
        EDJERerank(base_url=url, api_key="wrong").postprocess_nodes(nodes, query_str=query)
    with pytest.raises(ValueError, match="names no image"):
        EDJERerank(base_url=url).document(TextNode(text="  "))
