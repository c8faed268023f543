"""Image bytes -> RGB uint8 at the model's input size, with every odd input normalised or rejected: the one
decode rule of the project. The encode job, live images, the Python API, evaluation tables and the backbone's
training all read pixels through it, so the same file gives the same pixels wherever it enters.

Normalised and kept: EXIF orientation (applied), CMYK, grayscale, palette, 16-bit and alpha images (alpha
composited on white, where a plain RGB conversion would show whatever colour the transparent pixels hold).
Resized as open_clip's preprocess does for its resize mode. Rejected with a reason: bodies that are not images,
truncated files, decompression bombs (more pixels than `max_pixels`, checked from the header before any pixel is
decoded) and other decode errors.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

# Why an image was refused: the encode job counts dropped rows under these keys.
NOT_AN_IMAGE = "not_an_image"
TRUNCATED_IMAGE = "truncated_image"
DECOMPRESSION_BOMB = "decompression_bomb"  # more pixels than max_pixels
DECODE_ERROR = "decode_error"
IMAGE_REASONS = (NOT_AN_IMAGE, TRUNCATED_IMAGE, DECOMPRESSION_BOMB, DECODE_ERROR)

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own bomb threshold (~0.25 GiB of RGB)
JPEG_QUALITY = 95


class ImageRejected(ValueError):
    """An image that cannot be used; `reason` is one of IMAGE_REASONS."""

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
    except Exception as e:
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
    except Exception:
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
        except Exception:
            pass
    try:
        out = fit(to_rgb(im), size, resize_mode)
        return np.asarray(out, dtype=np.uint8)
    except ImageRejected:
        raise
    except Exception as e:
        raise ImageRejected(DECODE_ERROR, f"{type(e).__name__}: {e}") from None


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 [H, W, 3] -> JPEG bytes (what the webdataset shards store)."""
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def load_image_files(paths: Sequence[Path], size: Optional[int] = None,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Image files -> uint8 [N, H, W, 3] by the same rule as `decode_image`; their own size unless `size` is given."""
    out = []
    for p in paths:
        if not Path(p).exists():
            raise FileNotFoundError(f"image {p} named by the annotations does not exist")
        data = Path(p).read_bytes()
        if size is None:
            out.append(np.asarray(to_rgb(open_image(data, max_pixels)), dtype=np.uint8))
        else:
            out.append(decode_image(data, size, max_pixels=max_pixels))
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise ValueError(f"images differ in size {sorted(shapes)[:3]}; pass size= to resize them")
    return np.stack(out)
