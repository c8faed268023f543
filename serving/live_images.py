"""Live images: bytes -> frozen backbone + the checkpoint's adapter + the tables' codec -> rows of the served corpus.

Persistence and consistency go through one append log that every replica applies (serving/live_log.py):

- ``<live_dir>/LOG``: one record per added image (its token row as an Arrow record batch, with a sequence
  number and a checksum), appended under an exclusive ``flock`` and fsync'd before the add answers. The
  replica that adds an image holds the lock while it reads every record it has not applied yet, checks the
  id against the corpus (409 when taken) and appends, so duplicate ids are refused across replicas.
- ``<live_dir>/parts/*.parquet`` + ``MANIFEST``: LOG compacted into token tables of bounded size (the served
  tables' schema and metadata) by the replica whose add filled it, in a thread, crash-safe at every step.
- ``<live_dir>/sources/<sha256 of the id>``: the image's own bytes, written before its record
  (serving/live_sources.py), so that it has a thumbnail whatever its url does later.

Each reranker and first-stage replica applies the log at start (parts, then records) and before every
request (LOG's generation and size: one open, a 24-byte read, one ``fstat``). An add answers only after its
record is on disk, so every later request to any replica sees the image; a restarted or replacement replica
loads the whole log: nothing is lost. The live folder must be a POSIX
filesystem that all replicas share (local disk on one node, NFS/EFS on a cluster).
"""
from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import torch

from edje.model.image_decode import DECOMPRESSION_BOMB, ImageRejected, decode_image
from edje.model.token_encoder import EncodedImages
from edje.schemas.token_table import TableMetadata, build_table_from_blobs, read_token_tables, vector_matrix
from edje.serving.live_log import LOG_NAME, LiveLog, LiveLogConfig
from edje.serving.live_sources import content_hash, default_image_id, keep_source
from edje.storage.token_store import TokenBlobs

log = logging.getLogger("ray.serve")

__all__ = ["LOG_NAME", "LiveLog", "LiveLogConfig", "LiveImages", "AddResult", "RejectedImage", "ImageEncoder"]


class RejectedImage(ValueError):
    """An image that cannot be encoded; `index` is its position in the call, `reason` a pipeline.reasons code."""

    def __init__(self, index: int, reason: str, detail: str):
        self.index, self.reason, self.detail = index, reason, detail
        super().__init__(f"image {index}: {reason}: {detail}")


class ImageEncoder:
    """The encode job's path for a few images in a replica: decode, then model.token_encoder (frozen, no grad)."""

    def __init__(self, meta: TableMetadata, adapter: torch.nn.Module, device: torch.device, max_pixels: int):
        from edje.model.token_encoder import TokenEncoder
        from edje.schemas.config import CodecConfig

        self.meta, self.max_pixels = meta, max_pixels
        if getattr(meta, "embedding_backbone", None):
            # Tables of diagnostic tokens (not the backbone's): an image cannot be encoded into them.
            raise ValueError(f"the served tables' tokens do not come from backbone {meta.backbone}: no live images")
        # The backbone the tables name, at the revision and weights they record: live rows must come from the same
        # model as the stored ones.
        self.encoder = TokenEncoder.create(meta.backbone_config(), adapter,
                                           CodecConfig(meta.quantization, meta.group_size), device, meta.compute_dtype)
        if self.encoder.backbone.embed_dim != meta.embed_dim:
            raise ValueError(f"backbone {meta.backbone} embeds in {self.encoder.backbone.embed_dim}, tables in {meta.embed_dim}")

    def decode(self, datas: Sequence[bytes]) -> np.ndarray:
        """uint8 [B, S, S, 3] at the backbone's size; RejectedImage names the first bad one."""
        return decode_all(datas, self.encoder.backbone.preprocess, self.max_pixels)

    def encode(self, datas: Sequence[bytes]) -> EncodedImages:
        """Image bytes -> encoded rows, the way the encode job writes compressed tables."""
        return self.encoder.encode(self.decode(datas))


def decode_all(datas: Sequence[bytes], preprocess, max_pixels: int) -> np.ndarray:
    """Decode and resize image bytes for a backbone's preprocessing; RejectedImage names the first bad one."""
    out = []
    for i, data in enumerate(datas):
        try:
            out.append(decode_image(data, preprocess.size, preprocess.resize_mode, max_pixels))
        except ImageRejected as e:
            raise RejectedImage(i, e.reason, e.detail) from None
    return np.stack(out)


