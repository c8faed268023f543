"""HTTP ingress (FastAPI, built per replica from the ServeConfig): rerank, search, negatives, health and info routes.

Routes: POST /v1/rerank (Jina shape), /v2/rerank (Cohere shape), /v1/rerank/texts, /v1/search
(only with a checkpoint), /v1/negatives (only with a miner); GET /healthz, /v1/info; OpenAPI at
/openapi.json and /docs. A feature that is not deployed has no route (404), never a 5xx. The
request models come from `ServeConfig.api_limits()`, so the limits that the server enforces (422)
are the ones the OpenAPI schema states. Unknown image ids are 404 (named). A downstream replica
that dies mid-request is answered 503 (retry); Serve replaces the replica. Scored responses carry
`X-EDJE-Replica` (the reranker replica) and `X-EDJE-Batch-Pairs` (pairs in the forward pass that
scored them: > 1 when dynamic batching merged requests).
"""
# No `from __future__ import annotations` here: FastAPI must see the real request types on the routes.
import logging
import math
import uuid
from typing import List, Optional

from fastapi import FastAPI, HTTPException, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from ray import serve

from model.ranking import RANKING_KEY, RankingConfig
from schemas.api import (CohereRerankResponse, CohereResult, Document, Health, InfoResponse, NegativesResponse,
                         RerankResponse, RerankResult, SearchResponse, SearchResult, TableInfo, Usage, request_models)
from serving.config import ServeConfig

log = logging.getLogger("ray.serve")

REPLICA_HEADER = "X-EDJE-Replica"
BATCH_HEADER = "X-EDJE-Batch-Pairs"


class ErrorBody(BaseModel):
    detail: str


ERRORS = {401: {"model": ErrorBody, "description": "missing or wrong bearer token (when the server has one)"},
          503: {"model": ErrorBody, "description": "a downstream replica is being replaced: retry"}}
NOT_FOUND = {404: {"model": ErrorBody, "description": "unknown image ids, named in the message"}}


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _message(e: dict) -> str:
    """One readable line for one pydantic error."""
    if e.get("type") == "json_invalid":
        ctx = e.get("ctx") or {}
        return f"malformed JSON body at position {e['loc'][-1]}: {ctx.get('error', e.get('msg'))}"
    where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
    msg = "must not be empty or blank" if e.get("type") == "string_pattern_mismatch" else e.get("msg")
    return f"{where}: {msg}" if where else str(msg)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with FastAPI's error list plus one readable message."""
    errors = exc.errors()
    return JSONResponse(status_code=422, content={"detail": _jsonable(errors), "message": "; ".join(map(_message, errors))})


def _jsonable(errors: list) -> list:
    # pydantic puts exception objects into ctx; JSON cannot carry them.
    return [{k: (str(v) if k == "ctx" else v) for k, v in e.items() if k != "input" or isinstance(v, (str, int, float))}
            for e in errors]


def _ranked(logits, top_n: Optional[int], raw: bool):
    order = sorted(range(len(logits)), key=lambda i: -float(logits[i]))[: top_n or len(logits)]
    return [(i, float(logits[i]) if raw else sigmoid(float(logits[i]))) for i in order]


