"""The encode actor's precision policy: the arithmetic is chosen by `compute_dtype`, not by the device.

fp32 tokens are the backbone's own fp32 output (so a GPU table equals a CPU one within the storage
codec's bound); bf16 runs the same autocast on whatever device the actor has, stays within bf16's
rounding of the fp32 tokens, and is recorded in the table's metadata.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edje.model.backbone import VisionBackbone
from edje.pipeline.encode import EncodeBatch, EncoderSpec, describe_model
from edje.schemas.config import BackboneConfig

BACKBONE = BackboneConfig("edje-tiny-clip")


def _batch(size: int, n: int = 4) -> dict:
    rng = np.random.default_rng(0)
    return {"status": np.array(["ok"] * n, dtype=object), "image": rng.integers(0, 256, (n, size, size, 3), np.uint8),
            "caption": np.array([f"caption {i}" for i in range(n)], dtype=object),
            "shard": np.zeros(n, np.int32), "row": np.arange(n, dtype=np.int32),
            "image_id": np.array([str(i) for i in range(n)], dtype=object),
            "url": np.array([""] * n, dtype=object), "detail": np.array([""] * n, dtype=object)}


def _encode(spec: EncoderSpec, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    torch.manual_seed(0)  # the same random backbone for every spec
    actor = EncodeBatch(spec)
    out = actor(batch)
    n, d = actor.encoder.backbone.token_shape
    tokens = np.stack([np.frombuffer(b, "<f4").reshape(n, d) for b in out.column("tokens").to_pylist()])
    return tokens, np.asarray(out.column("image_embedding").to_pylist(), np.float32)


def test_compute_dtype_decides_the_arithmetic_and_is_recorded():
    fp32 = EncoderSpec(BACKBONE, None, "fp32", None, torch_threads=1)
    bf16 = EncoderSpec(BACKBONE, None, "fp32", None, torch_threads=1, compute_dtype="bf16")
    size = describe_model(fp32).image_size
    batch = _batch(size)
    tokens, emb = _encode(fp32, batch)
    torch.manual_seed(0)
    ref_tokens, ref_emb = VisionBackbone.create(BACKBONE).encode(torch.from_numpy(batch["image"]))
    assert np.array_equal(tokens, ref_tokens.numpy()) and np.array_equal(emb, ref_emb.numpy())

    low, low_emb = _encode(bf16, batch)
    scale = np.abs(tokens).max(axis=-1, keepdims=True)
    err = np.abs(low - tokens) / scale
    assert 0 < err.max() < 2 ** -4  # bf16 (8-bit mantissa) through a few layers: rounded, not broken
    assert np.abs(low_emb - emb).max() < 2 ** -4

    assert describe_model(fp32).meta.compute_dtype == "fp32"
    assert describe_model(bf16).meta.compute_dtype == "bf16"


def test_unknown_compute_dtype_is_refused():
    with pytest.raises(ValueError, match="compute_dtype"):
        EncoderSpec(BACKBONE, None, "fp16", None, compute_dtype="fp16")
