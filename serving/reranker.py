"""Reranker deployment: a thin Serve shell around serving/reranker_core.py, adding dynamic batching.

Requests are split into chunks of at most `max_batch_pairs` pairs; `@serve.batch` coalesces
chunks of concurrent requests into one forward pass. The forward runs in a one-thread executor
so that the replica's event loop keeps collecting the next batch meanwhile.
Metrics (serving/serve_metrics.py): gather and forward latency, pairs per forward, live-image adds,
inline-image cache lookups and the corpus rows of this replica.

Each replica holds the token store of its shard in its own memory (24.7 kB per image at int8:
1M images = 25 GB); a corpus larger than a replica's memory is split into shards (serving/shards.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from ray import serve

from edje.serving.config import ServeConfig
from edje.serving.live_images import AddResult
from edje.serving.reranker_core import PairChunk, RerankerCore, Scores
from edje.serving.serve_metrics import RerankerMetrics, timed

log = logging.getLogger("ray.serve")


@serve.deployment
class Reranker:
    """Joint-encoder scoring behind `@serve.batch`, over the token store its core holds."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.metrics = RerankerMetrics()
        # The core picks its device and threads from the resources this replica was given, whichever set them:
        # the code's options or a config file's `deployments:` section (which overrides them).
        self.core = RerankerCore(_with_assigned_resources(config), _replica_id())
        self.metrics.corpus_rows.set(len(self.core.store))
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edje-forward")
        self._batched_forward.set_max_batch_size(config.max_batch_pairs)
        self._batched_forward.set_batch_wait_timeout_s(config.batch_wait_timeout_s)
        scorer, store = self.core.scorer, self.core.store
        log.info("reranker %s on %s (%s), %d images (%.1f MB), batching=%s, max_batch_pairs=%d, threads=%d",
                 self.core.replica, scorer.device, scorer.precision, len(store), store.memory_bytes / 1e6,
                 config.dynamic_batching, config.max_batch_pairs, torch.get_num_threads())

    async def score_pairs(self, texts: List[str], image_ids: List[str], with_urls: bool = False,
                          text_embeddings: Optional[np.ndarray] = None, images: Optional[Dict[int, bytes]] = None) -> Scores:
        """Scores of (texts[i], image_ids[i]), or the unknown ids (RerankerCore.prepare / finish); inline
        document images are encoded in the forward thread, and the forward passes are batched across requests."""
        loop = asyncio.get_running_loop()
        if images:
            prepared, took = await loop.run_in_executor(self.executor, timed, self.core.prepare, texts, image_ids,
                                                        with_urls, images)
            self.metrics.cache_counts(*self.core.cache_counts())
        else:
            prepared, took = timed(self.core.prepare, texts, image_ids, with_urls)
        self.metrics.gather_seconds.observe(took, tags={"inline": "true" if images else "false"})
        self.metrics.corpus_rows.set(len(self.core.store))  # the gather applied any images other replicas added
        if isinstance(prepared, Scores):
            return prepared
        forward = self._batched_forward if self.config.dynamic_batching else self._single_forward
        parts = await asyncio.gather(*(forward(c) for c in prepared.chunks))
        logits = np.concatenate([p[0] for p in parts])
        return self.core.finish(prepared, logits, max(p[1] for p in parts), text_embeddings)

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.005, batch_size_fn=lambda chunks: sum(len(c.texts) for c in chunks))
    async def _batched_forward(self, chunks: List[PairChunk]) -> List[Tuple[np.ndarray, int]]:
        logits, pairs = await self._forward(chunks)
        return [(x, pairs) for x in logits]

    async def _single_forward(self, chunk: PairChunk) -> Tuple[np.ndarray, int]:
        logits, pairs = await self._forward([chunk])
        return logits[0], pairs

    async def _forward(self, chunks: List[PairChunk]) -> Tuple[List[np.ndarray], int]:
        """One forward pass in the forward thread, timed there; (logits per chunk, pairs)."""
        loop = asyncio.get_running_loop()
        logits, took = await loop.run_in_executor(self.executor, timed, self.core.forward, chunks)
        pairs = sum(len(c.texts) for c in chunks)
        self.metrics.forward_seconds.observe(took)
        self.metrics.batch_pairs.observe(pairs)
        return logits, pairs

    async def add_image(self, data: bytes, image_id: Optional[str] = None, url: Optional[str] = None) -> AddResult:
        """Encode an image in the forward thread and add it to the corpus through the shared log."""
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self.executor, self.core.add_image, data, image_id, url)
        self.metrics.live_adds.inc(tags={"status_code": str(out.status)})
        self.metrics.corpus_rows.set(len(self.core.store))
        return out

    def image_urls(self, image_ids: List[str]) -> List[Optional[str]]:
        """Source urls of corpus images (None where unknown)."""
        return self.core.image_urls(image_ids)

    def info(self) -> dict:
        """Device, precision, batching settings and token store of this replica."""
        return self.core.info()

    def ready(self) -> int:
        """Images this replica can score (GET /readyz calls it: an answer means the replica serves)."""
        return len(self.core.store)

    def actor_name(self) -> str:
        """This replica's Ray actor name (namespace 'serve'); tests kill replicas by it."""
        import ray

        return ray.get_runtime_context().get_actor_name()


def _with_assigned_resources(config: ServeConfig) -> ServeConfig:
    """The config with the CPUs and GPUs Ray gave this replica as its reranker resources (unchanged outside Serve)."""
    import ray

    try:
        serve.get_replica_context()
    except Exception:
        return config
    got = ray.get_runtime_context().get_assigned_resources()
    resources = dataclasses.replace(config.reranker, num_cpus=got.get("CPU", 0.0), num_gpus=got.get("GPU", 0.0))
    return config.replace(reranker=resources)


def _replica_id() -> str:
    """Serve's id of this replica (the pid outside Serve)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid-{os.getpid()}"
