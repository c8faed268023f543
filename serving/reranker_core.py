"""The reranker's plain core: a token store, the scoring core and live images in one process (no Ray Serve).

`serving/reranker.py` is the Serve deployment around it (dynamic batching, the forward thread);
tests, benchmarks and the GPU smoke run this class in-process. Scoring goes through
model/scoring.py, the one reranking core of evaluation, serving and the Python API.

The core holds the token store in its own memory (compressed bytes, `TokenStore`): a request costs
one Ray hop (ingress -> reranker), and the gather is a numpy take in-process.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from edje.model.device import pick_device
from edje.model.scoring import PairScorer, decode_blobs
from edje.schemas.token_table import TableMetadata
from edje.serving.config import ServeConfig
from edje.serving.live_images import AddResult, LiveImages, RejectedImage
from edje.storage.token_store import TokenBlobs, TokenStore


@dataclass
class PairChunk:
    """Up to max_batch_pairs pairs: texts and their encoded image tokens."""

    texts: List[str]
    blob: np.ndarray
    scales: Optional[np.ndarray]


@dataclass
class Scores:
    """ITM logits of a request's pairs (and their first-stage cosines, when text embeddings were given), or the
    image ids that are unknown. The ingress fuses the two: a rule may read the request's best cosine, and a
    request's pairs can lie on several shards."""

    logits: Optional[np.ndarray]
    missing: List[str]
    urls: Optional[List[Optional[str]]] = None
    replica: str = ""  # the replica that scored them
    batch_pairs: int = 0  # pairs in the (largest) forward pass that scored them; > 1 when requests were merged
    rejected: Optional[str] = None  # an inline document image that could not be decoded, and why
    cosines: Optional[np.ndarray] = None  # first-stage cosine of each pair


def resolve_device(num_gpus: float) -> torch.device:
    """The device rule (model/device.py) for a replica: cpu unless it was given a GPU."""
    return pick_device(None if num_gpus > 0 else "cpu")


def score_chunks(scorer: PairScorer, meta: TableMetadata, chunks: Sequence[PairChunk]) -> List[np.ndarray]:
    """One forward over the concatenated chunks; ITM logits split back per chunk (float32)."""
    texts = [t for c in chunks for t in c.texts]
    blob = np.concatenate([c.blob for c in chunks]) if len(chunks) > 1 else chunks[0].blob
    scales = None
    if chunks[0].scales is not None:
        scales = np.concatenate([c.scales for c in chunks]) if len(chunks) > 1 else chunks[0].scales
    tokens = decode_blobs(meta, blob, scales, scorer.device)
    with torch.inference_mode():
        logits = scorer.model.encoder.score(texts, tokens.to(scorer.dtype)).float().cpu().numpy()
    return np.split(logits, np.cumsum([len(c.texts) for c in chunks])[:-1])


@dataclass
class Prepared:
    """A request's pairs, gathered and cut into forward chunks, before any forward pass."""

    chunks: List[PairChunk]
    got: TokenBlobs


class RerankerCore:
    """Token store + scoring core + live images of one replica (in-process; no Serve)."""

    def __init__(self, config: ServeConfig, replica: str = ""):
        from edje.model.edje import read_checkpoint_config

        self.config = config
        device = resolve_device(config.reranker.num_gpus)
        if device.type == "cpu":
            torch.set_num_threads(config.torch_threads or max(1, int(config.reranker.num_cpus)))
        self.store = TokenStore.load(config.token_tables, read_checkpoint_config(config.checkpoint), config.shard, config.shards)
        self.scorer = PairScorer.from_checkpoint(config.checkpoint, device, config.precision, config.max_batch_pairs)
        self.ranking = self.scorer.ranking
        # Live images (serving/live_images.py): the shared log applied to this replica's store, inline document images.
        self.live = LiveImages(self.store, self.scorer.model.adapter, device, config.live_dir, config.max_image_pixels,
                               config.image_cache_size)
        self.replica = replica or f"pid-{os.getpid()}"

    def prepare(self, texts: List[str], image_ids: List[str], with_urls: bool = False,
                images: Optional[Dict[int, bytes]] = None) -> Union[Prepared, Scores]:
        """Gather the pairs' stored rows (inline `images` encoded in place of their ids) and cut them into chunks of
        at most max_batch_pairs; a Scores naming unknown ids or a rejected image when they cannot be scored."""
        if len(texts) != len(image_ids):
            raise ValueError(f"{len(texts)} texts but {len(image_ids)} image ids")
        inline = {}
        if images:
            try:
                inline = self.live.encode_inline(images)
            except RejectedImage as e:
                return Scores(None, [], replica=self.replica, rejected=f"documents.{e.index}: {e.reason}: {e.detail}")
        got = self.live.gather(image_ids, with_urls, inline)
        if got.missing:
            return Scores(None, got.missing, replica=self.replica)
        step = self.config.max_batch_pairs
        chunks = [PairChunk(texts[i:i + step], got.blob[i:i + step], None if got.scales is None else got.scales[i:i + step])
                  for i in range(0, len(texts), step)]
        return Prepared(chunks, got)

    def forward(self, chunks: Sequence[PairChunk]) -> List[np.ndarray]:
        """One forward pass over the chunks (of one or several requests); ITM logits per chunk."""
        return score_chunks(self.scorer, self.store.meta, chunks)

    def finish(self, prepared: Prepared, logits: np.ndarray, batch_pairs: int,
               text_embeddings: Optional[np.ndarray] = None) -> Scores:
        """The request's Scores: ITM logits, with each pair's first-stage cosine when `text_embeddings` [B, e] are
        given (what the HTTP API's fused rule adds; the miner's rescoring gives none)."""
        sim = None
        if text_embeddings is not None:
            if len(text_embeddings) != len(logits):
                raise ValueError(f"{len(logits)} texts but {len(text_embeddings)} text embeddings")
            sim = np.einsum("ij,ij->i", np.asarray(text_embeddings, np.float32), prepared.got.embeddings)
        return Scores(logits, [], prepared.got.urls, self.replica, batch_pairs, cosines=sim)

    def add_image(self, data: bytes, image_id: Optional[str] = None, url: Optional[str] = None) -> AddResult:
        """Encode an image (backbone + adapter + codec) and add it to the corpus through the shared log."""
        return self.live.add(data, image_id, url)

    def cache_counts(self) -> Tuple[int, int]:
        """(hits, misses) of the inline-image cache since start (the Serve shell exports them as counters)."""
        return self.live.cache.hits, self.live.cache.misses

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
                    ranking=dataclasses.asdict(self.ranking), live_images={**self.live.info(), "replica": self.replica},
                    token_store=self.store.info())