@serve.deployment
@serve.ingress()
class Ingress:
    """Validates requests, applies auth, fans out to the reranker, first stage and miner."""

    def __init__(self, config: ServeConfig, auth_token: Optional[str], reranker=None, first_stage=None, miner=None):
        self.config, self.auth_token = config, auth_token
        self.reranker, self.first_stage, self.miner = reranker, first_stage, miner
        self.checkpoint_meta = None
        self.ranking = RankingConfig()
        if config.checkpoint:
            from model.edje import read_checkpoint_config
            self.checkpoint_meta = read_checkpoint_config(config.checkpoint)
            # The checkpoint's ranking rule, the same one jobs/evaluate.py reports (model/ranking.py).
            self.ranking = RankingConfig(**self.checkpoint_meta.get(RANKING_KEY, {}))

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The FastAPI app of this configuration (Serve calls it once per replica, after __init__)."""
        return build_api(self)

    # ------------------------------------------------------------------ helpers
    def authorize(self, creds: Optional[HTTPAuthorizationCredentials]) -> None:
        """401 unless auth is off or the bearer token matches."""
        if self.auth_token is None:
            return
        if creds is None or creds.scheme.lower() != "bearer" or creds.credentials != self.auth_token:
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    async def call(self, method, *args, **kwargs):
        """Await a deployment call; a dead or overloaded replica becomes 503, not a crash of this one."""
        try:
            return await method.remote(*args, **kwargs)
        except HTTPException:
            raise
        except Exception as e:  # noqa: BLE001 - anything from another process: report it, stay up
            kind = type(e).__name__
            status = 503 if any(w in kind for w in ("ActorDied", "ActorUnavailable", "BackPressure", "Unavailable",
                                                    "RayActorError", "Timeout")) else 500
            log.warning("downstream call %s failed: %s: %s", getattr(method, "_method_name", method), kind, e)
            raise HTTPException(status, f"{'temporarily unavailable, retry' if status == 503 else 'internal error'}: {kind}")

    async def score(self, response: Response, texts: List[str], image_ids: List[str], with_urls: bool = False):
        """The reranker's Scores; 404 naming unknown ids; replica and batch headers on the response."""
        text_emb = None
        if self.ranking.first_stage_weight:
            # Fused rule: the reranker adds w x cosine(text, image) to each ITM logit.
            unique = list(dict.fromkeys(texts))
            emb = await self.call(self.first_stage.embed, unique)
            row = {t: i for i, t in enumerate(unique)}
            text_emb = emb[[row[t] for t in texts]]
        scores = await self.call(self.reranker.score_pairs, texts, image_ids, with_urls, text_emb)
        if scores.missing:
            raise HTTPException(404, f"unknown image ids: {scores.missing}")
        response.headers[REPLICA_HEADER] = scores.replica
        response.headers[BATCH_HEADER] = str(scores.batch_pairs)
        return scores

    def usage(self, texts: List[str]) -> Usage:
        """(caption wordpieces + 3 special tokens + m image tokens) per pair; whitespace words approximate wordpieces."""
        m = self.checkpoint_meta["config"]["encoder"]["num_image_tokens"]
        cap = self.checkpoint_meta["config"]["encoder"]["max_text_tokens"]
        return Usage(total_tokens=sum(min(len(t.split()), cap) + 3 + m for t in texts))


