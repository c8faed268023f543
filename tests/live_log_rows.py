"""Random token rows for the live log's tests: what an add commits, in the default codec's shape (16 tokens x 128,
int8). Its own module so that the stress test's children (tests/live_log_stress.py) import pyarrow and the log alone,
as a replica's log path does, and not the model stack the test module needs for its other tests."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from edje.schemas.token_table import TableMetadata, build_table_from_blobs

META = TableMetadata(kind="compressed", backbone="edje-tiny-convvit", pretrained=None, feature_layer="last",
                     num_tokens=16, width=128, quantization="int8", embed_dim=128, adapter_hash="abc")
EXPECTED = dict(kind="compressed", adapter_hash="abc", num_tokens=16, width=128, quantization="int8")


def random_rows(ids, seed: int = 0) -> pa.Table:
    """A token table of random rows for `ids` (what an add commits)."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    return build_table_from_blobs(META, list(ids), rng.integers(0, 256, (n, META.codec.blob_bytes), dtype=np.uint8),
                                  rng.random((n, META.codec.num_scales)).astype("<f2"),
                                  rng.standard_normal((n, META.embed_dim)).astype(np.float32),
                                  urls=[f"http://x/{i}" for i in ids])
