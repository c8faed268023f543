"""Token store: compressed token tables as row-aligned column files, memory-mapped, gathered by image id.

The store keeps the *encoded* blobs (uint8, plus fp16 scales for int8/int4) so that the corpus stays at its stored
size; each reranker replica opens one (serving.reranker_core) and decodes what it gathers with the table's codec on
its own device (`edje.model.scoring.decode_blobs`). Local tables are served from memory-mapped files built once per
node beside them (storage/table_cache.py): start-up reads the ids' file header, not the blobs, and every replica on the
node shares the page cache's one copy. Tables that do not match the served checkpoint are refused at start-up with
the field named (TableMismatchError), before any cache is built or opened.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import pyarrow as pa

from edje.schemas.token_table import TableMetadata, TableMismatchError, blob_matrix, read_metadata, vector_matrix
from edje.storage.table_cache import (
    TOKEN_COLUMNS,
    CacheConfig,
    ImageIds,
    MappedTables,
    RowMatrix,
    is_local,
    open_tables,
    read_columns,
)

log = logging.getLogger("ray.serve")


@dataclass
class TokenBlobs:
    """Encoded token matrices of some image ids, in request order, or the ids that are unknown."""

    blob: Optional[np.ndarray]  # uint8 [B, blob_bytes]
    scales: Optional[np.ndarray]  # fp16 [B, num_scales] or None (fp16/fp32 tables)
    missing: List[str]
    urls: Optional[List[Optional[str]]] = None
    embeddings: Optional[np.ndarray] = None  # pooled image embeddings [B, e], when asked for


class UnknownImageIds(KeyError):
    """Image ids that are not in the served corpus."""

    def __init__(self, ids: Sequence[str]):
        self.ids = list(ids)
        super().__init__(f"unknown image ids: {self.ids}")

    def __str__(self) -> str:
        return self.args[0]


def expected_from_checkpoint(checkpoint_meta: dict) -> dict:
    """The table fields a checkpoint's compressed tables must carry (kind, adapter hash, shape, backbone)."""
    cfg = checkpoint_meta["config"]
    return dict(
        kind="compressed",
        adapter_hash=checkpoint_meta["adapter_hash"],
        num_tokens=cfg["encoder"]["num_image_tokens"],
        width=cfg["adapter"]["output_dim"],
        backbone=cfg["backbone"]["name"],
        feature_layer=cfg["backbone"]["feature_layer"],
    )


