"""Pixel noise and JPEG encoding, the same for both kinds so that their images read alike."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

JPEG_QUALITY = 90
NOISE_AMPLITUDE = 3  # integer noise in [-3, 3] per channel: "lightly noisy"
# Byte -> noise level in [-3, 3]; 256 = 36*7 + 4, so the bias is negligible.
NOISE_LUT = (np.arange(256, dtype=np.int16) % (2 * NOISE_AMPLITUDE + 1)) - NOISE_AMPLITUDE


def pixel_noise(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Integer noise (int16) of ``shape``, from ``seed`` alone."""
    rng = np.random.default_rng(seed)
    return NOISE_LUT[np.frombuffer(rng.bytes(int(np.prod(shape))), dtype=np.uint8)].reshape(shape)


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """Baseline JPEG, fixed quality and 4:2:0 subsampling, no EXIF or other metadata."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(
        buf, format="JPEG", quality=quality, subsampling="4:2:0", optimize=False, progressive=False
    )
    return buf.getvalue()
