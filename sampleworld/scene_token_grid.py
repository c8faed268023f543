"""What both kinds' perfect scene tokens share: their config, the backbone name their tables record, and the grid.

Perfect tokens are a DIAGNOSTIC token source, never a backbone: each cell of a grid over the image carries the
vectors of what covers the cell's centre (a background vector otherwise) plus a position vector. Each kind paints its
own scenes (sampleworld/scene_tokens.py, sampleworld/open_scene_tokens.py); its `WorldKind.scene_tokenizer` builds
the painter, so a caller never asks which kind a world is.

Tables built from these tokens name the backbone ``SCENE_TOKENS_BACKBONE`` (with the kind, seed and grid in the
pretrained tag), so a checkpoint trained on them is refused by every job that reads real backbone tables, and the
other way round (`edje.training.model_init.check_backbone`, `edje.serving.app.check_tables`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

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
        """What tables of shapes-world tokens record as the 'pretrained' field: the token source's identity."""
        return self.tag()

    def tag(self, world: str = "") -> str:
        """The 'pretrained' field of a kind's tables; the shapes world names no kind, as its tables always have."""
        return "/".join(p for p in ("scene-graph", world, f"grid{self.grid}", f"w{self.width}", f"seed{self.seed}") if p)


def unit_vectors(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """[n, width] float32 random unit vectors (nearly orthogonal in 128 dims)."""
    v = rng.standard_normal((n, width)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def grid_position(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """[grid*grid, width] factorised positions: a row vector plus a column vector, each at half weight."""
    return (0.5 * (rows[:, None, :] + cols[None, :, :])).reshape(len(rows) * len(cols), rows.shape[1])


class GridTokenizer:
    """Scene -> [grid*grid, width] float32 tokens (row-major cells, row 0 at the top): the background vector in every
    cell, what a kind's `paint` puts over it, and the cell's position vector."""

    world_tag: ClassVar[str] = ""  # the kind in the pretrained tag ("" for the shapes world)

    def __init__(self, cfg: SceneTokenConfig, background: np.ndarray, position: np.ndarray):
        self.cfg = cfg
        self.background = background
        self.position = position
        centres = (np.arange(cfg.grid) + 0.5) / cfg.grid
        self._cy, self._cx = np.meshgrid(centres, centres, indexing="ij")

    @property
    def pretrained_tag(self) -> str:
        """What this kind's tables record as the 'pretrained' field."""
        return self.cfg.tag(self.world_tag)

    def paint(self, scene: Any) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """(cells [grid, grid] bool, content vector) per object, in drawing order."""
        raise NotImplementedError

    def cover(self, cx: float, cy: float, half: float) -> np.ndarray:
        """[grid, grid] bool: the cells whose centre lies in the square of half-side ``half`` around (cx, cy)."""
        return (np.abs(self._cx - cx) <= half) & (np.abs(self._cy - cy) <= half)

    def tokens(self, scene: Any) -> np.ndarray:
        """The perfect tokens of one scene."""
        g = self.cfg.grid
        content = np.tile(self.background, (g, g, 1))
        # Later objects are drawn over earlier ones, as the renderers do.
        for cells, vector in self.paint(scene):
            content[cells] = vector
        return (content.reshape(g * g, -1) + self.position).astype(np.float32)

    def batch(self, scenes: Sequence[Any]) -> np.ndarray:
        """[len(scenes), grid*grid, width] tokens."""
        return np.stack([self.tokens(s) for s in scenes]) if scenes else np.zeros((0, self.cfg.num_tokens, self.cfg.width), np.float32)
