"""HTTP ingress (FastAPI, built per replica from the ServeConfig): rerank, search, negatives, images, health and info.

Routes: POST /v1/rerank (Jina shape), /v2/rerank (Cohere shape), /v1/rerank/texts, /v1/search (only with a
checkpoint; by text, by a corpus image + a text, or by a corpus image alone), /v1/images (with a checkpoint
and a live_dir), /v1/negatives (only with a miner); GET /healthz (liveness), /readyz (readiness: every
deployment answers), /v1/info, /v1/images/{id}/thumbnail (with
the search page or an image source; serving/thumbnails.py), /ui (the search page, with `ui`; serving/search_page.py);
OpenAPI at /openapi.json and /docs. The bearer token is checked first, by a
middleware, before the body is read or validated: every route but PUBLIC_PATHS answers 401 without it,
whatever the body. A feature that is not deployed has no route (404),
never a 5xx. The request models come from `ServeConfig.api_limits()`, so the limits that the server enforces
(422) are the ones the OpenAPI schema states; unknown fields are 422, named. Unknown image ids are 404 (named).
Texts are measured in the checkpoint's wordpieces (`TextLimit`): one longer than the joint encoder reads is cut
(`truncate`, the default; the response's meta says so) or refused with 413. A downstream call whose replica dies
mid-request is made once more (another replica of the shard answers: serving/shards.py `call_with_retry`); when
that fails too, or the deployment is overloaded, the answer is 503 with Retry-After, and Serve replaces the
replica. Requests beyond the ingress's own admission limits get Serve's 503 (serving/app.py), or, with
`admit_in_flight`, the gate's (`AdmissionGate`: no queue). Scored responses carry `X-EDJE-Replica`
(the reranker replica) and `X-EDJE-Batch-Pairs` (pairs in the forward pass that scored them: > 1 when dynamic
batching merged requests). Every response carries Serve's request id as `X-Request-ID` (Serve's proxy sets it,
keeping a client's own); /v2/rerank's `id` is that id. Every response is counted and timed by route and status
code (serving/serve_metrics.py).
"""
# No `from __future__ import annotations` here: FastAPI must see the real request types on the routes.
import asyncio
import dataclasses
import hashlib
import hmac
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from ray import serve

from edje.model.ranking import RANKING_KEY, RankingConfig
from edje.schemas.api import (
    MAX_ID_CHARS,
    AddImageResponse,
    CohereMeta,
    CohereRerankResponse,
    CohereResult,
    Document,
    Health,
    InfoResponse,
    NegativesResponse,
    Readiness,
    RerankResponse,
    RerankResult,
    ResponseMeta,
    SearchResponse,
    SearchResult,
    TableInfo,
    TruncatedText,
    Truncation,
    Usage,
    request_models,
)
from edje.serving.config import ServeConfig
from edje.serving.image_fetch import ImageInputError, image_bytes
from edje.serving.live_sources import default_image_id
from edje.serving.search_page import add_search_page, page_paths
from edje.serving.search_view import caption_image, first_stage_list, first_stage_ranks
from edje.serving.serve_metrics import IngressMetrics, RequestMetrics
from edje.serving.shards import ShardedCorpus, call_with_retry
from edje.serving.thumbnails import Thumbnails, add_thumbnail_route

log = logging.getLogger("ray.serve")

REPLICA_HEADER = "X-EDJE-Replica"
BATCH_HEADER = "X-EDJE-Batch-Pairs"


class ErrorBody(BaseModel):
    detail: str


ERRORS = {401: {"model": ErrorBody, "description": "missing or wrong bearer token (when the server has one)"},
          503: {"model": ErrorBody, "description": "overloaded, or a downstream replica is being replaced: retry after "
                                                   "the Retry-After header's seconds"}}
TOO_LONG = {413: {"model": ErrorBody, "description": "with truncate: false, a text longer than the joint encoder reads "
                                                     "(max_text_tokens wordpieces), named with the limit"}}
NOT_FOUND = {404: {"model": ErrorBody, "description": "unknown image ids, named in the message"}}
IMAGE_ERRORS = {413: {"model": ErrorBody, "description": "an image larger than max_image_bytes or max_image_pixels"},
                422: {"description": "invalid request, or an image that cannot be fetched or decoded (named)"}}
