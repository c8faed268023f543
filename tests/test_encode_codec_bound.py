"""Quantized round trips stay within half a quantization step of the *input's* own range.

The bound is computed here from the input tokens (absmax of each token or group / qmax / 2),
never from the scales the codec stores, so a codec that picks too small or too large a scale,
rounds the wrong way or clips fails. The only slack is the one the format documents: scales are
fp16 rounded up, so a step may be one fp16 ulp (2^-10 relative) wider than absmax / qmax,
plus float32 rounding of the decoded product.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edje.schemas.codecs import TokenCodec
from edje.schemas.config import CodecConfig

QMAX = {"int8": 127, "int4": 7}


def _tokens(seed: int) -> np.ndarray:
    """[4, 64, 384] with heavy-tailed values, an outlier per token, a zero token and tiny tokens."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, size=(4, 64, 384)).astype(np.float32)
    x[:, :, 7] *= 40.0  # one outlier column: per-token scales must follow it, groups must not
    x[0, 3] = 0.0
    x[1, 5] *= 1e-4
    return x


def _bound(x: np.ndarray, quant: str, group: int) -> np.ndarray:
    g = np.abs(x).reshape(x.shape[0], x.shape[1], -1, group).max(-1, keepdims=True)
    # + 2^-20 of absmax: float32 rounding of q * scale when decoding (about 1e-7 relative);
    # + qmax x 2^-25: a tiny token's fp16 scale is subnormal, stored to within half of 2^-24 absolute.
    return np.broadcast_to(g / QMAX[quant] / 2 * (1 + 2 ** -10) + g * 2 ** -20 + QMAX[quant] * 2.0 ** -25,
                           x.shape[:2] + (x.shape[2] // group, group))


@pytest.mark.parametrize("quant,group_size", [("int8", None), ("int4", None), ("int4", 128), ("int4", 32)])
@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_round_trip_error_within_half_a_step_of_the_inputs_absmax(quant, group_size, path):
    codec = TokenCodec(CodecConfig(quant, group_size), 64, 384)
    group = group_size or 384
    x = _tokens(seed=len(quant) + group)
    if path == "numpy":
        y = codec.decode(*codec.encode(x))
    else:
        blob, scales = codec.encode_torch(torch.from_numpy(x))
        y = codec.decode_torch(blob, scales).numpy()
    err = np.abs(y - x).reshape(x.shape[0], 64, -1, group)
    bound = _bound(x, quant, group)
    assert (err <= bound).all(), f"worst excess {float((err - bound).max()):.3g}"
    assert (y[0, 3] == 0).all()  # a zero token stays exactly zero
    # and the bound is tight: some value really is about half a step off (a codec that stored floats would
    # pass the bound trivially; this one must be quantizing at the stated step)
    assert (err / np.maximum(bound, 1e-30)).max() > 0.9
