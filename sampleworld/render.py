"""Rasterise a shapes-world scene to RGB pixels.

Shapes are rasterised with numpy as exact half-plane / distance tests on a 4x supersampled
grid (anti-aliased by counting covered sub-pixels), using only exactly rounded float ops and
integer noise, so the pixel array is identical on every machine; Pillow is used only to
encode (sampleworld/pixels.py). JPEG bytes are then identical for a given Pillow/libjpeg build.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .pixels import pixel_noise
from .scene import COLOURS, Scene, SceneObject

SUPERSAMPLE = 4

# Shape geometry in unit coordinates (half-extent 1, y down). Literals rather than computed
# with cos/sin so that no libm difference can move a vertex.
_TRIANGLE = ((0.0, -0.95), (1.0, 0.8), (-1.0, 0.8))
_STAR_OUTER = ((0.0, -1.0), (0.951057, -0.309017), (0.587785, 0.809017), (-0.587785, 0.809017), (-0.951057, -0.309017))
_STAR_INNER = ((0.264503, -0.364058), (0.427975, 0.139058), (0.0, 0.45), (-0.427975, 0.139058), (-0.264503, -0.364058))
# A five-pointed star is the union of five convex kites: centre, inner[k-1], outer[k], inner[k].
_STAR_KITES = tuple(((0.0, 0.0), _STAR_INNER[k - 1], _STAR_OUTER[k], _STAR_INNER[k]) for k in range(5))
_SQUARE_HALF = 0.86
_CROSS_ARM = 0.32
_CROSS_LEN = 0.95


def _convex(u: np.ndarray, v: np.ndarray, poly: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Inside test for a convex polygon given in either winding order."""
    area2 = sum(poly[i][0] * poly[i - 1][1] - poly[i - 1][0] * poly[i][1] for i in range(len(poly)))
    sign = 1.0 if area2 > 0 else -1.0
    inside = np.ones(np.broadcast_shapes(u.shape, v.shape), dtype=bool)
    for i in range(len(poly)):
        (ax, ay), (bx, by) = poly[i - 1], poly[i]
        cross = (bx - ax) * (v - ay) - (by - ay) * (u - ax)
        inside &= sign * cross <= 0
    return inside


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean coverage of ``shape`` at unit coordinates (u, v) (broadcast together)."""
    if shape == "circle":
        return u * u + v * v <= 1.0
    if shape == "square":
        return (np.abs(u) <= _SQUARE_HALF) & (np.abs(v) <= _SQUARE_HALF)
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= 1.0
    if shape == "triangle":
        return _convex(u, v, _TRIANGLE)
    if shape == "cross":
        au, av = np.abs(u), np.abs(v)
        return ((au <= _CROSS_ARM) & (av <= _CROSS_LEN)) | ((au <= _CROSS_LEN) & (av <= _CROSS_ARM))
    if shape == "star":
        out = _convex(u, v, _STAR_KITES[0])
        for kite in _STAR_KITES[1:]:
            out |= _convex(u, v, kite)
        return out
    raise ValueError(f"unknown shape {shape!r}")


# Object centres are snapped to 1/8 pixel before rasterising, so the coverage patch of a
# (shape, radius, sub-pixel offset) can be computed once and reused; the snap moves an
# object by at most 1/16 pixel.
SNAP = 8


@functools.lru_cache(maxsize=4096)
def _coverage(shape: str, r: float, fx: int, fy: int) -> tuple[np.ndarray, int]:
    """Coverage fractions (float64, square patch) of a shape of radius ``r`` px whose centre
    lies ``fx/SNAP, fy/SNAP`` px past the patch's pixel ``pad``; returns (patch, pad)."""
    pad = math.ceil(r) + 1
    n = 2 * pad + 1
    ss = SUPERSAMPLE
    grid = (np.arange(n * ss, dtype=np.float64) + 0.5) / ss
    u = ((grid - (pad + fx / SNAP)) / r)[None, :]
    v = ((grid - (pad + fy / SNAP)) / r)[:, None]
    mask = shape_mask(shape, u, v)
    # Integer sub-pixel counts -> exact coverage fractions.
    cov = mask.reshape(n, ss, n, ss).sum(axis=(1, 3), dtype=np.int64) / float(ss * ss)
    cov.setflags(write=False)
    return cov, pad


def _draw(img: np.ndarray, obj: SceneObject) -> None:
    """Blend one anti-aliased object into ``img`` (int16, H x W x 3) in place, rounding to
    whole levels; only the object's bounding box is touched."""
    size = img.shape[0]
    qx = round(obj.center[0] * size * SNAP)
    qy = round(obj.center[1] * size * SNAP)
    ix, fx = divmod(qx, SNAP)
    iy, fy = divmod(qy, SNAP)
    cov, pad = _coverage(obj.shape, obj.radius * size, fx, fy)
    n = cov.shape[0]
    x0, y0 = ix - pad, iy - pad
    # Clip to the frame (objects are placed inside it, but stay safe for any config).
    cx0, cy0 = max(0, -x0), max(0, -y0)
    cx1, cy1 = min(n, size - x0), min(n, size - y0)
    c = cov[cy0:cy1, cx0:cx1, None]
    ys, xs = slice(y0 + cy0, y0 + cy1), slice(x0 + cx0, x0 + cx1)
    colour = np.asarray(COLOURS[obj.colour], dtype=np.float64)
    patch = img[ys, xs].astype(np.float64)
    img[ys, xs] = np.floor(patch * (1.0 - c) + colour * c + 0.5).astype(np.int16)


def render(scene: Scene, size: int, seed: int) -> np.ndarray:
    """RGB uint8 array (size x size x 3) of the scene; ``seed`` drives only the pixel noise."""
    img = np.empty((size, size, 3), dtype=np.int16)
    img[:] = np.asarray(scene.background, dtype=np.int16)
    for obj in scene.objects:
        _draw(img, obj)
    img += pixel_noise(seed, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)