class EncodedCache:
    """LRU of encoded inline images by content hash (a document image is encoded once per replica)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: "collections.OrderedDict[str, EncodedImages]" = collections.OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: str) -> Optional[EncodedImages]:
        """The cached rows of `key`, or None."""
        got = self.items.get(key)
        if got is not None:
            self.items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return got

    def put(self, key: str, value: EncodedImages) -> None:
        """Insert, evicting the least recently used past capacity."""
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)


@dataclass
class AddResult:
    """The outcome of adding one image: its id, or an HTTP status and detail saying why not."""

    image_id: str
    sha256: str
    status: int = 200
    detail: str = ""
    corpus_size: int = 0


class LiveImages:
    """One reranker replica's live-image side: applies the log to its token store, adds and encodes images."""

    def __init__(self, store, adapter: torch.nn.Module, device: torch.device, live_dir: Optional[str],
                 max_pixels: int, cache_size: int, log_config: Optional[LiveLogConfig] = None):
        self.store, self.adapter, self.device, self.max_pixels = store, adapter, device, max_pixels
        self.log = LiveLog(live_dir, log_config, _same_as(store.meta)) if live_dir else None
        self.cache = EncodedCache(cache_size)
        self._encoder: Optional[ImageEncoder] = None
        self._lock = threading.Lock()  # the event loop (sync) and the forward thread (add) both touch the store
        self._compacting = threading.Lock()  # one compaction thread per replica at a time
        self.added = 0
        self.compactions: List[dict] = []  # what this replica's compactions did (newest last)
        self.sync()

    @property
    def encoder(self) -> ImageEncoder:
        """The backbone is loaded on the first image this replica encodes."""
        if self._encoder is None:
            self._encoder = ImageEncoder(self.store.meta, self.adapter, self.device, self.max_pixels)
        return self._encoder

    def sync(self) -> int:
        """Apply records this replica has not applied yet; returns the rows added."""
        if self.log is None or not self.log.changed():
            return 0
        with self._lock:
            return self._apply(self.log.poll())

    def _apply(self, table: Optional[pa.Table]) -> int:
        """Add the rows whose ids the store lacks (after a compaction a part may repeat rows already applied)."""
        if table is None:
            return 0
        ids = table.column("image_id").to_pylist()
        rows, _ = self.store.rows(ids)  # one vectorised lookup, not a set of every id in the corpus
        seen, keep = set(), []
        for i, (image_id, r) in enumerate(zip(ids, rows)):
            if r < 0 and image_id not in seen:
                seen.add(image_id)
                keep.append(i)
        if not keep:
            return 0
        self.store.add_table(table.take(pa.array(keep, pa.int64())) if len(keep) < table.num_rows else table)
        return len(keep)

    def add(self, data: bytes, image_id: Optional[str], url: Optional[str]) -> AddResult:
        """Encode one image, commit it to the log under the lock (409 on a duplicate id), apply it here."""
        sha = content_hash(data)
        image_id = image_id or default_image_id(data)
        if self.log is None:
            return AddResult(image_id, sha, 404, "live images are not enabled on this server (no live_dir)")
        try:
            rows = self.encoder.encode([data])
        except RejectedImage as e:
            return AddResult(image_id, sha, 413 if e.reason == DECOMPRESSION_BOMB else 422,
                             f"image rejected: {e.reason}: {e.detail}")
        return self.add_encoded(image_id, rows, url, data, sha)

    def add_encoded(self, image_id: str, rows: EncodedImages, url: Optional[str] = None, data: Optional[bytes] = None,
                    sha: str = "") -> AddResult:
        """Commit one already-encoded image (one row) to the log under the lock, apply it here; `data`: its source
        bytes, kept for its thumbnail. The path of `add` after the encoder (benchmarks drive it directly)."""
        if self.log is None:
            return AddResult(image_id, sha, 404, "live images are not enabled on this server (no live_dir)")
        with self._lock, self.log.locked():
            self._apply(self.log.poll_locked())  # every record committed so far, by any replica, before the check
            if image_id in self.store.row:
                return AddResult(image_id, sha, 409, f"image id {image_id!r} is already in the corpus",
                                 len(self.store))
            table = build_table_from_blobs(self.store.meta, [image_id], rows.blob, rows.scales, rows.embeddings,
                                           urls=[url])
            if data is not None:  # the bytes first, the record last: an image any replica sees has its bytes
                keep_source(self.log.dir, image_id, data)
            self.log.append(table)
            self.store.add_table(table)
        self.added += 1
        if self.log.wants_compaction():
            self.compact(background=self.log.config.background)
        return AddResult(image_id, sha, 200, "", len(self.store))

    def compact(self, background: bool = False) -> Optional[dict]:
        """Compact the live log now (or in a thread); None when this replica or another is already at it."""
        if self.log is None or not self._compacting.acquire(blocking=False):
            return None
        if background:
            threading.Thread(target=self._compact_and_release, name="live-log-compaction", daemon=True).start()
            return None
        return self._compact_and_release()

    def wait_for_compaction(self) -> None:
        """Block until this replica's compaction thread, if one runs, is done."""
        with self._compacting:
            pass

    def _compact_and_release(self) -> Optional[dict]:
        """One compaction (kept in `compactions`), then the slot is free again."""
        try:
            done = self.log.compact()
            if done:
                self.compactions.append(done)
            return done
        except Exception:  # a failed compaction loses nothing (the log still holds every row): say so, go on
            log.exception("live log %s: compaction failed", self.log.dir)
            return None
        finally:
            self._compacting.release()

    def encode_inline(self, datas: Dict[int, bytes]) -> Dict[int, EncodedImages]:
        """Encoded rows of inline document images by position, from the cache or encoded now (one batch)."""
        keys = {i: content_hash(d) for i, d in datas.items()}
        out, todo = {}, {}
        for i, k in keys.items():
            got = self.cache.get(k)
            if got is not None:
                out[i] = got
            else:
                todo.setdefault(k, i)  # the same image twice in a request is encoded once
        if todo:
            order = list(todo.items())
            try:
                rows = self.encoder.encode([datas[i] for _, i in order])
            except RejectedImage as e:
                raise RejectedImage(order[e.index][1], e.reason, e.detail) from None
            fresh = {k: rows.take([j]) for j, (k, _) in enumerate(order)}
            for k, r in fresh.items():
                self.cache.put(k, r)
            for i, k in keys.items():
                out.setdefault(i, fresh.get(k))
        return out

    def gather(self, image_ids: Sequence[str], with_urls: bool = False,
               inline: Optional[Dict[int, EncodedImages]] = None):
        """The store's rows of `image_ids` (after applying the log) with encoded inline images at their
        positions: TokenBlobs with embeddings, or the unknown ids."""
        self.sync()
        inline = inline or {}
        if not inline:
            got = self.store.gather_blobs(image_ids, with_urls)
            if not got.missing:
                got.embeddings = self.store.embeddings_of(image_ids)
            return got
        positions = [i for i in range(len(image_ids)) if i not in inline]
        ids = [image_ids[i] for i in positions]
        got = self.store.gather_blobs(ids, with_urls)
        if got.missing:
            return got
        stored = EncodedImages(got.blob, got.scales, self.store.embeddings_of(ids) if ids else None)
        rows = merge_rows(stored, inline, len(image_ids), positions, self.store.scales is not None)
        urls = None
        if with_urls:
            urls = [None] * len(image_ids)
            for p, u in zip(positions, got.urls):
                urls[p] = u
        return TokenBlobs(rows.blob, rows.scales, [], urls, rows.embeddings)

    def info(self) -> dict:
        """Live-image counters for GET /v1/info."""
        c = self.log.cursor if self.log else None
        return dict(enabled=self.log is not None, live_dir=self.log.dir if self.log else None, added_here=self.added,
                    log_seq_applied=c.seq if c else 0, log_bytes_applied=c.log_off if c else 0,
                    log_rows_uncompacted=c.log_rows if c else 0, compactions_here=len(self.compactions),
                    torn_tails_cut=len(self.log.repairs) if self.log else 0,
                    damaged_records_kept_aside=len(self.log.corruptions) if self.log else 0,
                    cache_entries=len(self.cache.items), cache_hits=self.cache.hits, cache_misses=self.cache.misses)


