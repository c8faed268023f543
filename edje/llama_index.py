"""LlamaIndex node postprocessor over the EDJE HTTP API: `EDJERerank` orders image nodes for a query text.

    from edje.llama_index import EDJERerank

    rerank = EDJERerank(base_url="http://127.0.0.1:8000", api_key=os.environ.get("EDJE_API_TOKEN"), top_n=5)
    best = rerank.postprocess_nodes(nodes, query_str="a red circle left of a blue square")

A node names its image by the first of: `metadata[id_key]` (an image id of the served corpus, default key
"image_id"); an ImageNode's `image` (base64), `image_url` or `image_path` (the file is read and sent as
base64), or a Node's `image_resource` (data, url, path); `metadata[url_key]` (an http(s) url, default key
"image_url"); the node's bare text. Always the bare value: LlamaIndex's own rerankers send a node's content
with its metadata attached, which is no longer an image id. Scores are the server's calibrated relevance
(or `raw_scores`), per pair, so the requests a long node list is split into rank together.
This is the only module that imports llama_index: `pip install -e ".[integrations]"`.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional, Sequence, Union

import requests
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, ImageNode, MetadataMode, NodeWithScore, QueryBundle

DocumentRef = Union[str, Dict[str, str]]


class EDJEError(RuntimeError):
    """The EDJE server refused a rerank request (status and its message)."""


class EDJERerank(BaseNodePostprocessor):
    """Rerank nodes that carry images with an EDJE server's POST /v1/rerank; the best top_n, scored."""

    base_url: str = Field(description="the EDJE server, with its route prefix, e.g. http://127.0.0.1:8000")
    api_key: Optional[str] = Field(default=None, description="the server's bearer token; None: no auth")
    top_n: int = Field(default=5, ge=1, description="nodes returned")
    id_key: str = Field(default="image_id", description="metadata key of a corpus image id")
    url_key: str = Field(default="image_url", description="metadata key of an image url")
    raw_scores: bool = Field(default=False, description="the uncalibrated ranking score instead of the probability")
    keep_retrieval_score: bool = Field(default=False, description="keep the incoming score as metadata['retrieval_score']")
    timeout_s: float = Field(default=120.0, gt=0)
    batch_size: int = Field(default=256, ge=1, description="documents per request (the server's max_documents caps it)")
    max_images_per_request: int = Field(default=16, ge=1, description="inline images (url, base64) per request "
                                                                      "(the server's max_image_documents)")
    _session: requests.Session = PrivateAttr(default_factory=requests.Session)

    @classmethod
    def class_name(cls) -> str:
        return "EDJERerank"

    def document(self, node: BaseNode) -> DocumentRef:
        """What the server is sent for a node: an image id string, or {'image': url | base64}."""
        image_id = node.metadata.get(self.id_key)
        if isinstance(image_id, str) and image_id.strip():
            return image_id
        inline = _node_image(node)
        if inline is not None:
            return {"image": inline}
        url = node.metadata.get(self.url_key)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            return {"image": url}
        text = node.get_content(metadata_mode=MetadataMode.NONE).strip()
        if text:
            return text
        raise ValueError(f"node {node.node_id} names no image: no metadata[{self.id_key!r}] or "
                         f"metadata[{self.url_key!r}], no image on the node, no text")

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("EDJERerank needs a query: pass query_str or query_bundle")
        if not nodes:
            return []
        documents = [self.document(n.node) for n in nodes]
        with self.callback_manager.event(
                CBEventType.RERANKING, payload={EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.base_url,
                                                EventPayload.QUERY_STR: query_bundle.query_str,
                                                EventPayload.TOP_K: self.top_n}) as event:
            scores = self.scores(query_bundle.query_str, documents)
            best = sorted(range(len(nodes)), key=lambda i: -scores[i])[: self.top_n]
            out = []
            for i in best:
                if self.keep_retrieval_score:
                    nodes[i].node.metadata["retrieval_score"] = nodes[i].score
                out.append(NodeWithScore(node=nodes[i].node, score=scores[i]))
            event.on_end(payload={EventPayload.NODES: out})
        return out

    def scores(self, query: str, documents: Sequence[DocumentRef]) -> List[float]:
        """The server's score of each document for the query, in document order (one request per batch)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.base_url.rstrip("/") + "/v1/rerank"
        scores = [0.0] * len(documents)
        for batch in _batches(documents, self.batch_size, self.max_images_per_request):
            body = {"query": query, "documents": [documents[i] for i in batch], "return_documents": False,
                    "raw_scores": self.raw_scores}
            r = self._session.post(url, json=body, headers=headers, timeout=self.timeout_s)
            if r.status_code != 200:
                raise EDJEError(f"POST {url}: {r.status_code} {_detail(r)}")
            for result in r.json()["results"]:
                scores[batch[result["index"]]] = float(result["relevance_score"])
        return scores


def _node_image(node: BaseNode) -> Optional[str]:
    """An image the node itself carries, as the server takes it (base64 text or an http(s) url), or None."""
    if isinstance(node, ImageNode):
        data, url, path = node.image, node.image_url, node.image_path
    elif getattr(node, "image_resource", None) is not None:
        res = node.image_resource
        data = res.data.decode() if res.data else None
        url, path = (str(res.url) if res.url else None), res.path
    else:
        return None
    if data:
        return data
    if url:
        return url
    if path:
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()
    return None


def _batches(documents: Sequence[DocumentRef], size: int, max_images: int) -> List[List[int]]:
    """Positions of the documents cut into requests of at most `size` documents and `max_images` inline images."""
    out: List[List[int]] = []
    current: List[int] = []
    images = 0
    for i, doc in enumerate(documents):
        inline = not isinstance(doc, str) or doc.startswith(("http://", "https://"))
        if current and (len(current) == size or (inline and images == max_images)):
            out.append(current)
            current, images = [], 0
        current.append(i)
        images += inline
    if current:
        out.append(current)
    return out


def _detail(response: Any) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body.get("detail"))
    except ValueError:
        return response.text[:300]
