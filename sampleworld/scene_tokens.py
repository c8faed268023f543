"""Perfect image tokens from the scene graph: a DIAGNOSTIC token source, never a backbone.

Each cell of a grid over the image carries E[colour] + E[shape] + E[size] of the object whose
box covers the cell's centre (a background vector otherwise), plus a position vector. The
binding of attributes to objects and positions is therefore exact and linearly readable; a
joint encoder that cannot learn binding from these tokens will not learn it from a backbone's.

Tables built from these tokens name the backbone ``SCENE_TOKENS_BACKBONE`` (with the seed and
grid in the pretrained tag), so a checkpoint trained on them is refused by every job that reads
real backbone tables, and the other way round (`edje.training.model_init.check_backbone`,
`edje.serving.app.check_tables`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .scene import COLOURS, SHAPES, SIZES, Scene

SCENE_TOKENS_BACKBONE = "sampleworld-scene-tokens"


@dataclass(frozen=True)
class SceneTokenConfig:
    """Grid side, token width and the seed of the fixed random attribute and position vectors."""

    grid: int = 8
    width: int = 128
    seed: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens per image (grid x grid)."""
        return self.grid * self.grid

    @property
    def pretrained_tag(self) -> str:
        """What tables record as the 'pretrained' field: the token source's identity."""
        return f"scene-graph/grid{self.grid}/w{self.width}/seed{self.seed}"


class SceneTokenizer:
    """Scene -> [grid*grid, width] float32 tokens (row-major cells, row 0 at the top)."""

    def __init__(self, cfg: SceneTokenConfig = SceneTokenConfig()):
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        # Unit-norm random vectors: nearly orthogonal in 128 dims, so each attribute stays readable
        # from the sum (what a perfect backbone would give).
        def unit(n: int) -> np.ndarray:
            v = rng.standard_normal((n, cfg.width)).astype(np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True)

        self.colour = dict(zip(COLOURS, unit(len(COLOURS))))
        self.shape = dict(zip(SHAPES, unit(len(SHAPES))))
        self.size = dict(zip(SIZES, unit(len(SIZES))))
        self.background = unit(1)[0]
        # Factorised position: a row vector plus a column vector, each at half weight.
        rows, cols = unit(cfg.grid), unit(cfg.grid)
        self.position = (0.5 * (rows[:, None, :] + cols[None, :, :])).reshape(cfg.num_tokens, cfg.width)
        centres = (np.arange(cfg.grid) + 0.5) / cfg.grid
        self._cy, self._cx = np.meshgrid(centres, centres, indexing="ij")

    def tokens(self, scene: Scene) -> np.ndarray:
        """The perfect tokens of one scene."""
        g = self.cfg.grid
        content = np.tile(self.background, (g, g, 1))
        # Later objects are drawn over earlier ones, as the renderer does.
        for o in scene.objects:
            cx, cy = o.center
            cover = (np.abs(self._cx - cx) <= o.radius) & (np.abs(self._cy - cy) <= o.radius)
            content[cover] = self.colour[o.colour] + self.shape[o.shape] + self.size[o.size]
        return (content.reshape(g * g, -1) + self.position).astype(np.float32)

    def batch(self, scenes: Sequence[Scene]) -> np.ndarray:
        """[len(scenes), grid*grid, width] tokens."""
        return np.stack([self.tokens(s) for s in scenes]) if scenes else np.zeros((0, self.cfg.num_tokens, self.cfg.width), np.float32)
