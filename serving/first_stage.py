"""First stage: a FAISS inner-product index over pooled image embeddings, queried by the backbone's text tower.

Embeddings in token tables are L2-normalised, so inner product = cosine similarity. The
backbone (name, pretrained tag or path, feature layer) is the one the tables name in their
metadata: the text tower must be the one that made the image embeddings.

Mixed-modal queries (a corpus image and a text that modifies it) search with one vector,
normalise(w x image embedding + (1 - w) x text embedding) (`combine_query`); the image's embedding is the one
the index holds (the token tables' pooled embedding), and the query image is excluded from its own results.
A corpus image alone (w = 1, no text) is an image-to-image query.

Devices: the text tower runs on `device` (default: cuda when the replica sees a GPU, else cpu). The
FAISS index stays on the CPU unless this faiss build has GPU support and the device is a GPU.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from edje.model.device import pick_device
from edje.schemas.token_table import TableMetadata, TableMismatchError, read_metadata, read_token_tables, vector_matrix
from edje.serving.live_images import LiveLog, embeddings_of_tables
from edje.storage.embedding_index import EmbeddingIndex, mapped_index
from edje.storage.shards import filter_shard
from edje.storage.table_cache import is_local

log = logging.getLogger("ray.serve")


def load_backbone(meta: TableMetadata, pretrained_override: Optional[str] = None, device=None,
                  query_towers: Sequence = (), checkpoint: Optional[str] = None):
    """The VisionBackbone a table's metadata names (its text tower embeds queries and captions), on `device`
    (None: cuda when visible, else cpu), with a ranking rule's query towers joining its text tower (their weight
    files found beside `checkpoint` first)."""
    from edje.model.backbone import VisionBackbone

    cfg = meta.first_stage_backbone(pretrained_override)
    backbone = VisionBackbone.create(cfg, device=pick_device(device))
    if backbone.embed_dim != meta.embed_dim:
        raise TableMismatchError("embed_dim", meta.embed_dim, backbone.embed_dim, f"backbone {cfg.name}")
    return backbone.join_query_towers(query_towers, checkpoint)


def embed_texts(backbone, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """Normalised text embeddings [B, e] float32 from the backbone's text tower, in batches."""
    out = [backbone.encode_text(list(texts[i:i + batch_size])).float().cpu().numpy()
           for i in range(0, len(texts), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, backbone.embed_dim), np.float32)


def combine_query(image_embeddings: np.ndarray, text_embeddings: Optional[np.ndarray], image_weight: float) -> np.ndarray:
    """Unit query vectors [B, e]: normalise(w x image + (1 - w) x text), or the image's alone without a text."""
    image = np.asarray(image_embeddings, dtype=np.float32)
    mix = image if text_embeddings is None else (
        image_weight * image + (1.0 - image_weight) * np.asarray(text_embeddings, dtype=np.float32))
    # A zero sum (opposite directions at w = 0.5) stays zero rather than NaN: every cosine is then 0.
    norm = np.maximum(np.linalg.norm(mix, axis=1, keepdims=True), 1e-12)
    return (mix / norm).astype(np.float32)


def image_queries(index: EmbeddingIndex, backbone, image_ids: Sequence[str], texts: Optional[Sequence[str]],
                  image_weight: float) -> Tuple[Optional[np.ndarray], List[str]]:
    """Query vectors of (corpus image, text) queries (`texts` None: image-only), or (None, the unknown image ids)."""
    images, missing = index.vectors(image_ids)
    if missing:
        return None, missing
    text = None if texts is None else embed_texts(backbone, texts)
    return combine_query(images, text, image_weight), []


def read_image_embeddings(paths: Sequence[str], shard: int = 0, num_shards: int = 1,
                          **expected) -> Tuple[List[str], np.ndarray, TableMetadata]:
    """image_id and image_embedding columns of token tables of any kind that agree on their backbone (with
    num_shards > 1: the rows of one shard)."""
    first = read_metadata(paths[0])
    same = {**dict(backbone=first.backbone, pretrained=first.pretrained, feature_layer=first.feature_layer,
                   embed_dim=first.embed_dim), **expected}
    for p in paths:
        read_metadata(p).check(p, **same)
    ids, vectors = [], []
    for p in paths:  # one by one: tables of different kinds may not share a token schema
        table, _ = read_token_tables([p], columns=["image_id", "image_embedding"], **same)
        table = filter_shard(table, shard, num_shards)
        ids.extend(table.column("image_id").to_pylist())
        vectors.append(vector_matrix(table.column("image_embedding")))
    ids, vectors = _dedupe(ids, np.concatenate(vectors))
    return ids, vectors, first


def _dedupe(ids: List[str], vectors: np.ndarray) -> Tuple[List[str], np.ndarray]:
    """Keep the first row of each image id (the same image in two tables is one candidate)."""
    _, first = np.unique(np.asarray(ids, dtype=object), return_index=True)
    if len(first) == len(ids):
        return ids, vectors
    keep = np.sort(first)
    log.warning("first stage: %d duplicate image ids kept once", len(ids) - len(keep))
    return [ids[i] for i in keep], vectors[keep]


