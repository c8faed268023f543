"""Spatial relations of the sample worlds: the four predicates, derived from logical grid cells only.

Both kinds place objects on a logical 3x3 grid (col, row; row 0 is the top), so a relation is exact and never
depends on the jittered centres.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

RELATIONS: tuple[str, ...] = ("left_of", "right_of", "above", "below")
INVERSE: dict[str, str] = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}
HORIZONTAL = ("left_of", "right_of")

# Offset (dcol, drow) of the subject's cell relative to the reference object's cell.
CELL_OFFSET: dict[str, tuple[int, int]] = {"left_of": (-1, 0), "right_of": (1, 0), "above": (0, -1), "below": (0, 1)}


@dataclass(frozen=True)
class Relation:
    """``objects[subject]`` is ``predicate`` ``objects[object]``."""

    subject: int
    predicate: str
    object: int

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"subject": self.subject, "predicate": self.predicate, "object": self.object}


def relation_between(a: tuple[int, int], b: tuple[int, int]) -> str:
    """Relation of cell ``a`` to cell ``b`` (they share a row or a column)."""
    if a[1] == b[1] and a[0] != b[0]:
        return "left_of" if a[0] < b[0] else "right_of"
    if a[0] == b[0] and a[1] != b[1]:
        return "above" if a[1] < b[1] else "below"
    raise ValueError(f"cells {a} and {b} are not aligned")


def layout_cells(rng: np.random.Generator, n_objects: int) -> list[tuple[int, int]]:
    """Logical cells: one object in the middle; two on a random axis; three around an anchor in the middle."""
    if n_objects == 1:
        return [(1, 1)]
    if n_objects == 2:
        dc, dr = CELL_OFFSET[RELATIONS[int(rng.integers(4))]]
        return [(1 + dc, 1 + dr), (1 - dc, 1 - dr)]
    if n_objects == 3:
        r1 = RELATIONS[int(rng.integers(4))]
        r2 = [r for r in RELATIONS if r != r1][int(rng.integers(3))]  # the same side twice would be ambiguous
        (c1, d1), (c2, d2) = CELL_OFFSET[r1], CELL_OFFSET[r2]
        return [(1 + c1, 1 + d1), (1, 1), (1 + c2, 1 + d2)]
    raise ValueError(f"a related layout holds one to three objects, not {n_objects}")
