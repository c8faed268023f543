"""The ranking routes of the ingress, installed as `edje.serving.routes_rank`: POST /v1/rerank (Jina shape),
/v2/rerank (Cohere shape), /v1/rerank/texts (image-to-text) and /v1/search (first stage, then the reranker), all
present only with a reranker behind the ingress. Relevance is the checkpoint's calibrated probability, or with
`raw_scores` its ranking score (model/ranking.py). The routes parse and shape; measuring texts, fetching inline
images and scoring are the Ingress's (serving/ingress.py), passed in as `ing`.
"""
# No `from __future__ import annotations` here: FastAPI must see the real request types on the routes.
import asyncio
import uuid
from typing import Optional

from fastapi import APIRouter, HTTPException, Request, Response

from edje.model.ranking import RankingConfig
from edje.schemas.api import (
    CohereMeta,
    CohereRerankResponse,
    CohereResult,
    Document,
    RerankResponse,
    RerankResult,
    ResponseMeta,
    SearchResponse,
    SearchResult,
    Usage,
)
from edje.serving.http_errors import ERRORS, IMAGE_ERRORS, NOT_FOUND, TOO_LONG
from edje.serving.http_guards import SECURED
from edje.serving.search_view import caption_image, first_stage_list, first_stage_ranks


def request_id(request: Request) -> str:
    """Serve's id of this request: the X-Request-ID its proxy set (a client's own is kept) and echoes; a fresh
    uuid outside Serve."""
    from ray.serve.context import _get_serve_request_context

    return request.headers.get("x-request-id") or _get_serve_request_context().request_id or str(uuid.uuid4())


