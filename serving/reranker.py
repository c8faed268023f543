"""Reranker deployment: the joint encoder scoring (text, stored image tokens) pairs, with dynamic batching.

Only `model.encoder.score(texts, tokens)` scores (the one scoring path of training, evaluation
and serving). Requests are split into chunks of at most `max_batch_pairs` pairs; `@serve.batch`
coalesces chunks of concurrent requests into one forward pass. The forward runs in a
one-thread executor so that the replica's event loop keeps collecting the next batch meanwhile.

Each replica holds the token store in its own memory (compressed bytes, `TokenStore`): a request
costs one Ray hop (ingress -> reranker), not two, and the gather is a numpy take in-process. The
price is one copy of the corpus per replica (24.7 kB per image at int8: 1M images = 25 GB); a
corpus larger than a replica's memory needs the store split by id range across replicas.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from ray import serve

from model.ranking import read_ranking
from schemas.token_table import TableMetadata
from serving.config import ServeConfig
from serving.live_images import AddResult, LiveImages, RejectedImage
from serving.token_store import TokenStore, decode_blobs

log = logging.getLogger("ray.serve")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class PairChunk:
    """Up to max_batch_pairs pairs: texts and their encoded image tokens."""

    texts: List[str]
    blob: np.ndarray
    scales: Optional[np.ndarray]


@dataclass
class Scores:
    """ITM logits of a request's pairs, or the image ids that are unknown."""

    logits: Optional[np.ndarray]
    missing: List[str]
    urls: Optional[List[Optional[str]]] = None
    replica: str = ""  # the replica that scored them
    batch_pairs: int = 0  # pairs in the (largest) forward pass that scored them; > 1 when requests were merged
    rejected: Optional[str] = None  # an inline document image that could not be decoded, and why


def resolve_device(num_gpus: float) -> torch.device:
    """cuda when the replica was given a GPU and one is visible, else cpu."""
    return torch.device("cuda") if num_gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' = fp32 on CPU and bf16 on GPU (the paper's inference precision; tolerance in ARCHITECTURE.md)."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


class PairScorer:
    """Loads a checkpoint once and scores pair chunks in one forward pass (in-process; no Serve)."""

    def __init__(self, checkpoint: str, meta: TableMetadata, device: torch.device, precision: str):
        from model.edje import load_checkpoint

        self.model = load_checkpoint(checkpoint, map_location=str(device))
        self.precision = resolve_precision(precision, device)
        self.model.to(DTYPES[self.precision]).eval()
        self.device, self.meta = device, meta

    @torch.inference_mode()
    def score_chunks(self, chunks: Sequence[PairChunk]) -> List[np.ndarray]:
        """One forward over the concatenated chunks; logits split back per chunk (float32)."""
        texts = [t for c in chunks for t in c.texts]
        blob = np.concatenate([c.blob for c in chunks]) if len(chunks) > 1 else chunks[0].blob
        scales = None
        if chunks[0].scales is not None:
            scales = np.concatenate([c.scales for c in chunks]) if len(chunks) > 1 else chunks[0].scales
        tokens = decode_blobs(self.meta, blob, scales, self.device).to(DTYPES[self.precision])
        logits = self.model.encoder.score(texts, tokens).float().cpu().numpy()
        return np.split(logits, np.cumsum([len(c.texts) for c in chunks])[:-1])