def build_api(ing: Ingress) -> FastAPI:
    """FastAPI app of one Ingress: the routes its deployments can answer, request models from its limits."""
    cfg = ing.config
    models = request_models(cfg.api_limits())
    app = FastAPI(title="EDJE reranker", version="1",
                  description="Vision-language reranking over precomputed, compressed image tokens (EDJE, "
                              "arXiv 2510.06820). Documents are image ids of the served corpus.")
    app.add_exception_handler(RequestValidationError, _validation_error)
    bearer = HTTPBearer(auto_error=False, description="required when the server is started with an auth token")
    name = cfg.model_name

    if ing.reranker is not None:
        RerankRequest, TextRerankRequest, SearchRequest = models.rerank, models.text_rerank, models.search

        @app.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True,
                  responses={**ERRORS, **NOT_FOUND}, summary="Rank image documents for a query (Jina /v1/rerank shape)")
        async def rerank(req: RerankRequest, response: Response,
                         creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
            ing.authorize(creds)
            ids = req.image_ids()
            scores = await ing.score(response, [req.query] * len(ids), ids, with_urls=req.return_documents)
            results = [RerankResult(index=i, relevance_score=s,
                                    document=Document(text=ids[i], url=scores.urls[i]) if req.return_documents else None)
                       for i, s in _ranked(scores.logits, req.top_n, req.raw_scores)]
            return RerankResponse(model=req.model or name, results=results, usage=ing.usage([req.query] * len(ids)))

        @app.post("/v2/rerank", response_model=CohereRerankResponse, responses={**ERRORS, **NOT_FOUND},
                  summary="Rank image documents for a query (Cohere /v2/rerank shape)")
        async def rerank_cohere(req: RerankRequest, response: Response,
                                creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
            ing.authorize(creds)
            ids = req.image_ids()
            scores = await ing.score(response, [req.query] * len(ids), ids)
            results = [CohereResult(index=i, relevance_score=s) for i, s in _ranked(scores.logits, req.top_n, req.raw_scores)]
            return CohereRerankResponse(id=str(uuid.uuid4()), results=results)

        @app.post("/v1/rerank/texts", response_model=RerankResponse, response_model_exclude_none=True,
                  responses={**ERRORS, **NOT_FOUND}, summary="Rank candidate texts for one image (image-to-text)")
        async def rerank_texts(req: TextRerankRequest, response: Response,
                               creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
            ing.authorize(creds)
            scores = await ing.score(response, list(req.texts), [req.image] * len(req.texts))
            results = [RerankResult(index=i, relevance_score=s,
                                    document=Document(text=req.texts[i]) if req.return_documents else None)
                       for i, s in _ranked(scores.logits, req.top_n, req.raw_scores)]
            return RerankResponse(model=req.model or name, results=results, usage=ing.usage(req.texts))

        @app.post("/v1/search", response_model=SearchResponse, response_model_exclude_none=True, responses=ERRORS,
                  summary="Text-to-image search: first stage top_k, reranked by the joint encoder, best top_n")
        async def search(req: SearchRequest, response: Response,
                         creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
            ing.authorize(creds)
            hits = await ing.call(ing.first_stage.search, req.query, req.top_k)
            if not hits:
                return SearchResponse(model=req.model or name, results=[], usage=Usage(total_tokens=0))
            ids = [h[0] for h in hits]
            scores = await ing.score(response, [req.query] * len(ids), ids, with_urls=True)
            results = [SearchResult(image_id=ids[i], relevance_score=s, first_stage_score=hits[i][1], url=scores.urls[i])
                       for i, s in _ranked(scores.logits, req.top_n or req.top_k, req.raw_scores)]
            return SearchResponse(model=req.model or name, results=results, usage=ing.usage([req.query] * len(ids)))

    if ing.miner is not None:
        NegativesRequest = models.negatives

        @app.post("/v1/negatives", response_model=NegativesResponse, responses={**ERRORS, **NOT_FOUND},
                  summary="Corpus-wide hard negatives for a batch of image-caption pairs (used by training)")
        async def negatives(req: NegativesRequest, request: Request,
                            creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
            ing.authorize(creds)
            out = await ing.call(ing.miner.negatives, [p.image_id for p in req.pairs], [p.caption for p in req.pairs],
                                 req.k, req.rescore, req.pool, request.headers.get("user-agent"))
            if "missing" in out:
                raise HTTPException(404, f"unknown image ids: {out['missing']}")
            if "error" in out:
                raise HTTPException(422, out["error"])
            return NegativesResponse(k=req.k, rescored=req.rescore, negatives=out["negatives"])

    @app.get("/healthz", response_model=Health, summary="Liveness of the ingress")
    async def healthz():
        return Health(status="ok")

    @app.get("/v1/info", response_model=InfoResponse, responses={401: ERRORS[401]},
             summary="Model, token table metadata, corpus size, limits, served routes")
    async def info(creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        ing.authorize(creds)
        reranker = await ing.call(ing.reranker.info) if ing.reranker is not None else None
        miner = await ing.call(ing.miner.info) if ing.miner is not None else None
        store = reranker["token_store"] if reranker else None
        meta = ing.checkpoint_meta or {}
        return InfoResponse(
            model=name, checkpoint=cfg.checkpoint, adapter_hash=meta.get("adapter_hash"), edje_config=meta.get("config"),
            token_store=TableInfo(**store) if store else None,
            corpus_size=store["images"] if store else (miner or {}).get("images", 0), miner=miner,
            limits=cfg.limits(), precision=reranker["precision"] if reranker else None)

    return app
