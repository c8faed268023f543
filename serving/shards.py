"""A corpus split into shards by a hash of the image id, and the fan-out over the shards' deployments.

Each shard is a FirstStage and a Reranker deployment that hold only the rows whose id hashes to it (token tables,
embeddings, live images). A text search embeds the query once, on one shard's first stage (the shards take turns),
which searches its rows with it; every other shard searches with that vector, and the top k are merged by score.
Pairs are scored by the reranker of the shard that owns the image, so tokens never leave their shard. Serve's
deployment handles do the routing and load balancing inside a shard (its `replicas_per_shard` replicas); this
module says which shard owns an id, puts the shards' answers back in request order, and calls a deployment once
more when its replica was lost mid-call (`call_with_retry`: Serve's router drops the dead replica, so the second
call goes to another). With one shard every call goes to the one deployment as is. `ShardedRerankers` is the
shards' rerankers as one handle, for the miner's rescoring.
"""
from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
from collections import defaultdict
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edje.storage.shards import shard_of

Call = Callable[..., Awaitable]
log = logging.getLogger("ray.serve")


def replica_lost(error: BaseException) -> bool:
    """Whether a deployment call failed because the replica that had it died or became unreachable (another
    replica of the deployment can answer it), rather than because of the request."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
    from ray.serve.exceptions import ReplicaUnavailableError

    lost = (RayActorError, WorkerCrashedError, NodeDiedError, ReplicaUnavailableError)  # ActorDiedError is a RayActorError
    return isinstance(error, lost) or isinstance(getattr(error, "cause", None), lost)


async def call_with_retry(method, *args, **kwargs):
    """`await method.remote(...)`, and once more when its replica was lost mid-call: the first failure makes Serve's
    router drop that replica, so the second call goes to another one of the deployment (calls must be idempotent)."""
    try:
        return await method.remote(*args, **kwargs)
    except Exception as e:
        if not replica_lost(e):
            raise
        log.warning("replica lost during %s (%s); calling again", getattr(method, "_method_name", method), type(e).__name__)
        return await method.remote(*args, **kwargs)


def merge_hits(per_shard: Sequence[Sequence[Tuple[str, float]]], k: int) -> List[Tuple[str, float]]:
    """The global top k of the shards' top-k lists (each sorted best first); ties keep shard order."""
    return heapq.nlargest(k, (h for hits in per_shard for h in hits), key=lambda h: h[1])


