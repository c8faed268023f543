"""The routes about the ingress itself, installed as `edje.serving.routes_meta`: GET /healthz (liveness: this replica
answers), /readyz (readiness: every deployment behind it answers, else 503 naming those that do not), both public,
and /v1/info (model, ranking rule, token table, corpus size, limits), behind the token. Every configuration has them.
"""
import dataclasses
from typing import Optional

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from edje.schemas.api import Health, InfoResponse, Readiness, TableInfo
from edje.serving.http_errors import ERRORS
from edje.serving.http_guards import SECURED


def router(ing, models, api: Optional[APIRouter] = None) -> APIRouter:
    """Health, readiness and info of Ingress `ing` on `api` (a new APIRouter by default); `models` unused: these
    routes take no body."""
    api, cfg, ranking = APIRouter() if api is None else api, ing.config, ing.ranking

    @api.get("/healthz", response_model=Health, summary="Liveness of the ingress")
    async def healthz():
        return Health(status="ok")

    @api.get("/readyz", response_model=Readiness, response_model_exclude_none=True,
             responses={503: {"model": Readiness, "description": "a deployment did not answer (named)"}},
             summary="Readiness: every deployment of the application answers (503 naming those that do not)")
    async def readyz():
        states = {"Ingress": "ok", **await ing.readiness()}
        down = {name: why for name, why in states.items() if why != "ok"}
        if not down:
            return Readiness(status="ready", deployments=states)
        detail = "not answering: " + "; ".join(f"{name} ({why})" for name, why in down.items())
        body = Readiness(status="not ready", deployments=states, detail=detail)
        return JSONResponse(status_code=503, content=body.model_dump(exclude_none=True))

    @api.get("/v1/info", response_model=InfoResponse, responses={401: ERRORS[401]}, dependencies=SECURED,
             summary="Model, ranking rule and calibration, token table metadata, corpus size, limits")
    async def info():
        reranker = await ing.corpus.info(ing.call) if ing.corpus is not None else None
        miner = await ing.call(ing.miner.info) if ing.miner is not None else None
        store = reranker["token_store"] if reranker else None
        meta = ing.checkpoint_meta or {}
        return InfoResponse(
            model=cfg.model_name, checkpoint=cfg.checkpoint, adapter_hash=meta.get("adapter_hash"),
            edje_config=meta.get("config"), token_store=TableInfo(**store) if store else None,
            corpus_size=store["images"] if store else (miner or {}).get("images", 0), miner=miner,
            limits=cfg.limits(), precision=reranker["precision"] if reranker else None,
            ranking={**dataclasses.asdict(ranking), "rule": ranking.describe()} if ing.corpus is not None else None,
            live_images=reranker.get("live_images") if reranker else None,
            shards=reranker.get("shards") if reranker else None)

    return api
