"""Perfect image tokens from an open-world scene graph: a DIAGNOSTIC token source, never a backbone.

Each cell of a grid over the image carries E[noun] + E[size] + E[count] + E[facing] of the thing whose sprites cover
the cell's centre (a background vector otherwise), plus a position vector; the config, the backbone name tables
record and the grid are both kinds' (sampleworld/scene_token_grid.py). Nouns of one neighbour group (dog, wolf) get
independent vectors like any two nouns: perfect tokens tell every noun apart, whatever a backbone confuses.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

from .open_glyphs import GlyphTable, load_glyphs
from .open_scene import COUNTS, FACINGS, GROUP_OFFSETS, KIND, SIZES, OpenScene
from .scene_token_grid import GridTokenizer, SceneTokenConfig, grid_position


def _noun_vector(seed: int, noun: str, basis: np.ndarray) -> np.ndarray:
    """A random unit vector in the span of ``basis``'s rows, drawn from the seed and the noun alone, so a noun keeps its
    vector when the glyph table gains or reorders rows."""
    digest = int.from_bytes(hashlib.sha256(noun.encode("utf-8")).digest()[:8], "little")
    v = np.random.default_rng([seed, digest]).standard_normal(len(basis)).astype(np.float32) @ basis
    return v / np.linalg.norm(v)


class OpenSceneTokenizer(GridTokenizer):
    """Open scene -> [grid*grid, width] float32 tokens (row-major cells, row 0 at the top)."""

    world_tag = KIND

    def __init__(self, cfg: SceneTokenConfig = SceneTokenConfig(), table: GlyphTable | None = None):
        table = table or load_glyphs()
        g = cfg.grid
        # Hundreds of nouns outnumber the token width, so their vectors cannot all be orthogonal; plain random vectors
        # overlap the other parts enough that the nearest noun is now and then another one. So one random orthonormal
        # basis is split: positions, background, size, count and facing each get their own rows, the nouns the rest,
        # and every part reads back exactly whatever else the cell carries.
        parts = {"row": g, "col": g, "background": 1, "size": len(SIZES), "count": len(COUNTS), "facing": len(FACINGS)}
        fixed = sum(parts.values())
        if cfg.width <= fixed:
            raise ValueError(f"open scene tokens need more than {fixed} dims at grid {g}, got width {cfg.width}")
        rng = np.random.default_rng(cfg.seed)
        basis = np.linalg.qr(rng.standard_normal((cfg.width, cfg.width)))[0].T.astype(np.float32)
        split = dict(zip(parts, np.split(basis[:fixed], np.cumsum(list(parts.values()))[:-1])))
        self.noun = {n: _noun_vector(cfg.seed, n, basis[fixed:]) for n in table.nouns}
        self.size = dict(zip(SIZES, split["size"]))
        self.count = dict(zip(COUNTS, split["count"]))
        # Glyphs without a direction add no facing vector: a "none" vector would read as a third facing.
        self.facing = {**dict(zip(FACINGS, split["facing"])), "": np.zeros(cfg.width, np.float32)}
        super().__init__(cfg, split["background"][0], grid_position(split["row"], split["col"]))

    def paint(self, scene: OpenScene) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """Each thing's attributes over the cells its copies' sprites cover (squares placed as open_render.py does)."""
        for o in scene.objects:
            r = o.radius
            cells = np.logical_or.reduce([self.cover(o.center[0] + dx * r, o.center[1] + dy * r, r)
                                          for dx, dy in GROUP_OFFSETS[o.count]])
            yield cells, self.noun[o.noun] + self.size[o.size] + self.count[o.count] + self.facing[o.facing]