class ShardedCorpus:
    """Handles of every shard's first stage and reranker; the calls the ingress makes, fanned out and merged."""

    def __init__(self, rerankers: Sequence, first_stages: Sequence):
        self.rerankers = list(rerankers)
        self.first_stages = [f for f in first_stages if f is not None]  # a reranker may be served without a first stage
        self.num_shards = len(self.rerankers)
        if self.first_stages and len(self.first_stages) != self.num_shards:
            raise ValueError(f"{self.num_shards} reranker shards but {len(self.first_stages)} first-stage shards")
        self._next = 0  # the shard whose text tower embeds the next query (they take turns)

    def _turn(self) -> int:
        """The next shard in turn (spreads the text tower's work over the shards)."""
        self._next = (self._next + 1) % self.num_shards
        return self._next

    def owner(self, image_id: str) -> int:
        """Shard of an image id."""
        return shard_of(image_id, self.num_shards)

    def _by_shard(self, image_ids: Sequence[str]) -> Dict[int, List[int]]:
        positions: Dict[int, List[int]] = defaultdict(list)
        for i, x in enumerate(image_ids):
            positions[self.owner(x)].append(i)
        return positions

    # ----- first stage -----
    async def search(self, call: Call, query: str, k: int) -> List[Tuple[str, float]]:
        """Top-k (id, cosine) of a text over every shard."""
        return (await self.search_text(call, query, k)).hits

    async def search_text(self, call: Call, query: str, k: int):
        """Top-k of a text over every shard and its embedding (an ImageQueryHits), the text embedded once: one shard
        in turn embeds it and searches its rows, every other shard searches with that vector."""
        s = self._turn()
        found = await call(self.first_stages[s].search_text, query, k)
        if self.num_shards == 1:
            return found
        others = [i for i in range(self.num_shards) if i != s]
        got = await asyncio.gather(*(call(self.first_stages[i].search_vector, found.query_embedding, k) for i in others))
        per_shard: List[List[Tuple[str, float]]] = [[] for _ in range(self.num_shards)]
        per_shard[s] = found.hits
        for i, hits in zip(others, got):
            per_shard[i] = hits
        found.hits = merge_hits(per_shard, k)  # in shard order, whichever shard embedded: ties break alike
        return found

    async def search_image(self, call: Call, image_id: str, query: Optional[str], image_weight: float, k: int):
        """An image (+ text) query: the owner builds the query vector; every other shard searches with it."""
        owner = self.first_stages[self.owner(image_id)]
        found = await call(owner.search_image, image_id, query, image_weight, k)
        if self.num_shards == 1 or found.missing:
            return found
        others = [fs for s, fs in enumerate(self.first_stages) if s != self.owner(image_id)]
        got = await asyncio.gather(*(call(fs.search_vector, found.query_embedding, k) for fs in others))
        found.hits = merge_hits([found.hits, *got], k)
        return found

    async def embed(self, call: Call, texts: List[str]) -> np.ndarray:
        """Text embeddings (every shard's text tower is the same; the shards take turns)."""
        return await call(self.first_stages[self._turn()].embed, texts)

    async def sync_live(self, call: Call, image_id: str) -> None:
        """Index an added image now on the first stage of its shard."""
        await call(self.first_stages[self.owner(image_id)].sync_live)

    # ----- reranker -----
    async def score_pairs(self, call: Call, texts: List[str], image_ids: List[str], with_urls: bool = False,
                          text_embeddings: Optional[np.ndarray] = None, images: Optional[Dict[int, bytes]] = None):
        """Scores of the pairs, each scored by the reranker of the shard that owns its image."""
        if self.num_shards == 1:
            return await call(self.rerankers[0].score_pairs, texts, image_ids, with_urls, text_embeddings, images)
        parts = self._by_shard(image_ids)
        shards = sorted(parts)
        got = await asyncio.gather(*(call(
            self.rerankers[s].score_pairs, [texts[i] for i in parts[s]], [image_ids[i] for i in parts[s]], with_urls,
            None if text_embeddings is None else text_embeddings[parts[s]],
            {j: images[i] for j, i in enumerate(parts[s]) if i in images} if images else None) for s in shards))
        rejected = next((g.rejected for g in got if g.rejected), None)
        missing = [x for g in got for x in g.missing]
        replicas = ",".join(g.replica for g in got)
        if rejected or missing:
            return dataclasses.replace(got[0], logits=None, missing=list(dict.fromkeys(missing)), urls=None,
                                       replica=replicas, rejected=rejected)
        logits = np.zeros(len(texts), np.float32)
        cosines = None if text_embeddings is None else np.zeros(len(texts), np.float32)
        urls: Optional[List[Optional[str]]] = [None] * len(texts) if with_urls else None
        for s, g in zip(shards, got):
            logits[parts[s]] = g.logits
            if cosines is not None:
                cosines[parts[s]] = g.cosines
            if urls is not None and g.urls is not None:
                for j, i in enumerate(parts[s]):
                    urls[i] = g.urls[j]
        return dataclasses.replace(got[0], logits=logits, missing=[], urls=urls, replica=replicas,
                                   batch_pairs=max(g.batch_pairs for g in got), rejected=None, cosines=cosines)

    async def image_urls(self, call: Call, image_ids: List[str]) -> List[Optional[str]]:
        """Source urls of corpus images from the shards that own them (None where unknown)."""
        if self.num_shards == 1:
            return await call(self.rerankers[0].image_urls, image_ids)
        parts = self._by_shard(image_ids)
        got = await asyncio.gather(*(call(self.rerankers[s].image_urls, [image_ids[i] for i in parts[s]]) for s in parts))
        out: List[Optional[str]] = [None] * len(image_ids)
        for s, urls in zip(parts, got):
            for j, i in enumerate(parts[s]):
                out[i] = urls[j]
        return out

    async def add_image(self, call: Call, data: bytes, image_id: str, url: Optional[str]):
        """Add an image on the shard that owns its id (the id is chosen before: it decides the shard)."""
        return await call(self.rerankers[self.owner(image_id)].add_image, data, image_id, url)

    async def info(self, call: Call) -> dict:
        """Shard 0's reranker info, with the corpus and token bytes summed over the shards and listed per shard."""
        infos = await asyncio.gather(*(call(r.info) for r in self.rerankers))
        first = dict(infos[0])
        if self.num_shards > 1:
            stores = [i["token_store"] for i in infos]
            first["token_store"] = {**stores[0], "images": sum(s["images"] for s in stores),
                                    "memory_bytes": sum(s["memory_bytes"] for s in stores)}
            first["shards"] = [{"shard": s, "images": st["images"], "memory_bytes": st["memory_bytes"]}
                               for s, st in enumerate(stores)]
        return first

    def probes(self) -> Dict[str, Callable]:
        """Readiness probe per deployment (name -> handle method)."""
        out = {}
        for kind, handles in (("Reranker", self.rerankers), ("FirstStage", self.first_stages)):
            for s, h in enumerate(handles):
                out[kind if self.num_shards == 1 else f"{kind}-{s}"] = h.ready
        return out



class _Remote:
    """`x.remote(*args)` over a coroutine function: how the miner calls its reranker's methods."""

    def __init__(self, fn: Callable[..., Awaitable]):
        self.fn = fn

    def remote(self, *args, **kwargs) -> Awaitable:
        """The coroutine, to be awaited like a deployment response."""
        return self.fn(*args, **kwargs)


class ShardedRerankers:
    """The shards' Reranker handles as one reranker for the miner: `score_pairs.remote(texts, image_ids)` scores each
    pair on the shard that owns its image (Serve turns the bound deployments held here into handles)."""

    def __init__(self, rerankers: Sequence):
        self.rerankers = list(rerankers)

    @property
    def score_pairs(self) -> _Remote:
        """score_pairs over the shards (ShardedCorpus.score_pairs), each call retried once on a lost replica."""
        corpus = ShardedCorpus(self.rerankers, [])
        return _Remote(lambda texts, image_ids: corpus.score_pairs(call_with_retry, texts, image_ids))
