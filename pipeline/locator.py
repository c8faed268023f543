"""Where an input's image bytes lie: the four columns a planned shard of a file input carries per row.

The input sources (webdataset, image folder, Parquet with bytes) write them at planning; the encode
stage's reader (pipeline.read_images) fetches the bytes they name. Nothing is copied in between.

    kind "file":  the whole file `source`
    kind "range": `length` bytes at `position` of `source` (a tar member)
    kind "row":   row `position` of the Parquet file `source` (its image column)
"""
from __future__ import annotations

from typing import Dict, Sequence

import pyarrow as pa

FILE = "file"
RANGE = "range"
ROW = "row"
LOCATOR_COLUMNS = ("source", "position", "length", "kind")


def locator_arrays(sources: Sequence[str], positions: Sequence[int], lengths: Sequence[int],
                   kinds: Sequence[str]) -> Dict[str, pa.Array]:
    """The locator columns as Arrow arrays (one type for every source, so planned batches share a schema)."""
    return {"source": pa.array(sources, pa.string()), "position": pa.array(positions, pa.int64()),
            "length": pa.array(lengths, pa.int64()), "kind": pa.array(kinds, pa.string())}
