"""The application's Prometheus series (ray.serve.metrics): names, labels and buckets in one place, made per replica.

Serve adds the labels deployment, replica and application to each series; Ray exports them from every node's
metrics export port as `ray_<name>`, counters with a `_total` suffix (docs/operations.md "Monitoring"). Only the Serve shells
(ingress, reranker, deployments) import this module: the serving cores load no Ray Serve.
"""
from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Callable, Iterable, Optional

import ray
from ray.serve.metrics import Counter, Gauge, Histogram
from starlette.routing import BaseRoute, Match

# Seconds: a gather is a numpy take (sub-ms) unless it encodes inline images; a CPU forward of 256 pairs takes seconds.
LATENCY_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# Image urls: bounded by image_fetch_timeout_s (10 s by default).
FETCH_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# Pairs per forward pass: powers of two up past the largest max_batch_pairs in use.
PAIRS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
OTHER_ROUTE = "other"  # paths that match no route share one label: scanners must not mint series


class IngressMetrics:
    """Requests by route and status code, their latency, and image url fetch latency."""

    def __init__(self):
        self.requests = Counter("edje_http_requests", description="HTTP responses of the EDJE ingress, by route "
                                "and status code (401s, 4xxs and 5xxs included)", tag_keys=("route", "status_code"))
        self.request_seconds = Histogram("edje_http_request_seconds", description="Ingress time to answer, by route",
                                         boundaries=LATENCY_S, tag_keys=("route",))
        self.image_fetch_seconds = Histogram("edje_image_fetch_seconds", description="Fetching one document or added "
                                             "image by url, by outcome (ok, error)", boundaries=FETCH_S,
                                             tag_keys=("outcome",))

    def record(self, route: str, status: int, seconds: float) -> None:
        """One answered request."""
        self.requests.inc(tags={"route": route, "status_code": str(status)})
        self.request_seconds.observe(seconds, tags={"route": route})


class RerankerMetrics:
    """Gather and forward latency, pairs per forward, live-image adds, inline-image cache, corpus rows."""

    def __init__(self):
        self.gather_seconds = Histogram("edje_gather_seconds", description="Reranker: gathering a request's stored "
                                        "token rows (and encoding its inline images: inline=true)",
                                        boundaries=LATENCY_S, tag_keys=("inline",))
        self.forward_seconds = Histogram("edje_forward_seconds", description="Reranker: one joint-encoder forward "
                                         "pass (one batch, possibly of several requests)", boundaries=LATENCY_S)
        self.batch_pairs = Histogram("edje_forward_batch_pairs", description="Reranker: pairs per forward pass",
                                     boundaries=PAIRS)
        self.live_adds = Counter("edje_live_image_adds", description="POST /v1/images handled by this replica, by "
                                 "status code", tag_keys=("status_code",))
        self.cache = Counter("edje_image_cache_lookups", description="Inline document images: encoded-image cache "
                             "lookups by result (hit, miss)", tag_keys=("result",))
        self.corpus_rows = corpus_rows_gauge()
        self._seen_hits = self._seen_misses = 0

    def cache_counts(self, hits: int, misses: int) -> None:
        """Export the core's cumulative cache counts as counter increments."""
        if hits > self._seen_hits:
            self.cache.inc(hits - self._seen_hits, tags={"result": "hit"})
        if misses > self._seen_misses:
            self.cache.inc(misses - self._seen_misses, tags={"result": "miss"})
        self._seen_hits, self._seen_misses = max(hits, self._seen_hits), max(misses, self._seen_misses)


class FirstStageMetrics:
    """First-stage search latency by query kind, and the index's rows."""

    def __init__(self):
        self.search_seconds = Histogram("edje_first_stage_seconds", description="First stage: one search (text "
                                        "tower + FAISS), by query kind (text, image)", boundaries=LATENCY_S,
                                        tag_keys=("kind",))
        self.corpus_rows = corpus_rows_gauge()


class HeldGauge:
    """A gauge whose last value stays exported: a background thread records it again every half report interval.

    Ray exports a gauge series only while its process records it again (the metrics agent evicts one not refreshed
    within two report intervals), so a value set once, such as the rows loaded at start, would vanish from the
    metrics port after about 20 s.
    """

    def __init__(self, gauge: Gauge, refresh_s: Optional[float] = None):
        self._gauge, self._value, self._lock = gauge, None, threading.Lock()
        self.refresh_s = refresh_s or max(ray._config.metrics_report_interval_ms(), 1000) / 2000
        # The thread holds a weak reference: a gauge dropped by its owner stops being refreshed.
        threading.Thread(target=_refresh_while_held, args=(weakref.ref(self), self.refresh_s), daemon=True,
                         name="edje-gauge-refresh").start()

    def set(self, value: float) -> None:
        """Record value now when it changed (the thread keeps recording it); cheap enough for every request."""
        with self._lock:
            if value != self._value:
                self._value = value
                self._gauge.set(value)

    def refresh(self) -> None:
        """Record the last value again (nothing before the first set)."""
        with self._lock:
            if self._value is not None:
                self._gauge.set(self._value)


def _refresh_while_held(ref: "weakref.ref[HeldGauge]", every_s: float) -> None:
    while True:
        time.sleep(every_s)
        held = ref()
        if held is None:
            return
        held.refresh()
        del held


def corpus_rows_gauge() -> HeldGauge:
    """Rows of a reranker replica's token store or a first-stage replica's index (the deployment label tells which)."""
    return HeldGauge(Gauge("edje_corpus_rows", description="Images this replica can score or search (stored + live)"))


class RequestMetrics:
    """ASGI middleware: counts and times every response by route and status code, those of outer checks (401) and
    of failures (500) included. The route label is the matching route's path template, as the router matches it."""

    def __init__(self, app, metrics: IngressMetrics, routes: Callable[[], Iterable[BaseRoute]]):
        self.app, self.metrics, self.routes = app, metrics, routes

    def route(self, scope) -> str:
        """The path template of the route that matches the request (any method), or OTHER_ROUTE."""
        for route in self.routes():
            if route.matches(scope)[0] != Match.NONE:
                return getattr(route, "path", OTHER_ROUTE)
        return OTHER_ROUTE

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]  # an exception before the response starts is answered 500 by Starlette's outer handler

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            status[0] = 499  # the client went away (nginx's code): not a server error
            raise
        finally:
            self.metrics.record(self.route(scope), status[0], time.perf_counter() - start)


def timed(fn, *args):
    """(fn(*args), seconds it took): run in a worker thread, so that queueing for the thread is not counted."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start
