"""HTTP ingress (FastAPI behind `@serve.ingress`): rerank, search, negatives, health and info routes.

Routes: POST /v1/rerank (Jina shape), /v2/rerank (Cohere shape), /v1/rerank/texts, /v1/search,
/v1/negatives; GET /healthz, /v1/info; OpenAPI at /openapi.json and /docs. Bad input becomes a
4xx with a message and never reaches a model: unknown image ids 404 (named), configured limits
and malformed bodies 422. A downstream replica that dies mid-request is answered 503 (retry);
Serve replaces the replica.
"""
# No `from __future__ import annotations` here: FastAPI must see the real request types on the methods.
import logging
import math
import uuid
from typing import List, Optional

from fastapi import FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from ray import serve

from schemas.api import (CohereRerankResponse, CohereResult, Document, Health, InfoResponse, NegativesRequest,
                         NegativesResponse, RerankRequest, RerankResponse, RerankResult, SearchRequest, SearchResponse,
                         SearchResult, TableInfo, TextRerankRequest, Usage)
from serving.config import ServeConfig

log = logging.getLogger("ray.serve")

app = FastAPI(
    title="EDJE reranker",
    version="1",
    description="Vision-language reranking over precomputed, compressed image tokens (EDJE, arXiv 2510.06820). "
                "Documents are image ids of the served corpus.",
)
bearer = HTTPBearer(auto_error=False, description="required when the server is started with an auth token")


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with FastAPI's error list plus one readable message."""
    errors = exc.errors()
    parts = []
    for e in errors:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            parts.append(f"malformed JSON body at position {e['loc'][-1]}: {ctx.get('error', e.get('msg'))}")
            continue
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return JSONResponse(status_code=422, content={"detail": _jsonable(errors), "message": "; ".join(parts)})


def _jsonable(errors: list) -> list:
    # pydantic puts exception objects into ctx; JSON cannot carry them.
    return [{k: (str(v) if k == "ctx" else v) for k, v in e.items() if k != "input" or isinstance(v, (str, int, float))}
            for e in errors]


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


