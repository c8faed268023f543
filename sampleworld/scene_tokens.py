"""Perfect image tokens from a shapes-world scene graph: a DIAGNOSTIC token source, never a backbone.

Each cell of a grid over the image carries E[colour] + E[shape] + E[size] of the object whose
box covers the cell's centre (a background vector otherwise), plus a position vector. The
binding of attributes to objects and positions is therefore exact and linearly readable; a
joint encoder that cannot learn binding from these tokens will not learn it from a backbone's.
The config, the backbone name tables record and the grid are both kinds' (sampleworld/scene_token_grid.py).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .scene import COLOURS, SHAPES, SIZES, Scene
from .scene_token_grid import SCENE_TOKENS_BACKBONE, GridTokenizer, SceneTokenConfig, grid_position, unit_vectors

__all__ = ["SCENE_TOKENS_BACKBONE", "SceneTokenConfig", "SceneTokenizer"]


class SceneTokenizer(GridTokenizer):
    """Shapes scene -> [grid*grid, width] float32 tokens (row-major cells, row 0 at the top)."""

    def __init__(self, cfg: SceneTokenConfig = SceneTokenConfig()):
        rng = np.random.default_rng(cfg.seed)
        # Unit-norm random vectors: nearly orthogonal in 128 dims, so each attribute stays readable
        # from the sum (what a perfect backbone would give). Drawn in this order, so the tokens keep their bits.
        self.colour = dict(zip(COLOURS, unit_vectors(rng, len(COLOURS), cfg.width)))
        self.shape = dict(zip(SHAPES, unit_vectors(rng, len(SHAPES), cfg.width)))
        self.size = dict(zip(SIZES, unit_vectors(rng, len(SIZES), cfg.width)))
        background = unit_vectors(rng, 1, cfg.width)[0]
        rows, cols = unit_vectors(rng, cfg.grid, cfg.width), unit_vectors(rng, cfg.grid, cfg.width)
        super().__init__(cfg, background, grid_position(rows, cols))

    def paint(self, scene: Scene) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """Each object's attributes over the cells its square covers."""
        for o in scene.objects:
            yield self.cover(*o.center, o.radius), self.colour[o.colour] + self.shape[o.shape] + self.size[o.size]