def _ranked(scores, top_n: Optional[int], raw: bool, ranking: RankingConfig):
    """(index, relevance) best first: the raw ranking score, or its calibrated probability (model/ranking.py)."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[: top_n or len(scores)]
    shown = [float(scores[i]) for i in order]
    if not raw:
        shown = [float(p) for p in ranking.probability(shown)]
    return list(zip(order, shown))


def router(ing, models, api: Optional[APIRouter] = None) -> APIRouter:
    """The ranking routes of Ingress `ing`, with the request models of its limits, on `api` (a new APIRouter by
    default); none without a reranker."""
    api = APIRouter() if api is None else api
    if ing.corpus is None:
        return api
    RerankRequest, TextRerankRequest, SearchRequest = models.rerank, models.text_rerank, models.search
    name, ranking = ing.config.model_name, ing.ranking

    @api.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True, dependencies=SECURED,
              responses={**ERRORS, **NOT_FOUND, **IMAGE_ERRORS, **TOO_LONG},
              summary="Rank image documents (corpus ids, or images by url or base64) for a query (Jina /v1/rerank shape)")
    async def rerank(req: RerankRequest, response: Response):
        counts, long = ing.measure([req.query], req.truncate, lambda i: "query")
        ids, images, sources = await ing.documents(req.refs())
        scores = await ing.score(response, [req.query] * len(ids), ids, with_urls=req.return_documents, images=images)
        results = [RerankResult(index=i, relevance_score=s,
                                document=Document(text=ids[i], url=sources[i] or scores.urls[i])
                                if req.return_documents else None)
                   for i, s in _ranked(scores.logits, req.top_n, req.raw_scores, ranking)]
        truncated, warnings = ing.query_cut(counts, long)
        return RerankResponse(model=req.model or name, results=results, usage=ing.usage(counts * len(ids)),
                              meta=ResponseMeta(truncated=truncated, warnings=warnings) if truncated else None)

    @api.post("/v2/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True,
              responses={**ERRORS, **NOT_FOUND, **IMAGE_ERRORS, **TOO_LONG},
              dependencies=SECURED, summary="Rank image documents for a query (Cohere /v2/rerank shape)")
    async def rerank_cohere(req: RerankRequest, response: Response, request: Request):
        counts, long = ing.measure([req.query], req.truncate, lambda i: "query")
        ids, images, _ = await ing.documents(req.refs())
        scores = await ing.score(response, [req.query] * len(ids), ids, images=images)
        results = [CohereResult(index=i, relevance_score=s)
                   for i, s in _ranked(scores.logits, req.top_n, req.raw_scores, ranking)]
        truncated, warnings = ing.query_cut(counts, long)
        return CohereRerankResponse(id=request_id(request), results=results,
                                    meta=CohereMeta(truncated=truncated, warnings=warnings))

    @api.post("/v1/rerank/texts", response_model=RerankResponse, response_model_exclude_none=True,
              dependencies=SECURED, responses={**ERRORS, **NOT_FOUND, **TOO_LONG},
              summary="Rank candidate texts for one image (image-to-text)")
    async def rerank_texts(req: TextRerankRequest, response: Response):
        counts, long = ing.measure(req.texts, req.truncate, lambda i: f"texts.{i}")
        scores = await ing.score(response, list(req.texts), [req.image] * len(req.texts), image_query=True)
        results = [RerankResult(index=i, relevance_score=s,
                                document=Document(text=req.texts[i]) if req.return_documents else None)
                   for i, s in _ranked(scores.logits, req.top_n, req.raw_scores, ranking)]
        return RerankResponse(model=req.model or name, results=results, usage=ing.usage(counts),
                              meta=ing.texts_cut(counts, long))

    @api.post("/v1/search", response_model=SearchResponse, response_model_exclude_none=True,
              responses={**ERRORS, **NOT_FOUND, **TOO_LONG}, dependencies=SECURED,
              summary="Search by text, by a corpus image and a text that modifies it, or by an image alone: "
                      "first stage top_k, reranked against the text by the joint encoder, best top_n")
    async def search(req: SearchRequest, response: Response):
        counts, long = ing.measure([req.query] if req.query is not None else [], req.truncate, lambda i: "query")
        truncated, warnings = ing.query_cut(counts, long)
        meta = ResponseMeta(truncated=truncated, warnings=warnings) if truncated else None
        expected = asyncio.ensure_future(caption_image(ing.miner, req.query))  # beside the search, never fails it
        if req.image is None:
            # The text is embedded once (one first-stage replica); the fused rule reuses that vector below.
            found = await ing.corpus.search_text(ing.call, req.query, req.top_k)
        else:
            found = await ing.corpus.search_image(ing.call, req.image, req.query, req.image_weight, req.top_k)
            if found.missing:
                raise HTTPException(404, f"unknown image ids: {found.missing}")
        hits, query_embedding = found.hits, found.query_embedding
        extra = dict(first_stage=[] if req.return_first_stage else None)
        if not hits:
            return SearchResponse(model=req.model or name, results=[], usage=Usage(total_tokens=0),
                                  reranked=req.query is not None, expected_image_id=await expected, meta=meta, **extra)
        ids = [h[0] for h in hits]
        rank = first_stage_ranks(hits)
        if req.query is None:
            # Image-only: the joint encoder scores a text against an image, and there is no text. The first
            # stage's order is the answer (image-to-image cosine), said so by reranked=false.
            shown = hits[: req.top_n or req.top_k]
            urls = await ing.corpus.image_urls(ing.call, ids if req.return_first_stage else [h[0] for h in shown])
            results = [SearchResult(image_id=i, relevance_score=c, first_stage_score=c, url=u, first_stage_rank=rank[i])
                       for (i, c), u in zip(shown, urls)]
            if req.return_first_stage:
                extra["first_stage"] = first_stage_list(hits, urls)
            return SearchResponse(model=req.model or name, results=results, usage=Usage(total_tokens=0),
                                  reranked=False, expected_image_id=await expected, **extra)
        # Text and mixed-modal queries rank alike: the reranker scores the text against each candidate.
        scores = await ing.score(response, [req.query] * len(ids), ids, with_urls=True, query_embedding=query_embedding)
        results = [SearchResult(image_id=ids[i], relevance_score=s, first_stage_score=hits[i][1], url=scores.urls[i],
                                ranking_score=float(scores.logits[i]), first_stage_rank=i + 1)
                   for i, s in _ranked(scores.logits, req.top_n or req.top_k, req.raw_scores, ranking)]
        if req.return_first_stage:
            extra["first_stage"] = first_stage_list(hits, scores.urls)
        return SearchResponse(model=req.model or name, results=results, usage=ing.usage(counts * len(ids)),
                              expected_image_id=await expected, meta=meta, **extra)

    return api
