"""HTTP ingress (FastAPI, built per replica from the ServeConfig), installed as `edje.serving.ingress`: the `Ingress`
Serve deployment and `build_api`, which makes its app from three routers and two middlewares.

Routes: POST /v1/rerank (Jina shape), /v2/rerank (Cohere shape), /v1/rerank/texts, /v1/search (only with a
checkpoint; by text, by a corpus image + a text, or by a corpus image alone: serving/routes_rank.py), /v1/images
(with a checkpoint and a live_dir), /v1/negatives (only with a miner), GET /v1/images/{id}/thumbnail (with the
search page or an image source; serving/thumbnails.py: serving/routes_corpus.py); GET /healthz (liveness), /readyz
(readiness: every deployment answers), /v1/info (serving/routes_meta.py); /ui (the search page, with `ui`;
serving/search_page.py); OpenAPI at /openapi.json and /docs. The bearer token is checked first, by a middleware,
before the body is read or validated: every route but PUBLIC_PATHS answers 401 without it, whatever the body
(serving/http_guards.py). A feature that is not deployed has no route (404), never a 5xx. The request models come
from `ServeConfig.api_limits()`, so the limits that the server enforces (422) are the ones the OpenAPI schema
states; unknown fields are 422, named. Unknown image ids are 404 (named).

`Ingress` holds what the routes share: texts measured in the checkpoint's wordpieces (`TextLimit`: one longer than
the joint encoder reads is cut (`truncate`, the default; the response's meta says so) or refused with 413), inline
images fetched, pairs scored, deployments called. A downstream call whose replica dies mid-request is made once
more (another replica of the shard answers: serving/shards.py `call_with_retry`); when that fails too, or the
deployment is overloaded, the answer is 503 with Retry-After, and Serve replaces the replica (by the exception's
type: serving/http_errors.py). Requests beyond the ingress's own admission limits get Serve's 503
(serving/app.py), or, with `admit_in_flight`, the gate's (`AdmissionGate`: no queue). Scored responses carry
`X-EDJE-Replica` (the reranker replica) and `X-EDJE-Batch-Pairs` (pairs in the forward pass that scored them: > 1
when dynamic batching merged requests). Every response carries Serve's request id as `X-Request-ID` (Serve's proxy
sets it, keeping a client's own); /v2/rerank's `id` is that id. Every response is counted and timed by route and
status code (serving/serve_metrics.py).
"""
import asyncio
import hashlib
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from fastapi import FastAPI, HTTPException, Response
from fastapi.exceptions import RequestValidationError
from ray import serve

from edje.model.checkpoint_files import fast_tokenizer, local_tokenizer, read_checkpoint_config
from edje.model.ranking import RANKING_KEY, RankingConfig
from edje.schemas.api import ResponseMeta, TruncatedText, Truncation, Usage, request_models
from edje.serving import routes_corpus, routes_meta, routes_rank
from edje.serving.config import ServeConfig
from edje.serving.http_errors import downstream_error, validation_error
from edje.serving.http_guards import PUBLIC_PATHS, AdmissionGate, BearerAuth
from edje.serving.image_fetch import ImageInputError, image_bytes
from edje.serving.search_page import add_search_page, page_paths
from edje.serving.serve_metrics import IngressMetrics, RequestMetrics
from edje.serving.shards import ShardedCorpus, call_with_retry

REPLICA_HEADER = "X-EDJE-Replica"
BATCH_HEADER = "X-EDJE-Batch-Pairs"


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


