"""Token store: compressed token tables loaded once into contiguous arrays, gathered by image id.

The store keeps the *encoded* blobs (uint8, plus fp16 scales for int8/int4) so that the corpus
stays at its stored size in memory; each reranker replica holds one (serving.reranker_core) and decodes
what it gathers with the table's codec on its own device (`edje.model.scoring.decode_blobs`). Tables that do not
match the served checkpoint are refused at start-up with the field named (TableMismatchError).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa

from edje.model.shards import filter_shard
from edje.schemas.token_table import TableMetadata, TableMismatchError, blob_matrix, read_metadata, read_token_tables, vector_matrix

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
    """All rows of some token tables in contiguous numpy arrays, with an id -> row dict."""

    def __init__(self, meta: TableMetadata, image_ids: List[str], blob: np.ndarray, scales: Optional[np.ndarray],
                 embeddings: np.ndarray, urls: List[Optional[str]], paths: Sequence[str] = ()):
        self.meta, self.paths = meta, list(paths)
        self.image_ids, self.blob, self.scales, self.embeddings, self.urls = image_ids, blob, scales, embeddings, urls
        self.row: Dict[str, int] = {image_id: i for i, image_id in enumerate(image_ids)}
        self.codec = meta.codec

    @classmethod
    def load(cls, paths: Sequence[str], checkpoint_meta: Optional[dict] = None, shard: int = 0, num_shards: int = 1,
             **expected) -> "TokenStore":
        """Read tables (any fsspec paths) once; refuse any whose metadata differs from the checkpoint's. With
        num_shards > 1 only the rows whose id hashes to `shard` are kept (serving/shards.py), one table at a time."""
        if not paths:
            raise FileNotFoundError("no token tables given")
        want = {**(expected_from_checkpoint(checkpoint_meta) if checkpoint_meta else {}), **expected}
        for p in paths:  # metadata first: refuse before reading any token bytes
            read_metadata(p).check(p, **want)
        if num_shards > 1:
            kept = []
            for p in paths:  # one table in memory at a time, then only this shard's rows of it
                whole, meta = read_token_tables([p], **want)
                kept.append(filter_shard(whole, shard, num_shards))
            table = pa.concat_tables(kept)
        else:
            table, meta = read_token_tables(paths, **want)
        n_before = table.num_rows
        ids = table.column("image_id").combine_chunks()
        keep = _first_of_each(ids)
        if keep is not None:
            table = table.take(pa.array(keep))
            log.warning("token store: %d duplicate image ids across %s kept once", n_before - table.num_rows, list(paths))
        codec = meta.codec
        blob = np.array(blob_matrix(table.column("tokens"), codec.blob_bytes))  # own copy: the table can go
        scales = None
        if codec.num_scales:
            scales = np.array(blob_matrix(table.column("token_scales"), 2 * codec.num_scales).view("<f2"))
        embeddings = np.ascontiguousarray(vector_matrix(table.column("image_embedding")))
        urls = table.column("url").to_pylist() if "url" in table.column_names else [None] * table.num_rows
        return cls(meta, table.column("image_id").to_pylist(), blob, scales, embeddings, urls, paths)

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the arrays (blobs, scales, embeddings); the id dict and strings come on top."""
        return int(self.blob.nbytes + (self.scales.nbytes if self.scales is not None else 0) + self.embeddings.nbytes)

    def rows(self, image_ids: Sequence[str]) -> tuple[np.ndarray, List[str]]:
        """Row numbers of the ids and the ids that are unknown (in request order, unique)."""
        get = self.row.get
        rows = [get(i, -1) for i in image_ids]
        missing = list(dict.fromkeys(i for i, r in zip(image_ids, rows) if r < 0))
        return np.asarray(rows, dtype=np.int64), missing

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

        The arrays keep spare rows and grow by a quarter when full, so adding is amortised O(rows added)
        rather than a copy of the corpus per image; `len(self)` rows are valid."""
        ids = table.column("image_id").to_pylist()
        dup = [i for i in ids if i in self.row]
        if dup or len(set(ids)) < len(ids):
            raise ValueError(f"image ids already in the store: {dup or ids}")
        codec, n, k = self.codec, len(self.image_ids), len(ids)
        new = dict(blob=np.asarray(blob_matrix(table.column("tokens"), codec.blob_bytes)),
                   embeddings=vector_matrix(table.column("image_embedding")))
        if codec.num_scales:
            new["scales"] = np.asarray(blob_matrix(table.column("token_scales"), 2 * codec.num_scales).view("<f2"))
        for name, rows in new.items():
            setattr(self, name, _put_rows(getattr(self, name), n, rows))
        self.urls.extend(table.column("url").to_pylist() if "url" in table.column_names else [None] * k)
        self.image_ids.extend(ids)
        self.row.update({image_id: n + j for j, image_id in enumerate(ids)})  # last: rows are complete when visible

    def info(self) -> dict:
        """Paths, table metadata, image count and memory, for GET /v1/info."""
        return dict(paths=self.paths, metadata=dataclasses.asdict(self.meta), images=len(self),
                    memory_bytes=self.memory_bytes)


def _put_rows(array: np.ndarray, n: int, rows: np.ndarray) -> np.ndarray:
    """`array` with `rows` written at n.. (a larger copy with spare rows when it is full)."""
    need = n + len(rows)
    if need > len(array):
        grown = np.empty((max(need, n + n // 4 + 64),) + array.shape[1:], array.dtype)
        grown[:n] = array[:n]
        array = grown
    array[n:need] = rows
    return array


def _first_of_each(sorted_ids: pa.Array) -> Optional[np.ndarray]:
    """Row numbers keeping the first of each run of equal ids in a sorted column; None when all are unique."""
    values = sorted_ids.to_numpy(zero_copy_only=False)
    if len(values) < 2:
        return None
    first = np.concatenate([[True], values[1:] != values[:-1]])
    return None if first.all() else np.flatnonzero(first)


__all__ = ["TokenStore", "TokenBlobs", "UnknownImageIds", "TableMismatchError",
           "expected_from_checkpoint"]