@dataclass
class ImageQueryHits:
    """The first stage's answer to a text query or one that names a corpus image: hits and the query vector, or the
    unknown id."""

    hits: List[Tuple[str, float]]
    query_embedding: Optional[np.ndarray]  # [e]: the fused ranking rule's first-stage side (its cosine = the hit's)
    missing: List[str]


class FirstStage:
    """Text, image or mixed query -> top-k image ids by cosine similarity of pooled embeddings."""

    def __init__(self, token_tables: Sequence[str], index_factory: str = "Flat", pretrained_override: Optional[str] = None,
                 torch_threads: int = 1, live_dir: Optional[str] = None, device: Optional[str] = None,
                 index_search_params: str = "", shard: int = 0, num_shards: int = 1, query_towers: Sequence = (),
                 checkpoint: Optional[str] = None):
        torch.set_num_threads(max(1, torch_threads))
        self.device = pick_device(device)  # None: the GPU when this replica was given one
        if index_factory != "Flat" and is_local(token_tables):
            # Trained and saved once per node beside the memory-mapped embeddings, then read with IO_FLAG_MMAP:
            # the replicas share its pages instead of each holding the codes (storage/embedding_index.py).
            self.index, meta = mapped_index(token_tables, index_factory, index_search_params, shard, num_shards,
                                            self.device)
            print(f"[first stage] {index_factory} {index_search_params}: memory-mapped {self.index.index_path} "
                  f"({self.index.build_info}) for {len(self.index):,} images", flush=True)
        else:
            ids, vectors, meta = read_image_embeddings(token_tables, shard, num_shards)
            self.index = EmbeddingIndex(ids, vectors, index_factory, self.device, index_search_params)
        if index_factory != "Flat" and self.index.index_path is None:  # an approximate index says what it loses
            print(f"[first stage] {index_factory} {index_search_params}: recall@10 against exact search "
                  f"{self.index.recall_vs_exact(10):.3f} (1,000 stored vectors as queries), index {self.index.nbytes():,} B "
                  f"for {len(self.index):,} images", flush=True)
            self.index.release_vectors()  # serve from the codes: the point of a compressed index is its memory
        self.backbone = load_backbone(meta, pretrained_override, self.device, query_towers, checkpoint)
        # Live images: the shared append log (serving/live_images.py), applied now and before each call.
        self.live = LiveLog(live_dir) if live_dir else None
        self.live_offset, self.live_lock = 0, threading.Lock()
        self.sync_live()
        log.info("first stage: %d images indexed (%s), text tower on %s", len(self.index), index_factory, self.device)

    def sync_live(self) -> int:
        """Index the live images committed since the last call; returns how many."""
        if self.live is None or self.live.size() == self.live_offset:
            return 0
        with self.live_lock:
            paths, offset = self.live.read(self.live_offset)
            ids, vectors = embeddings_of_tables(paths)
            rows, _ = self.index.rows_of(ids)  # a lookup, not a set of every indexed id
            keep = [i for i, r in enumerate(rows) if r < 0]
            if keep:
                self.index.add([ids[i] for i in keep], vectors[keep])
            self.live_offset = offset
            return len(keep)

    def search(self, query: str, k: int) -> List[Tuple[str, float]]:
        """Top-k (image id, cosine) for one query text."""
        return self.search_text(query, k).hits

    def search_text(self, query: str, k: int) -> ImageQueryHits:
        """Top-k (image id, cosine) for one query text, with the text's embedding: the other shards search with it,
        and the fused ranking rule adds its cosine, so a search embeds its text once."""
        self.sync_live()
        vector = embed_texts(self.backbone, [query])
        return ImageQueryHits(self._hits(*self.index.search(vector, k)), vector[0], [])

    def search_image(self, image_id: str, query: Optional[str], image_weight: float, k: int) -> ImageQueryHits:
        """Top-k (image id, cosine) for a corpus image and an optional text (`combine_query`), the image excluded."""
        self.sync_live()
        vectors, missing = image_queries(self.index, self.backbone, [image_id], None if query is None else [query],
                                         image_weight)
        if missing:
            return ImageQueryHits([], None, missing)
        return ImageQueryHits(self._hits(*self.index.search(vectors, k, exclude=[image_id])), vectors[0], [])

    def search_vector(self, vector: np.ndarray, k: int) -> List[Tuple[str, float]]:
        """Top-k (image id, cosine) for a query vector built elsewhere (another shard's image query)."""
        self.sync_live()
        return self._hits(*self.index.search(np.asarray(vector, np.float32)[None], k))

    def _hits(self, scores: np.ndarray, rows: np.ndarray) -> List[Tuple[str, float]]:
        """(image id, cosine) of one query's search result, without the empty slots."""
        return [(self.index.ids[r], float(s)) for r, s in zip(rows[0], scores[0]) if r >= 0]

    def embed(self, texts: List[str]) -> np.ndarray:
        """Normalised text embeddings [len(texts), e] (the fused ranking rule's first-stage side)."""
        return embed_texts(self.backbone, texts)

    def size(self) -> int:
        """Images in the index."""
        return len(self.index)
