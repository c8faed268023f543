"""Which shard owns an image id: a stable hash of the id, the same in every process, restart and machine.

The serving fan-out (`edje.serving.shards`) and the token store both split a corpus with it, so it sits below them.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import pyarrow as pa


def shard_of(image_id: str, num_shards: int) -> int:
    """The shard that owns an image id: stable across processes, restarts and machines (not Python's hash)."""
    if num_shards <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(image_id.encode("utf-8"), digest_size=8).digest(), "little") % num_shards


def shard_mask(image_ids: pa.Array, shard: int, num_shards: int) -> Optional[pa.Array]:
    """Boolean mask of the ids a shard owns (None when there is one shard: every row)."""
    if num_shards <= 1:
        return None
    return pa.array([shard_of(x, num_shards) == shard for x in image_ids.to_pylist()], pa.bool_())


def filter_shard(table: pa.Table, shard: int, num_shards: int) -> pa.Table:
    """The rows of a token table that a shard owns."""
    mask = shard_mask(table.column("image_id").combine_chunks(), shard, num_shards)
    return table if mask is None else table.filter(mask)
