"""Image bytes -> RGB uint8 at the model's input size, with every odd input normalised or rejected.

Normalised and kept: EXIF orientation (applied), CMYK, grayscale, palette, 16-bit and alpha
images (alpha composited on white). Rejected with a reason (pipeline.reasons): bodies that are
not images, truncated files, decompression bombs (more pixels than `max_pixels`, checked from
the header before any pixel is decoded) and other decode errors.

The same code runs twice: inside img2dataset's download worker (as `PilResizer`, so the
webdataset shards hold images already at model size) and in the Ray Data decode stage
(`decode_batch`), which turns the stored bytes into the uint8 array the encoder eats.
"""
from __future__ import annotations

import io
import warnings
from typing import Dict

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from pipeline.reasons import DECODE_ERROR, DECOMPRESSION_BOMB, NOT_AN_IMAGE, TRUNCATED_IMAGE

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own bomb threshold (~0.25 GiB of RGB)
JPEG_QUALITY = 95
OK = "ok"


class ImageRejected(ValueError):
    """An image that cannot be used; `reason` is one of pipeline.reasons.IMAGE_REASONS."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open image bytes lazily (header only) and refuse bombs before any pixel is decoded."""
    if not data:
        raise ImageRejected(NOT_AN_IMAGE, "empty body")
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file must fail, not load half grey
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # we apply our own limit below
            im = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as e:
        raise ImageRejected(NOT_AN_IMAGE, str(e)) from None
    except Image.DecompressionBombError as e:
        raise ImageRejected(DECOMPRESSION_BOMB, str(e)) from None
    except Exception as e:  # noqa: BLE001 - any parser failure on the header is a decode error
        raise ImageRejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None
    w, h = im.size
    if w * h > max_pixels:
        raise ImageRejected(DECOMPRESSION_BOMB, f"{w}x{h} = {w * h} pixels > limit {max_pixels}")
    if w < 1 or h < 1:
        raise ImageRejected(DECODE_ERROR, f"image has size {w}x{h}")
    return im


def to_rgb(im: Image.Image) -> Image.Image:
    """Decode fully, apply EXIF orientation and convert any mode to 8-bit RGB (alpha on white)."""
    try:
        im.load()
    except Image.DecompressionBombError as e:
        raise ImageRejected(DECOMPRESSION_BOMB, str(e)) from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        msg = f"{type(e).__name__}: {e}"
        if "truncated" in msg.lower() or isinstance(e, EOFError):
            raise ImageRejected(TRUNCATED_IMAGE, msg) from None
        if "too large" in msg.lower():  # PNG text/ICC chunks that inflate beyond PIL's limits
            raise ImageRejected(DECOMPRESSION_BOMB, msg) from None
        raise ImageRejected(DECODE_ERROR, msg) from None
    try:
        im = ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001 - a corrupt EXIF block must not cost the image; keep stored orientation
        pass
    mode = im.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16/32-bit grayscale: PIL's convert("L") clips at 255, so scale the range down ourselves.
        arr = np.asarray(im)
        peak = 65535.0 if mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        im = Image.fromarray(np.clip(arr.astype(np.float32) * (255.0 / peak) + 0.5, 0, 255).astype(np.uint8), "L")
    elif mode == "F":
        arr = np.asarray(im, dtype=np.float32)
        peak = 1.0 if arr.max(initial=0) <= 1.0 else 255.0
        im = Image.fromarray(np.clip(arr * (255.0 / peak) + 0.5, 0, 255).astype(np.uint8), "L")
    has_alpha = im.mode in ("RGBA", "LA", "La", "RGBa", "PA") or (im.mode == "P" and "transparency" in im.info)
    if has_alpha:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")


def fit(im: Image.Image, size: int, resize_mode: str = "shortest") -> Image.Image:
    """Resize an RGB image to size x size the way open_clip's preprocess does for `resize_mode`."""
    w, h = im.size
    if (w, h) == (size, size):
        return im
    if resize_mode == "squash":
        return im.resize((size, size), Image.BICUBIC)
    if resize_mode == "longest":  # keep ratio, longest side = size, pad centred (open_clip fills with 0)
        scale = size / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        canvas = Image.new("RGB", (size, size), (0, 0, 0))
        canvas.paste(im.resize((nw, nh), Image.BICUBIC), ((size - nw) // 2, (size - nh) // 2))
        return canvas
    # "shortest": shortest side = size, centre crop; one resize over the centred square box.
    side = min(w, h)
    left, top = (w - side) / 2, (h - side) / 2
    return im.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))


def decode_image(data: bytes, size: int, resize_mode: str = "shortest",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Image bytes -> uint8 [size, size, 3]; raises ImageRejected with a reason."""
    im = open_image(data, max_pixels)
    if im.format == "JPEG":
        # Let libjpeg decode at a reduced DCT scale that still covers the target size:
        # big photos decode several times faster and in a fraction of the memory.
        try:
            im.draft(None, (size, size))
        except Exception:  # noqa: BLE001 - draft is an optimisation only
            pass
    try:
        out = fit(to_rgb(im), size, resize_mode)
        return np.asarray(out, dtype=np.uint8)
    except ImageRejected:
        raise
    except Exception as e:  # noqa: BLE001 - whatever else PIL raises while decoding pixels
        raise ImageRejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 [H, W, 3] -> JPEG bytes (what the webdataset shards store)."""
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


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

    def __call__(self, img_stream, blurring_bbox_list=None):  # noqa: ARG002 - img2dataset's signature
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

