"""The encode pipeline's two decode stages over the project's one decode rule (`edje.model.image_decode`).

The same code runs twice: inside img2dataset's download worker (as `PilResizer`, so the
webdataset shards hold images already at model size) and in the Ray Data decode stage
(`decode_batch`), which turns the stored bytes into the uint8 array the encoder eats.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from edje.model.image_decode import (
    DEFAULT_MAX_PIXELS,
    JPEG_QUALITY,
    ImageRejected,
    decode_image,
    encode_jpeg,
    open_image,
)

OK = "ok"


class PilResizer:
    """img2dataset-compatible resizer: normalise with `decode_image`, store JPEG at model size.

    img2dataset's own resizer decodes with OpenCV's IMREAD_UNCHANGED, which ignores EXIF
    orientation, composites 16-bit alpha with 8-bit arithmetic and decodes a bomb in full
    before checking its area; this one keeps img2dataset's worker, writer and stats but
    normalises like the rest of this module. Errors come back as '<reason>: <detail>'.
    """

    def __init__(self, size: int, resize_mode: str = "shortest", max_pixels: int = DEFAULT_MAX_PIXELS,
                 quality: int = JPEG_QUALITY):
        self.size, self.resize_mode, self.max_pixels, self.quality = size, resize_mode, max_pixels, quality

    def __call__(self, img_stream, blurring_bbox_list=None):
        """(stream) -> (jpeg bytes, width, height, original width, original height, error or None)."""
        data = img_stream.read()
        try:
            ow, oh = open_image(data, self.max_pixels).size
            pixels = decode_image(data, self.size, self.resize_mode, self.max_pixels)
        except ImageRejected as e:
            return None, None, None, None, None, str(e)
        return encode_jpeg(pixels, self.quality), self.size, self.size, ow, oh, None


def decode_batch(batch: Dict[str, np.ndarray], size: int, resize_mode: str = "shortest",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> Dict[str, np.ndarray]:
    """Ray Data stage: 'jpg' bytes -> 'image' uint8 [B, size, size, 3]; failures update status/detail."""
    n = len(batch["status"])
    images = np.zeros((n, size, size, 3), dtype=np.uint8)
    status = np.array(batch["status"], dtype=object)
    detail = np.array(batch["detail"], dtype=object)
    for i, data in enumerate(batch["jpg"]):
        if status[i] != OK:
            continue
        try:
            images[i] = decode_image(data, size, resize_mode, max_pixels)
        except ImageRejected as e:
            status[i], detail[i] = e.reason, e.detail
    out = {k: v for k, v in batch.items() if k != "jpg"}
    out.update(image=images, status=status, detail=detail)
    return out