DUPLICATE = {409: {"model": ErrorBody, "description": "the image id is already in the corpus"}}
# Reachable without the token: liveness, readiness and the API's own description.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class BearerAuth:
    """ASGI middleware: every path but PUBLIC_PATHS needs `Authorization: Bearer <token>`, checked before
    the request body is read, so that no route (present or added later) validates or answers first."""

    def __init__(self, app, token: Optional[str], public: frozenset = PUBLIC_PATHS):
        self.app, self.token, self.public = app, token, public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.token is None or _route_path(scope) in self.public:
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return await self.app(scope, receive, send)
        response = JSONResponse(status_code=401, content={"detail": "missing or wrong bearer token"},
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class AdmissionGate:
    """ASGI middleware: at most `limit` requests in flight in this replica (paths in `exempt` aside); each one beyond
    is answered 503 with Retry-After at once, never queued. A replica runs its app on one event loop, so a plain
    counter is exact."""

    def __init__(self, app, limit: int, retry_after_s: float, exempt: frozenset = PUBLIC_PATHS):
        self.app, self.limit, self.exempt, self.in_flight = app, limit, exempt, 0
        self.retry_after = str(math.ceil(retry_after_s))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _route_path(scope) in self.exempt:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            response = JSONResponse(status_code=503, headers={"Retry-After": self.retry_after},
                                    content={"detail": f"overloaded: {self.limit} requests in flight, retry"})
            return await response(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _route_path(scope) -> str:
    """The path below the app's route prefix (Serve mounts apps under one; the scope's path may include it)."""
    path, root = scope.get("path", ""), scope.get("root_path") or ""
    return (path[len(root):] or "/") if root and path.startswith(root) else path


def _message(e: dict) -> str:
    """One readable line for one pydantic error."""
    if e.get("type") == "json_invalid":
        ctx = e.get("ctx") or {}
        return f"malformed JSON body at position {e['loc'][-1]}: {ctx.get('error', e.get('msg'))}"
    where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
    if e.get("type") == "extra_forbidden":
        return (f"unknown field '{where}': not part of this API (the fields each route takes, and those it accepts "
                "and ignores, are in /openapi.json)")
    blank = e.get("type") == "string_pattern_mismatch" and (e.get("ctx") or {}).get("pattern") == r"\S"
    msg = "must not be empty or blank" if blank else e.get("msg")
    return f"{where}: {msg}" if where else str(msg)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with FastAPI's error list plus one readable message."""
    errors = exc.errors()
    return JSONResponse(status_code=422, content={"detail": _jsonable(errors), "message": "; ".join(map(_message, errors))})


def _jsonable(errors: list) -> list:
    # pydantic puts exception objects into ctx; JSON cannot carry them.
    return [{k: (str(v) if k == "ctx" else v) for k, v in e.items() if k != "input" or isinstance(v, (str, int, float))}
            for e in errors]


def request_id(request: Request) -> str:
    """Serve's id of this request: the X-Request-ID its proxy set (a client's own is kept) and echoes; a fresh
    uuid outside Serve."""
    from ray.serve.context import _get_serve_request_context

    return request.headers.get("x-request-id") or _get_serve_request_context().request_id or str(uuid.uuid4())


async def _probe(method, timeout_s: float) -> str:
    """'ok' when a deployment answers `method` within timeout_s, else why not."""
    response = method.remote()
    try:
        await asyncio.wait_for(response, timeout_s)
        return "ok"
    except asyncio.TimeoutError:
        response.cancel()
        return f"no answer within {timeout_s:g} s"
    except Exception as e:
        return type(e).__name__


def _ranked(scores, top_n: Optional[int], raw: bool, ranking: RankingConfig):
    """(index, relevance) best first: the raw ranking score, or its calibrated probability (model/ranking.py)."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[: top_n or len(scores)]
    shown = [float(scores[i]) for i in order]
    if not raw:
        shown = [float(p) for p in ranking.probability(shown)]
    return list(zip(order, shown))


@dataclass(frozen=True)
class TextLimit:
    """What the joint encoder reads of a text: its first `max_tokens` wordpieces by the checkpoint's own tokenizer
    (model/joint_encoder.py truncates there; the image tokens come after)."""

    tokenizer: Any
    max_tokens: int

    @classmethod
    def of_checkpoint(cls, checkpoint: str, meta: dict) -> "TextLimit":
        """The checkpoint's tokenizer (its `tokenizer/` folder, fetched when remote) and max_text_tokens."""
        import fsspec
        from transformers import AutoTokenizer

        from edje.model.edje import local_tokenizer  # the folder load_checkpoint reads, without the weights

        fs, root = fsspec.core.url_to_fs(checkpoint)
        return cls(AutoTokenizer.from_pretrained(local_tokenizer(fs, root)), meta["config"]["encoder"]["max_text_tokens"])

    def count(self, texts: Sequence[str]) -> List[int]:
        """Wordpieces of each text, special tokens excluded."""
        if not texts:
            return []
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return [len(x) for x in ids]


@serve.deployment
@serve.ingress()
class Ingress:
    """Validates requests, applies auth, fans out to the reranker, first stage and miner."""

    metrics: Optional[IngressMetrics] = None  # None where the class is used without Serve (tests): nothing recorded
    text_limit: Optional[TextLimit] = None  # None without a checkpoint (or a stand-in ingress): texts are not measured

    def __init__(self, config: ServeConfig, auth_token: Optional[str], rerankers=(), first_stages=(), miner=None):
        self.config, self.auth_token = config, auth_token
        self.metrics = IngressMetrics()
        # Every reranker and first-stage call goes through the shards' handles (one shard: the one deployment).
        self.corpus = ShardedCorpus(rerankers, first_stages) if rerankers else None
        self.miner = miner
        self.checkpoint_meta = None
        self.ranking = RankingConfig()
        if config.checkpoint:
            from edje.model.edje import read_checkpoint_config
            self.checkpoint_meta = read_checkpoint_config(config.checkpoint)
            # The checkpoint's ranking rule, the same one jobs/evaluate.py reports (model/ranking.py).
            self.ranking = RankingConfig(**self.checkpoint_meta.get(RANKING_KEY, {}))
            self.text_limit = TextLimit.of_checkpoint(config.checkpoint, self.checkpoint_meta)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The FastAPI app of this configuration (Serve calls it once per replica, after __init__)."""
        return build_api(self)

    # ------------------------------------------------------------------ helpers
    async def image(self, kind: str, value: str, where: str) -> Tuple[bytes, str]:
        """(bytes, source url or '') of an inline image; 413/422 naming `where` when it cannot be had."""
        start, outcome = time.perf_counter(), "error"
        try:
            got = await image_bytes(kind, value, self.config.max_image_bytes, self.config.image_fetch_timeout_s,
                                    self.config.image_url_hosts, self.config.image_url_allow)
            outcome = "ok"
            return got
        except ImageInputError as e:
            raise HTTPException(e.status, f"{where}: {e.detail}") from None
        finally:
            if kind == "url" and self.metrics is not None:  # base64 is decoded, not fetched
                self.metrics.image_fetch_seconds.observe(time.perf_counter() - start, tags={"outcome": outcome})

    async def readiness(self) -> Dict[str, str]:
        """'ok' or why not, per deployment behind this ingress: a cheap call to each, within ready_timeout_s."""
        probes = self.corpus.probes() if self.corpus is not None else {}
        if self.miner is not None:
            probes["Miner"] = self.miner.info
        answers = await asyncio.gather(*(_probe(m, self.config.ready_timeout_s) for m in probes.values()))
        return dict(zip(probes, answers))

    async def documents(self, refs: List[Tuple[str, str]]) -> Tuple[List[str], Dict[int, bytes], List[Optional[str]]]:
        """Image ids of the documents ('sha256:<hex>' for inline images), inline bytes by position, source urls."""
        inline = [(i, k, v) for i, (k, v) in enumerate(refs) if k != "id"]
        got = await asyncio.gather(*(self.image(k, v, f"documents.{i}") for i, k, v in inline))
        images = {i: data for (i, _, _), (data, _) in zip(inline, got)}
        sources: List[Optional[str]] = [None] * len(refs)
        ids = [v for _, v in refs]
        for (i, _, _), (data, source) in zip(inline, got):
            ids[i], sources[i] = "sha256:" + hashlib.sha256(data).hexdigest(), source or None
        return ids, images, sources

    async def call(self, method, *args, **kwargs):
        """Await an idempotent deployment call, made once more on another replica when its replica is lost mid-call;
        a failure then, or an overloaded deployment, becomes 503 with Retry-After, not a crash of this replica."""
        try:
            return await call_with_retry(method, *args, **kwargs)
        except HTTPException:
            raise
        except Exception as e:
            raise self.downstream_error(method, e) from None

    async def call_once(self, method, *args, **kwargs):
        """Await a deployment call that must not run twice (adding an image): a failure is 503, never retried here."""
        try:
            return await method.remote(*args, **kwargs)
        except HTTPException:
            raise
        except Exception as e:
            raise self.downstream_error(method, e) from None

    def downstream_error(self, method, e: Exception) -> HTTPException:
        """503 (with Retry-After) for a lost, unavailable or overloaded replica; 500 for anything else."""
        kind = type(e).__name__
        status = 503 if any(w in kind for w in ("ActorDied", "ActorUnavailable", "BackPressure", "Unavailable",
                                                "RayActorError", "Timeout", "WorkerCrashed", "NodeDied")) else 500
        log.warning("downstream call %s failed: %s: %s", getattr(method, "_method_name", method), kind, e)
        if status == 503:
            return HTTPException(503, f"temporarily unavailable, retry: {kind}",
                                 headers={"Retry-After": str(math.ceil(self.config.retry_after_s))})
        return HTTPException(500, f"internal error: {kind}")

    def measure(self, texts: Sequence[str], truncate: bool, name) -> Tuple[List[int], List[int]]:
        """Wordpieces of each text and the positions of those longer than the joint encoder reads; with truncate
        false, 413 naming the first of those (`name(i)`) and the limit."""
        if self.text_limit is None:  # a stand-in ingress without a checkpoint: whitespace words approximate
            return [len(t.split()) for t in texts], []
        counts, cap = self.text_limit.count(texts), self.text_limit.max_tokens
        long = [i for i, n in enumerate(counts) if n > cap]
        if long and not truncate:
            i = long[0]
            raise HTTPException(413, f"{name(i)}: {counts[i]} wordpieces, more than the {cap} the model reads "
                                     f"(max_text_tokens); shorten it, or send truncate: true to have it cut to its first {cap}")
        return counts, long

    def query_cut(self, counts: List[int], long: List[int]) -> Tuple[Optional[Truncation], Optional[List[str]]]:
        """meta.truncated and meta.warnings for a query that was cut (None, None when it was not)."""
        if not long:
            return None, None
        cap = self.text_limit.max_tokens
        return (Truncation(kept=cap, query_tokens=counts[0]),
                [f"query truncated: the model read the first {cap} of its {counts[0]} wordpieces (max_text_tokens)"])

    def texts_cut(self, counts: List[int], long: List[int]) -> Optional[ResponseMeta]:
        """The meta of a text rerank whose candidate texts were cut (None when none was)."""
        if not long:
            return None
        cap = self.text_limit.max_tokens
        return ResponseMeta(truncated=Truncation(kept=cap, texts=[TruncatedText(index=i, tokens=counts[i]) for i in long]),
                            warnings=[f"{len(long)} texts truncated to their first {cap} wordpieces (max_text_tokens): "
                                      f"texts {long[:20]}"])

    async def score(self, response: Response, texts: List[str], image_ids: List[str], with_urls: bool = False,
                    images: Optional[Dict[int, bytes]] = None, query_embedding: Optional[np.ndarray] = None):
        """The reranker's Scores; 404 naming unknown ids, 422 naming an undecodable image; replica and batch headers.
        `query_embedding` [e]: the first-stage query of every pair when it is not the text's own (mixed-modal search)."""
        text_emb = None
        if self.ranking.first_stage_weight and query_embedding is not None:
            # Fused rule, mixed-modal query: the cosine added is the one the first stage ranked by.
            text_emb = np.repeat(np.asarray(query_embedding, np.float32)[None], len(texts), axis=0)
        elif self.ranking.first_stage_weight:
            # Fused rule: the reranker adds w x cosine(text, image) to each ITM logit.
            unique = list(dict.fromkeys(texts))
            emb = await self.corpus.embed(self.call, unique)
            row = {t: i for i, t in enumerate(unique)}
            text_emb = emb[[row[t] for t in texts]]
        scores = await self.corpus.score_pairs(self.call, texts, image_ids, with_urls, text_emb, images or None)
        if scores.missing:
            raise HTTPException(404, f"unknown image ids: {scores.missing}")
        if scores.rejected:
            status = 413 if "decompression_bomb" in scores.rejected else 422
            raise HTTPException(status, f"image rejected: {scores.rejected}")
        response.headers[REPLICA_HEADER] = scores.replica
        response.headers[BATCH_HEADER] = str(scores.batch_pairs)
        return scores

    def usage(self, wordpieces: Sequence[int]) -> Usage:
        """(text wordpieces, at most max_text_tokens, + 3 special tokens + m image tokens) summed over the pairs;
        `wordpieces` has one entry per pair (Ingress.measure)."""
        m = self.checkpoint_meta["config"]["encoder"]["num_image_tokens"]
        cap = self.checkpoint_meta["config"]["encoder"]["max_text_tokens"]
        return Usage(total_tokens=sum(min(n, cap) + 3 + m for n in wordpieces))


def build_api(ing: Ingress) -> FastAPI:
    """FastAPI app of one Ingress: the routes its deployments can answer, request models from its limits."""
    cfg = ing.config
    models = request_models(cfg.api_limits())
    app = FastAPI(title="EDJE reranker", version="1",
                  description="Vision-language reranking over precomputed, compressed image tokens (EDJE, "
                              "arXiv 2510.06820). Documents are image ids of the served corpus.")
    app.add_exception_handler(RequestValidationError, _validation_error)
    # Enforces the token on every route but PUBLIC_PATHS (and the search page's static files, which hold no data).
    public = PUBLIC_PATHS | (page_paths() if cfg.ui else frozenset())
    if cfg.admit_in_flight is not None:  # added before BearerAuth, so inside it: a request without the token is 401
        app.add_middleware(AdmissionGate, limit=cfg.admit_in_flight, retry_after_s=cfg.retry_after_s, exempt=public)
    app.add_middleware(BearerAuth, token=ing.auth_token, public=public)
    if ing.metrics is not None:  # added after BearerAuth, so outside it: its 401s are counted too
        app.add_middleware(RequestMetrics, metrics=ing.metrics, routes=lambda: app.routes)
    bearer = HTTPBearer(auto_error=False, description="required when the server is started with an auth token")
    secured = [Security(bearer)]  # declares the scheme in OpenAPI; BearerAuth has already checked it
    name = cfg.model_name
    ranking = ing.ranking

    if ing.corpus is not None:
        RerankRequest, TextRerankRequest, SearchRequest = models.rerank, models.text_rerank, models.search

        @app.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True, dependencies=secured,
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

        @app.post("/v2/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True,
                  responses={**ERRORS, **NOT_FOUND, **IMAGE_ERRORS, **TOO_LONG},
                  dependencies=secured, summary="Rank image documents for a query (Cohere /v2/rerank shape)")
        async def rerank_cohere(req: RerankRequest, response: Response, request: Request):
            counts, long = ing.measure([req.query], req.truncate, lambda i: "query")
            ids, images, _ = await ing.documents(req.refs())
            scores = await ing.score(response, [req.query] * len(ids), ids, images=images)
            results = [CohereResult(index=i, relevance_score=s)
                       for i, s in _ranked(scores.logits, req.top_n, req.raw_scores, ranking)]
            truncated, warnings = ing.query_cut(counts, long)
            return CohereRerankResponse(id=request_id(request), results=results,
                                        meta=CohereMeta(truncated=truncated, warnings=warnings))

        @app.post("/v1/rerank/texts", response_model=RerankResponse, response_model_exclude_none=True,
                  dependencies=secured, responses={**ERRORS, **NOT_FOUND, **TOO_LONG},
                  summary="Rank candidate texts for one image (image-to-text)")
        async def rerank_texts(req: TextRerankRequest, response: Response):
            counts, long = ing.measure(req.texts, req.truncate, lambda i: f"texts.{i}")
            scores = await ing.score(response, list(req.texts), [req.image] * len(req.texts))
            results = [RerankResult(index=i, relevance_score=s,
                                    document=Document(text=req.texts[i]) if req.return_documents else None)
                       for i, s in _ranked(scores.logits, req.top_n, req.raw_scores, ranking)]
            return RerankResponse(model=req.model or name, results=results, usage=ing.usage(counts),
                                  meta=ing.texts_cut(counts, long))

        @app.post("/v1/search", response_model=SearchResponse, response_model_exclude_none=True,
                  responses={**ERRORS, **NOT_FOUND, **TOO_LONG}, dependencies=secured,
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
            scores = await ing.score(response, [req.query] * len(ids), ids, with_urls=True,
                                     query_embedding=query_embedding)
            results = [SearchResult(image_id=ids[i], relevance_score=s, first_stage_score=hits[i][1], url=scores.urls[i],
                                    ranking_score=float(scores.logits[i]), first_stage_rank=i + 1)
                       for i, s in _ranked(scores.logits, req.top_n or req.top_k, req.raw_scores, ranking)]
            if req.return_first_stage:
                extra["first_stage"] = first_stage_list(hits, scores.urls)
            return SearchResponse(model=req.model or name, results=results, usage=ing.usage(counts * len(ids)),
                                  expected_image_id=await expected, meta=meta, **extra)

    if ing.corpus is not None and (cfg.ui or cfg.image_dir or cfg.image_url_prefix):
        async def stored_url(image_id: str) -> Optional[str]:
            return (await ing.corpus.image_urls(ing.call, [image_id]))[0]

        add_thumbnail_route(app, Thumbnails(cfg, stored_url), secured, {
            **ERRORS, 404: {"model": ErrorBody, "description": "no source has an image of this id"},
            502: {"model": ErrorBody, "description": "the image's source could not give it (unreachable, not an image)"}},
            MAX_ID_CHARS)

    if ing.corpus is not None and cfg.live_dir:
        AddImageRequest = models.add_image

        @app.post("/v1/images", response_model=AddImageResponse, response_model_exclude_none=True, dependencies=secured,
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

        @app.post("/v1/negatives", response_model=NegativesResponse, responses={**ERRORS, **NOT_FOUND},
                  dependencies=secured, summary="Corpus-wide hard negatives for a batch of image-caption pairs (used by training)")
        async def negatives(req: NegativesRequest, request: Request):
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

    @app.get("/readyz", response_model=Readiness, response_model_exclude_none=True,
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

    @app.get("/v1/info", response_model=InfoResponse, responses={401: ERRORS[401]}, dependencies=secured,
             summary="Model, ranking rule and calibration, token table metadata, corpus size, limits")
    async def info():
        reranker = await ing.corpus.info(ing.call) if ing.corpus is not None else None
        miner = await ing.call(ing.miner.info) if ing.miner is not None else None
        store = reranker["token_store"] if reranker else None
        meta = ing.checkpoint_meta or {}
        return InfoResponse(
            model=name, checkpoint=cfg.checkpoint, adapter_hash=meta.get("adapter_hash"), edje_config=meta.get("config"),
            token_store=TableInfo(**store) if store else None,
            corpus_size=store["images"] if store else (miner or {}).get("images", 0), miner=miner,
            limits=cfg.limits(), precision=reranker["precision"] if reranker else None,
            ranking={**dataclasses.asdict(ranking), "rule": ranking.describe()} if ing.corpus is not None else None,
            live_images=reranker.get("live_images") if reranker else None,
            shards=reranker.get("shards") if reranker else None)

    if cfg.ui:
        add_search_page(app)

    return app