@dataclass(frozen=True)
class TextLimit:
    """What the joint encoder reads of a text: its first `max_tokens` wordpieces by the checkpoint's own tokenizer
    (model/joint_encoder.py truncates there; the image tokens come after)."""

    tokenizer: Any
    max_tokens: int

    @classmethod
    def of_checkpoint(cls, checkpoint: str, meta: dict) -> "TextLimit":
        """The checkpoint's tokenizer and max_text_tokens: its tokenizer.json read by `tokenizers` alone (no torch in
        the ingress), or transformers' AutoTokenizer on its `tokenizer/` folder (fetched when remote) without one."""
        limit = meta["config"]["encoder"]["max_text_tokens"]
        fast = fast_tokenizer(checkpoint)
        if fast is not None:
            return cls(fast, limit)
        import fsspec
        from transformers import AutoTokenizer

        fs, root = fsspec.core.url_to_fs(checkpoint)
        return cls(AutoTokenizer.from_pretrained(local_tokenizer(fs, root)), limit)

    def count(self, texts: Sequence[str]) -> List[int]:
        """Wordpieces of each text, special tokens excluded."""
        if not texts:
            return []
        if hasattr(self.tokenizer, "encode_batch"):  # a `tokenizers.Tokenizer`
            return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return [len(x) for x in ids]


@serve.deployment
@serve.ingress()
class Ingress:
    """The HTTP front as a Serve deployment: per replica, the handles of the reranker, first stage and miner, and what
    the routes share (texts measured, inline images fetched, pairs scored, calls retried); its app is build_api's."""

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
            raise downstream_error(method, e, self.config.retry_after_s) from None

    async def call_once(self, method, *args, **kwargs):
        """Await a deployment call that must not run twice (adding an image): a failure is 503, never retried here."""
        try:
            return await method.remote(*args, **kwargs)
        except HTTPException:
            raise
        except Exception as e:
            raise downstream_error(method, e, self.config.retry_after_s) from None

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
                    images: Optional[Dict[int, bytes]] = None, query_embedding: Optional[np.ndarray] = None,
                    image_query: bool = False):
        """The reranker's Scores; 404 naming unknown ids, 422 naming an undecodable image; replica and batch headers.
        `query_embedding` [e]: the first-stage query of every pair when it is not the text's own (mixed-modal search);
        `image_query`: the pairs rank texts for one image (the rule's image-query form)."""
        rule = self.ranking.for_image_queries() if image_query else self.ranking
        text_emb = None
        if rule.fuses and query_embedding is not None:
            # Fused rule, mixed-modal query: the cosine added is the one the first stage ranked by.
            text_emb = np.repeat(np.asarray(query_embedding, np.float32)[None], len(texts), axis=0)
        elif rule.fuses:
            # Fused rule: w x cosine(text, image) is added to each ITM logit (below).
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
        if text_emb is None:
            return scores
        # Every route scores one query a request: its pairs are that query's candidates, what a switched rule reads
        # its best cosine over.
        return replace(scores, logits=rule.fuse(scores.logits, scores.cosines))

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
    app.add_exception_handler(RequestValidationError, validation_error)
    # Enforces the token on every route but PUBLIC_PATHS (and the search page's static files, which hold no data).
    public = PUBLIC_PATHS | (page_paths() if cfg.ui else frozenset())
    if cfg.admit_in_flight is not None:  # added before BearerAuth, so inside it: a request without the token is 401
        app.add_middleware(AdmissionGate, limit=cfg.admit_in_flight, retry_after_s=cfg.retry_after_s, exempt=public)
    app.add_middleware(BearerAuth, token=ing.auth_token, public=public)
    if ing.metrics is not None:  # added after BearerAuth, so outside it: its 401s are counted too
        app.add_middleware(RequestMetrics, metrics=ing.metrics, routes=lambda: app.routes)
    # Declared on the app's own router rather than include_router'd: since FastAPI 0.137 an included router stays
    # one nested entry of app.routes, and RequestMetrics finds its route label in app.routes. In this order, the
    # order of the paths in /openapi.json; each router leaves out what is not deployed.
    for routes in (routes_rank, routes_corpus, routes_meta):
        routes.router(ing, models, app.router)
    if cfg.ui:
        add_search_page(app)
    return app
