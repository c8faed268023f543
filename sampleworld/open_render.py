"""Rasterise an open scene: a gradient-and-noise backdrop, then each thing's sprites composited over it.

Only exactly rounded numpy arithmetic is used (no cos/sin: the gradient directions are literals), and sprites
are scaled by Pillow from the committed sheet, so the pixels are identical for a given Pillow build, as the
JPEG bytes already are.
"""
from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from .open_glyphs import GlyphTable, load_glyphs
from .open_scene import GROUP_OFFSETS, Backdrop, OpenScene
from .open_sprites import sprite
from .pixels import pixel_noise

# Unit gradient directions (x right, y down), eight around the compass.
_D = 0.7071067811865476
DIRECTIONS: tuple[tuple[float, float], ...] = ((1.0, 0.0), (_D, _D), (0.0, 1.0), (-_D, _D), (-1.0, 0.0), (-_D, -_D),
                                              (0.0, -1.0), (_D, -_D))
NOISE_GRID = 5  # smooth colour noise: a 5x5 lattice of offsets, bilinearly interpolated
NOISE_SCALE = 18.0


def _lerp_weights(size: int, cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pixel: lower lattice index, upper index and the weight of the upper one."""
    g = (np.arange(size, dtype=np.float64) + 0.5) / size * (cells - 1)
    i0 = np.minimum(np.floor(g).astype(np.int64), cells - 2)
    return i0, i0 + 1, g - i0


@functools.lru_cache(maxsize=8)
def backdrop_pixels(backdrop: Backdrop, size: int) -> np.ndarray:
    """Float64 [size, size, 3] backdrop (cached: a family's members share it)."""
    t = (np.arange(size, dtype=np.float64) + 0.5) / size - 0.5
    dx, dy = DIRECTIONS[backdrop.direction]
    ramp = (t[None, :] * dx + t[:, None] * dy) / (2 * _D) + 0.5  # in [0, 1] for every direction
    c0, c1 = (np.asarray(c, dtype=np.float64) for c in backdrop.colours)
    img = c0 * (1.0 - ramp[..., None]) + c1 * ramp[..., None]
    lattice = np.random.default_rng(backdrop.noise_seed).standard_normal((NOISE_GRID, NOISE_GRID, 3)) * NOISE_SCALE
    y0, y1, wy = _lerp_weights(size, NOISE_GRID)
    x0, x1, wx = _lerp_weights(size, NOISE_GRID)
    rows = lattice[y0] * (1.0 - wy)[:, None, None] + lattice[y1] * wy[:, None, None]
    noise = rows[:, x0] * (1.0 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    out = img + noise
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=8192)
def scaled_sprite(index: int, px: int, mirrored: bool) -> tuple[np.ndarray, np.ndarray]:
    """(premultiplied RGB, alpha) float32 arrays of sprite ``index`` scaled to ``px`` square, mirrored if asked."""
    im = Image.fromarray(np.ascontiguousarray(sprite(index)), "RGBA")
    if mirrored:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    a = np.asarray(im.convert("RGBa").resize((px, px), Image.Resampling.LANCZOS), dtype=np.float32)
    rgb, alpha = a[..., :3], a[..., 3:] / np.float32(255.0)
    rgb.setflags(write=False)
    alpha.setflags(write=False)
    return rgb, alpha


def _paste(img: np.ndarray, rgb: np.ndarray, alpha: np.ndarray, x0: int, y0: int) -> None:
    """Composite a premultiplied sprite into ``img`` at (x0, y0), clipped to the frame."""
    size, px = img.shape[0], rgb.shape[0]
    cx0, cy0 = max(0, -x0), max(0, -y0)
    cx1, cy1 = min(px, size - x0), min(px, size - y0)
    if cx0 >= cx1 or cy0 >= cy1:
        return
    ys, xs = slice(y0 + cy0, y0 + cy1), slice(x0 + cx0, x0 + cx1)
    a = alpha[cy0:cy1, cx0:cx1]
    img[ys, xs] = img[ys, xs] * (1.0 - a) + rgb[cy0:cy1, cx0:cx1]


def render_open(scene: OpenScene, size: int, seed: int, table: GlyphTable | None = None) -> np.ndarray:
    """RGB uint8 array (size x size x 3) of the scene; ``seed`` drives only the pixel noise."""
    table = table or load_glyphs()
    img = backdrop_pixels(scene.backdrop, size).copy()
    for o in scene.objects:
        g = table.by_noun[o.noun]
        mirrored = bool(g.facing) and o.facing != g.facing
        r = o.radius
        px = max(2, round(2 * r * size))
        for dx, dy in GROUP_OFFSETS[o.count]:
            cx, cy = (o.center[0] + dx * r) * size, (o.center[1] + dy * r) * size
            rgb, alpha = scaled_sprite(g.index, px, mirrored)
            _paste(img, rgb, alpha, int(np.floor(cx - px / 2 + 0.5)), int(np.floor(cy - px / 2 + 0.5)))
    return np.clip(np.floor(img + 0.5) + pixel_noise(seed, img.shape), 0, 255).astype(np.uint8)