class TokenStore:
    """The rows of some token tables, by image id: blobs, scales, embeddings and urls, memory-mapped or in RAM.

    Row r of every column belongs to `image_ids[r]` (sorted, unique); rows added later (live images) follow them,
    in RAM. Local tables are served from memory-mapped files (storage/table_cache.py): start-up reads no token bytes,
    and the replicas of a node share one copy in the page cache. Remote tables are read into RAM."""

    def __init__(self, meta: TableMetadata, tables: MappedTables, paths: Sequence[str] = ()):
        self.meta, self.paths, self.codec = meta, list(paths), meta.codec
        self.folder = tables.folder  # the cache folder the columns are mapped from; None when read into RAM
        self.image_ids = ImageIds(tables.ids)
        self.row = self.image_ids  # id -> row lookups (`in`, `.get`) without a dict of every id
        self.blob = RowMatrix(tables.columns["tokens"])
        self.scales = RowMatrix(tables.columns["token_scales"]) if self.codec.num_scales else None
        self.embeddings = RowMatrix(tables.columns["image_embedding"])
        self.urls = tables.string_column("url")

    @classmethod
    def load(cls, paths: Sequence[str], checkpoint_meta: Optional[dict] = None, shard: int = 0, num_shards: int = 1,
             mapped: Optional[bool] = None, cache: CacheConfig = CacheConfig(), **expected) -> "TokenStore":
        """Open tables (any fsspec paths); refuse any whose metadata differs from the checkpoint's or the first
        table's. With num_shards > 1 only the rows whose id hashes to `shard` are kept (serving/shards.py).
        mapped=None: memory-mapped when every table is a local file, else read into RAM (one table at a time)."""
        if not paths:
            raise FileNotFoundError("no token tables given")
        want = {**(expected_from_checkpoint(checkpoint_meta) if checkpoint_meta else {}), **expected}
        meta = None
        for p in paths:  # metadata first: refuse before reading any token bytes
            m = read_metadata(p)
            m.check(p, **want)
            if meta is None:
                meta = m
            else:
                m.check(p, **dataclasses.asdict(meta))  # every table as the first: one codec, one model
        columns = [c for c in TOKEN_COLUMNS if c != "token_scales" or meta.codec.num_scales]
        if mapped is None:
            mapped = is_local(paths)
        if mapped:
            tables = open_tables(paths, meta, columns, shard, num_shards, cache)
        else:
            tables = read_columns(paths, meta, columns, shard, num_shards, cache.batch_rows)
        dropped = tables.info.get("duplicates", 0)
        if dropped:
            log.warning("token store: %d duplicate image ids across %s kept once", dropped, list(paths))
        return cls(meta, tables, paths)

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the rows' blobs, scales and embeddings (in the page cache, shared, when memory-mapped); the ids
        and urls come on top."""
        return int(self.blob.nbytes + (self.scales.nbytes if self.scales is not None else 0) + self.embeddings.nbytes)

    def rows(self, image_ids: Sequence[str]) -> tuple[np.ndarray, List[str]]:
        """Row numbers of the ids and the ids that are unknown (in request order, unique)."""
        rows = self.image_ids.rows(list(image_ids))
        missing = list(dict.fromkeys(i for i, r in zip(image_ids, rows) if r < 0))
        return rows, missing

    def gather_blobs(self, image_ids: Sequence[str], with_urls: bool = False) -> TokenBlobs:
        """Encoded tokens of the ids (one vectorised take), or the unknown ids."""
        rows, missing = self.rows(image_ids)
        if missing:
            return TokenBlobs(None, None, missing)
        scales = self.scales[rows] if self.scales is not None else None
        urls = [self.urls[r] for r in rows] if with_urls else None
        return TokenBlobs(self.blob[rows], scales, [], urls)

    def gather(self, image_ids: Sequence[str]) -> np.ndarray:
        """Decoded tokens float32 [B, n, d] of the ids; raises UnknownImageIds."""
        got = self.gather_blobs(image_ids)
        if got.missing:
            raise UnknownImageIds(got.missing)
        return self.codec.decode(got.blob, got.scales)

    def embeddings_of(self, image_ids: Sequence[str]) -> np.ndarray:
        """Pooled image embeddings [B, e] of the ids; raises UnknownImageIds."""
        rows, missing = self.rows(image_ids)
        if missing:
            raise UnknownImageIds(missing)
        return self.embeddings[rows]

    def add_table(self, table: pa.Table) -> None:
        """Append the rows of a token table with this store's metadata (live images); ids must be new.

        Added rows live in RAM after the (mapped) corpus and grow by a quarter when full, so adding is amortised
        O(rows added) rather than a copy of the corpus per image; `len(self)` rows are valid."""
        ids = table.column("image_id").to_pylist()
        dup = [i for i in ids if i in self.row]
        if dup or len(set(ids)) < len(ids):
            raise ValueError(f"image ids already in the store: {dup or ids}")
        codec = self.codec
        self.blob.append(np.asarray(blob_matrix(table.column("tokens"), codec.blob_bytes)))
        self.embeddings.append(vector_matrix(table.column("image_embedding")))
        if codec.num_scales:
            self.scales.append(np.asarray(blob_matrix(table.column("token_scales"), 2 * codec.num_scales).view("<f2")))
        self.urls.extend(table.column("url").to_pylist() if "url" in table.column_names else [None] * len(ids))
        self.image_ids.extend(ids)  # last: rows are complete when their ids become visible

    def info(self) -> dict:
        """Paths, table metadata, image count and memory, for GET /v1/info."""
        return dict(paths=self.paths, metadata=dataclasses.asdict(self.meta), images=len(self),
                    memory_bytes=self.memory_bytes, memory_mapped=self.folder is not None, cache_folder=self.folder)


__all__ = ["TokenStore", "TokenBlobs", "UnknownImageIds", "TableMismatchError",
           "expected_from_checkpoint"]