@serve.deployment
class Reranker:
    """Joint-encoder scoring behind `@serve.batch`, over the token store it holds."""

    def __init__(self, config: ServeConfig):
        from model.edje import read_checkpoint_config

        self.config = config
        resources = config.reranker
        device = resolve_device(resources.num_gpus)
        if device.type == "cpu":
            torch.set_num_threads(config.torch_threads or max(1, int(resources.num_cpus)))
        self.store = TokenStore.load(config.token_tables, read_checkpoint_config(config.checkpoint))
        self.scorer = PairScorer(config.checkpoint, self.store.meta, device, config.precision)
        self.ranking = read_ranking(config.checkpoint)
        # Live images (serving/live_images.py): the shared log applied to this replica's store, inline document images.
        self.live = LiveImages(self.store, self.scorer.model.adapter, device, config.live_dir, config.max_image_pixels,
                               config.image_cache_size)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edje-forward")
        self._batched_forward.set_max_batch_size(config.max_batch_pairs)
        self._batched_forward.set_batch_wait_timeout_s(config.batch_wait_timeout_s)
        self.replica = _replica_id()
        log.info("reranker %s on %s (%s), %d images (%.1f MB), batching=%s, max_batch_pairs=%d, threads=%d",
                 self.replica, device, self.scorer.precision, len(self.store), self.store.memory_bytes / 1e6,
                 config.dynamic_batching, config.max_batch_pairs, torch.get_num_threads())

    async def score_pairs(self, texts: List[str], image_ids: List[str], with_urls: bool = False,
                          text_embeddings: Optional[np.ndarray] = None, images: Optional[Dict[int, bytes]] = None) -> Scores:
        """Scores of (texts[i], image_ids[i]), or the unknown ids. With `text_embeddings` [B, e], the
        checkpoint's ranking rule (ITM logit + w x first-stage cosine; what the HTTP API ranks by);
        without them, the ITM logit alone (the miner's rescoring). `images` {position: bytes}: inline
        document images, scored in place of image_ids[position] (encoded once per replica, cached)."""
        if len(texts) != len(image_ids):
            raise ValueError(f"{len(texts)} texts but {len(image_ids)} image ids")
        inline = {}
        if images:
            try:
                inline = await asyncio.get_running_loop().run_in_executor(self.executor, self.live.encode_inline, images)
            except RejectedImage as e:
                return Scores(None, [], replica=self.replica, rejected=f"documents.{e.index}: {e.reason}: {e.detail}")
        got = self.live.gather(image_ids, with_urls, inline)
        if got.missing:
            return Scores(None, got.missing, replica=self.replica)
        step = self.config.max_batch_pairs
        chunks = [PairChunk(texts[i:i + step], got.blob[i:i + step], None if got.scales is None else got.scales[i:i + step])
                  for i in range(0, len(texts), step)]
        forward = self._batched_forward if self.config.dynamic_batching else self._single_forward
        parts = await asyncio.gather(*(forward(c) for c in chunks))
        logits = np.concatenate([p[0] for p in parts])
        if self.ranking.first_stage_weight and text_embeddings is not None:
            if len(text_embeddings) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(text_embeddings)} text embeddings")
            sim = np.einsum("ij,ij->i", np.asarray(text_embeddings, np.float32), got.embeddings)
            logits = self.ranking.fuse(logits, sim)
        return Scores(logits, [], got.urls, self.replica, max(p[1] for p in parts))

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.005, batch_size_fn=lambda chunks: sum(len(c.texts) for c in chunks))
    async def _batched_forward(self, chunks: List[PairChunk]) -> List[Tuple[np.ndarray, int]]:
        loop = asyncio.get_running_loop()
        logits = await loop.run_in_executor(self.executor, self.scorer.score_chunks, chunks)
        pairs = sum(len(c.texts) for c in chunks)
        return [(x, pairs) for x in logits]

    async def _single_forward(self, chunk: PairChunk) -> Tuple[np.ndarray, int]:
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(self.executor, self.scorer.score_chunks, [chunk]))[0], len(chunk.texts)

    async def add_image(self, data: bytes, image_id: Optional[str] = None, url: Optional[str] = None) -> AddResult:
        """Encode an image (backbone + adapter + codec, in the forward thread) and add it to the corpus
        through the shared log (serving/live_images.py): every replica and the first stage apply it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.live.add, data, image_id, url)

    def image_urls(self, image_ids: List[str]) -> List[Optional[str]]:
        """Source urls of corpus images (None where unknown): what an unscored result (image-only search) echoes."""
        self.live.sync()
        rows, _ = self.store.rows(image_ids)
        return [self.store.urls[r] if r >= 0 else None for r in rows]

    def info(self) -> dict:
        """Device, precision, batching settings and token store of this replica."""
        self.live.sync()
        return dict(device=str(self.scorer.device), precision=self.scorer.precision, pid=os.getpid(),
                    replica=self.replica, dynamic_batching=self.config.dynamic_batching,
                    max_batch_pairs=self.config.max_batch_pairs, torch_threads=torch.get_num_threads(),
                    ranking=dataclasses.asdict(self.ranking), live_images=self.live.info(),
                    token_store=self.store.info())

    def actor_name(self) -> str:
        """This replica's Ray actor name (namespace 'serve'); tests kill replicas by it."""
        import ray

        return ray.get_runtime_context().get_actor_name()


def _replica_id() -> str:
    """Serve's id of this replica (the pid outside Serve)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not inside a Serve replica (in-process use)
        return f"pid-{os.getpid()}"
