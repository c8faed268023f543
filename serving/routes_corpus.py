"""The corpus routes of the ingress, installed as `edje.serving.routes_corpus`: POST /v1/images (add an image, live:
with a reranker and a live_dir), GET /v1/images/{id}/thumbnail (with a reranker and the search page or an image
source; serving/thumbnails.py) and POST /v1/negatives (corpus-wide hard negatives for training: with a miner).
Each route is present only where the deployment that answers it is.
"""
# No `from __future__ import annotations` here: FastAPI must see the real request types on the routes.
from typing import Optional

from fastapi import APIRouter, HTTPException, Request

from edje.schemas.api import MAX_ID_CHARS, AddImageResponse, NegativesResponse
from edje.serving.http_errors import DUPLICATE, ERRORS, IMAGE_ERRORS, NOT_FOUND, ErrorBody
from edje.serving.http_guards import SECURED
from edje.serving.live_sources import default_image_id
from edje.serving.thumbnails import Thumbnails, add_thumbnail_route


def router(ing, models, api: Optional[APIRouter] = None) -> APIRouter:
    """The corpus routes of Ingress `ing` that its deployments can answer, with the request models of its limits, on
    `api` (a new APIRouter by default)."""
    api, cfg = APIRouter() if api is None else api, ing.config

    if ing.corpus is not None and (cfg.ui or cfg.image_dir or cfg.image_url_prefix):
        async def stored_url(image_id: str) -> Optional[str]:
            return (await ing.corpus.image_urls(ing.call, [image_id]))[0]

        add_thumbnail_route(api, Thumbnails(cfg, stored_url), SECURED, {
            **ERRORS, 404: {"model": ErrorBody, "description": "no source has an image of this id"},
            502: {"model": ErrorBody, "description": "the image's source could not give it (unreachable, not an image)"}},
            MAX_ID_CHARS)

    if ing.corpus is not None and cfg.live_dir:
        AddImageRequest = models.add_image

        @api.post("/v1/images", response_model=AddImageResponse, response_model_exclude_none=True, dependencies=SECURED,
                  responses={**ERRORS, **IMAGE_ERRORS, **DUPLICATE},
                  summary="Add an image (url or base64) to the served corpus, live: rerankable and searchable at once")
        async def add_image(req: AddImageRequest):
            kind, value = ("url", req.url) if req.url is not None else ("base64", req.image)
            data, source = await ing.image(kind, value, "url" if kind == "url" else "image")
            image_id = req.id or default_image_id(data)  # chosen here: the id decides the shard
            out = await ing.corpus.add_image(ing.call_once, data, image_id, source or None)  # an add must not run twice
            if out.status != 200:
                raise HTTPException(out.status, out.detail)
            if ing.corpus.first_stages:  # index it now rather than at the next search
                await ing.corpus.sync_live(ing.call, image_id)
            return AddImageResponse(id=out.image_id, sha256=out.sha256, url=source or None, corpus_size=out.corpus_size)

    if ing.miner is not None:
        NegativesRequest = models.negatives

        @api.post("/v1/negatives", response_model=NegativesResponse, responses={**ERRORS, **NOT_FOUND},
                  dependencies=SECURED, summary="Corpus-wide hard negatives for a batch of image-caption pairs (used by training)")
        async def negatives(req: NegativesRequest, request: Request):
            out = await ing.call(ing.miner.negatives, [p.image_id for p in req.pairs], [p.caption for p in req.pairs],
                                 req.k, req.rescore, req.pool, request.headers.get("user-agent"))
            if "missing" in out:
                raise HTTPException(404, f"unknown image ids: {out['missing']}")
            if "error" in out:
                raise HTTPException(422, out["error"])
            return NegativesResponse(k=req.k, rescored=req.rescore, negatives=out["negatives"])

    return api