@serve.deployment
@serve.ingress(app)
class Ingress:
    """Validates requests, applies limits and auth, fans out to the store, reranker, first stage and miner."""

    def __init__(self, config: ServeConfig, auth_token: Optional[str], store=None, reranker=None, first_stage=None,
                 miner=None):
        self.config, self.auth_token = config, auth_token
        self.store, self.reranker, self.first_stage, self.miner = store, reranker, first_stage, miner
        self.checkpoint_meta = None
        if config.checkpoint:
            from model.edje import read_checkpoint_config
            self.checkpoint_meta = read_checkpoint_config(config.checkpoint)

    # ------------------------------------------------------------------ helpers
    def _authorize(self, creds: Optional[HTTPAuthorizationCredentials]) -> None:
        if self.auth_token is None:
            return
        if creds is None or creds.scheme.lower() != "bearer" or creds.credentials != self.auth_token:
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    def _need_reranker(self) -> None:
        if self.reranker is None:
            raise HTTPException(503, "no reranker is served here (started without a checkpoint)")

    def _check_text(self, what: str, text: str) -> None:
        if len(text) > self.config.max_text_chars:
            raise HTTPException(422, f"{what} is {len(text)} characters long; the limit is {self.config.max_text_chars}")

    def _check_count(self, what: str, n: int, limit: int) -> None:
        if n > limit:
            raise HTTPException(422, f"too many {what}: {n} > {limit}")

    async def _call(self, method, *args, **kwargs):
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

    async def _score(self, texts: List[str], image_ids: List[str], with_urls: bool = False):
        scores = await self._call(self.reranker.score_pairs, texts, image_ids, with_urls)
        if scores.missing:
            raise HTTPException(404, f"unknown image ids: {scores.missing}")
        return scores

    def _usage(self, texts: List[str]) -> Usage:
        # (caption wordpieces + 3 special tokens + m image tokens) per pair; whitespace words approximate wordpieces.
        m = self.checkpoint_meta["config"]["encoder"]["num_image_tokens"]
        cap = self.checkpoint_meta["config"]["encoder"]["max_text_tokens"]
        return Usage(total_tokens=sum(min(len(t.split()), cap) + 3 + m for t in texts))

    @staticmethod
    def _ranked(logits, top_n: Optional[int], raw: bool):
        order = sorted(range(len(logits)), key=lambda i: -float(logits[i]))[: top_n or len(logits)]
        return [(i, float(logits[i]) if raw else sigmoid(float(logits[i]))) for i in order]

    async def _rerank(self, req: RerankRequest):
        self._need_reranker()
        ids = req.image_ids()
        self._check_count("documents", len(ids), self.config.max_documents)
        self._check_text("query", req.query)
        scores = await self._score([req.query] * len(ids), ids, with_urls=req.return_documents)
        return ids, scores

    # ------------------------------------------------------------------ routes
    @app.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True,
              summary="Rank image documents for a query (Jina /v1/rerank shape)")
    async def rerank(self, req: RerankRequest, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        ids, scores = await self._rerank(req)
        results = [RerankResult(index=i, relevance_score=s,
                                document=Document(text=ids[i], url=scores.urls[i]) if req.return_documents else None)
                   for i, s in self._ranked(scores.logits, req.top_n, req.raw_scores)]
        return RerankResponse(model=req.model or self.config.model_name, results=results,
                              usage=self._usage([req.query] * len(ids)))

    @app.post("/v2/rerank", response_model=CohereRerankResponse,
              summary="Rank image documents for a query (Cohere /v2/rerank shape)")
    async def rerank_cohere(self, req: RerankRequest, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        req = req.model_copy(update={"return_documents": False})
        ids, scores = await self._rerank(req)
        results = [CohereResult(index=i, relevance_score=s) for i, s in self._ranked(scores.logits, req.top_n, req.raw_scores)]
        return CohereRerankResponse(id=str(uuid.uuid4()), results=results)

    @app.post("/v1/rerank/texts", response_model=RerankResponse, response_model_exclude_none=True,
              summary="Rank candidate texts for one image (image-to-text)")
    async def rerank_texts(self, req: TextRerankRequest, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        self._need_reranker()
        self._check_count("texts", len(req.texts), self.config.max_documents)
        for n, t in enumerate(req.texts):
            self._check_text(f"texts[{n}]", t)
        scores = await self._score(list(req.texts), [req.image] * len(req.texts))
        results = [RerankResult(index=i, relevance_score=s,
                                document=Document(text=req.texts[i]) if req.return_documents else None)
                   for i, s in self._ranked(scores.logits, req.top_n, req.raw_scores)]
        return RerankResponse(model=req.model or self.config.model_name, results=results, usage=self._usage(req.texts))

    @app.post("/v1/search", response_model=SearchResponse, response_model_exclude_none=True,
              summary="Text-to-image search: first stage top_k, reranked by the joint encoder, best top_n")
    async def search(self, req: SearchRequest, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        self._need_reranker()
        self._check_text("query", req.query)
        self._check_count("first-stage candidates (top_k)", req.top_k, self.config.max_top_k)
        hits = await self._call(self.first_stage.search, req.query, req.top_k)
        if not hits:
            return SearchResponse(model=req.model or self.config.model_name, results=[], usage=Usage(total_tokens=0))
        ids = [h[0] for h in hits]
        scores = await self._score([req.query] * len(ids), ids, with_urls=True)
        results = [SearchResult(image_id=ids[i], relevance_score=s, first_stage_score=hits[i][1], url=scores.urls[i])
                   for i, s in self._ranked(scores.logits, req.top_n or req.top_k, req.raw_scores)]
        return SearchResponse(model=req.model or self.config.model_name, results=results,
                              usage=self._usage([req.query] * len(ids)))

    @app.post("/v1/negatives", response_model=NegativesResponse,
              summary="Corpus-wide hard negatives for a batch of image-caption pairs (used by training)")
    async def negatives(self, req: NegativesRequest, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        if self.miner is None:
            raise HTTPException(503, "no miner is served here")
        self._check_count("pairs", len(req.pairs), self.config.max_pairs)
        for n, p in enumerate(req.pairs):
            self._check_text(f"pairs[{n}].caption", p.caption)
        out = await self._call(self.miner.negatives, [p.image_id for p in req.pairs], [p.caption for p in req.pairs],
                               req.k, req.rescore, req.pool)
        if "missing" in out:
            raise HTTPException(404, f"unknown image ids: {out['missing']}")
        if "error" in out:
            raise HTTPException(422, out["error"])
        return NegativesResponse(k=req.k, rescored=req.rescore, negatives=out["negatives"])

    @app.get("/healthz", response_model=Health, summary="Liveness of the ingress")
    async def healthz(self):
        return Health(status="ok")

    @app.get("/v1/info", response_model=InfoResponse, summary="Model, token table metadata, corpus size, limits")
    async def info(self, creds: Optional[HTTPAuthorizationCredentials] = Security(bearer)):
        self._authorize(creds)
        store = await self._call(self.store.info) if self.store is not None else None
        miner = await self._call(self.miner.info) if self.miner is not None else None
        reranker = await self._call(self.reranker.info) if self.reranker is not None else None
        meta = self.checkpoint_meta or {}
        return InfoResponse(
            model=self.config.model_name, checkpoint=self.config.checkpoint, adapter_hash=meta.get("adapter_hash"),
            edje_config=meta.get("config"), token_store=TableInfo(**store) if store else None,
            corpus_size=store["images"] if store else (miner or {}).get("images", 0), miner=miner,
            limits=self.config.limits(), precision=reranker["precision"] if reranker else None)