def _same_as(meta: TableMetadata) -> dict:
    """The fields a live table must share with the served tables."""
    return dict(kind=meta.kind, adapter_hash=meta.adapter_hash, num_tokens=meta.num_tokens, width=meta.width,
                backbone=meta.backbone, feature_layer=meta.feature_layer, quantization=meta.quantization)


def merge_rows(store_rows, inline: Dict[int, EncodedImages], n: int, store_positions: Sequence[int],
               codec_scales: bool) -> EncodedImages:
    """Request-ordered rows from the store's gather (at `store_positions`) and the inline images (by position)."""
    sample = next(iter(inline.values())) if inline else store_rows
    blob = np.empty((n, sample.blob.shape[1]), np.uint8)
    scales = np.empty((n, sample.scales.shape[1]), "<f2") if codec_scales else None
    emb = np.empty((n, sample.embeddings.shape[1]), np.float32)
    if len(store_positions):
        pos = np.asarray(store_positions)
        blob[pos], emb[pos] = store_rows.blob, store_rows.embeddings
        if scales is not None:
            scales[pos] = store_rows.scales
    for i, r in inline.items():
        blob[i], emb[i] = r.blob[0], r.embeddings[0]
        if scales is not None:
            scales[i] = r.scales[0]
    return EncodedImages(blob, scales, emb)


def live_rows(live_dir: Optional[str]) -> Optional[pa.Table]:
    """Every committed live row (for components that load them once, e.g. at start); None when there are none."""
    if not live_dir:
        return None
    return LiveLog(live_dir).poll()


def embeddings_of_tables(items: Sequence) -> Tuple[List[str], np.ndarray]:
    """image_id and image_embedding columns of live rows: Arrow tables (what `LiveLog.read` returns) or table paths."""
    if not items:
        return [], np.zeros((0, 0), np.float32)
    tables = [t if isinstance(t, pa.Table) else read_token_tables([t], columns=["image_id", "image_embedding"])[0]
              for t in items]
    table = pa.concat_tables([t.select(["image_id", "image_embedding"]) for t in tables])
    return table.column("image_id").to_pylist(), vector_matrix(table.column("image_embedding"))
