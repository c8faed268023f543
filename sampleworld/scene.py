"""Scene model of the shapes world: objects, their logical layout, and random sampling.

A scene holds two or three objects (one in the curriculum's simplest worlds), each with a shape,
a colour and a size, placed on a
logical 3x3 grid of cells (col, row; row 0 is the top). Spatial relations are derived from
the cells only, so they are exact; the continuous ``center`` adds jitter for realism but
never changes a relation. Coordinates are fractions of the image side (x right, y down) and
are rounded to 4 decimals so that world.json and the rendered pixels agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from .relations import HORIZONTAL, INVERSE, Relation, layout_cells, relation_between
from .twins import difference

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "diamond")

# Saturated, well separated colours; none is grey, so the grey backgrounds never clash.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 25, 25),
    "green": (30, 150, 40),
    "blue": (30, 70, 220),
    "yellow": (245, 220, 20),
    "purple": (135, 40, 175),
    "orange": (250, 130, 0),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}

# Half-extent of an object as a fraction of the image side. Large is ~1.9x small in
# diameter (36 px vs 19 px at 128, 18 px vs 10 px at 64), so size survives downscaling.
SIZES: dict[str, float] = {"small": 0.075, "large": 0.14}
MAX_RADIUS = max(SIZES.values())

# Background: mid grey with a faint tint, far from white (245) and black (20) and from
# every saturated object colour.
BACKGROUND_GREY = (100, 156)
BACKGROUND_TINT = 10

# Distance between neighbouring cell centres, per number of objects. Three in a row must
# fit two large objects side by side with a gap; two objects get more room.
_SPREAD = {1: 0.0, 2: 0.25, 3: 0.32}
_JITTER_ALONG = {1: 0.1, 2: 0.02, 3: 0.01}
_JITTER_ACROSS = {1: 0.1, 2: 0.06, 3: 0.01}
_MARGIN = 0.01
# Two objects on one side of the image centre: their centres this far apart along the relation's axis
# (two large objects side by side with a small gap), and both short of the centre line by this much.
_SAME_SIDE_SPREAD = 0.30
_SAME_SIDE_GAP = 0.01


@dataclass(frozen=True)
class SceneObject:
    """One object: attributes plus logical cell and jittered centre."""

    shape: str
    colour: str
    size: str
    cell: tuple[int, int]
    center: tuple[float, float]

    @property
    def radius(self) -> float:
        """Half-extent as a fraction of the image side."""
        return SIZES[self.size]

    def key(self) -> tuple[str, str, str, int, int]:
        """Binding key: attributes and cell, without the jitter."""
        return (self.shape, self.colour, self.size, self.cell[0], self.cell[1])

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "shape": self.shape,
            "colour": self.colour,
            "size": self.size,
            "cell": list(self.cell),
            "center": list(self.center),
            "radius": self.radius,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> "SceneObject":
        """Inverse of to_json."""
        return SceneObject(d["shape"], d["colour"], d["size"], tuple(d["cell"]), tuple(d["center"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Scene:
    """Objects plus a background colour; relations are derived from the cells."""

    objects: tuple[SceneObject, ...]
    background: tuple[int, int, int]
    kind: ClassVar[str] = "shapes"  # the registry's name of this world

    @property
    def relations(self) -> tuple[Relation, ...]:
        """One object: none. Two objects: 0 rel 1. Three objects: 0 rel 1 and 2 rel 1 (object 1 is the anchor)."""
        objs = self.objects
        if len(objs) == 1:
            return ()
        if len(objs) == 2:
            return (Relation(0, relation_between(objs[0].cell, objs[1].cell), 1),)
        return (
            Relation(0, relation_between(objs[0].cell, objs[1].cell), 1),
            Relation(2, relation_between(objs[2].cell, objs[1].cell), 1),
        )

    @property
    def is_row(self) -> bool:
        """True when all objects lie on one line (two objects, or three in a row/column)."""
        rels = self.relations
        return len(rels) <= 1 or rels[0].predicate == INVERSE[rels[1].predicate]

    def signature(self) -> tuple[tuple[str, str, str, int, int], ...]:
        """Order-free binding signature: two scenes with equal signatures mean the same thing."""
        return tuple(sorted(o.key() for o in self.objects))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (objects, relations, background)."""
        return {
            "background": list(self.background),
            "objects": [o.to_json() for o in self.objects],
            "relations": [r.to_json() for r in self.relations],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Scene":
        """Inverse of to_json (relations are re-derived)."""
        return Scene(tuple(SceneObject.from_json(o) for o in d["objects"]), tuple(d["background"]))  # type: ignore[arg-type]


def _r4(x: float) -> float:
    return round(float(x), 4)


def sample_background(rng: np.random.Generator) -> tuple[int, int, int]:
    """A faintly tinted mid-grey."""
    grey = int(rng.integers(BACKGROUND_GREY[0], BACKGROUND_GREY[1]))
    tint = rng.integers(-BACKGROUND_TINT, BACKGROUND_TINT + 1, size=3)
    return tuple(int(grey + t) for t in tint)  # type: ignore[return-value]


def _layout_centers(rng: np.random.Generator, cells: list[tuple[int, int]], same_side: bool = False) -> list[tuple[float, float]]:
    """Jittered centres for the cells, then a random global shift that keeps every object
    inside the frame even if it were large (so a size-swap twin still fits). same_side (two objects):
    both centres on one side of the image centre along their axis, so the subject's side alone does
    not decide the relation."""
    n = len(cells)
    if same_side:
        return _same_side_centers(rng, cells)
    spread, along, across = _SPREAD[n], _JITTER_ALONG[n], _JITTER_ACROSS[n]
    horizontal_axis = len({c[1] for c in cells}) == 1  # all in one row
    vertical_axis = len({c[0] for c in cells}) == 1
    pts = []
    for col, row in cells:
        jx = rng.uniform(-along, along) if not vertical_axis else rng.uniform(-across, across)
        jy = rng.uniform(-along, along) if not horizontal_axis else rng.uniform(-across, across)
        pts.append([0.5 + (col - 1) * spread + jx, 0.5 + (row - 1) * spread + jy])
    arr = np.asarray(pts)
    lo = _MARGIN + MAX_RADIUS - arr.min(axis=0)
    hi = 1.0 - _MARGIN - MAX_RADIUS - arr.max(axis=0)
    shift = np.where(lo <= hi, lo + rng.random(2) * (hi - lo), (lo + hi) / 2)
    arr = arr + shift
    return [(_r4(x), _r4(y)) for x, y in arr]


def _same_side_centers(rng: np.random.Generator, cells: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """Two aligned cells placed _SAME_SIDE_SPREAD apart, both on a random side of 0.5 along their axis."""
    if len(cells) != 2:
        raise ValueError("same-side layouts place two objects")
    axis = 0 if cells[0][1] == cells[1][1] else 1  # 0: one row (left/right), 1: one column (above/below)
    lo = _MARGIN + MAX_RADIUS
    first = lo + rng.random() * (0.5 - _SAME_SIDE_GAP - _SAME_SIDE_SPREAD - lo)  # the lower centre
    if rng.random() < 0.5:  # the far side: mirrored
        first = 1.0 - first - _SAME_SIDE_SPREAD
    across = 0.5 + (rng.random() - 0.5) * 2 * (0.5 - lo - _JITTER_ACROSS[2])
    out = []
    for cell in cells:
        along = first + _SAME_SIDE_SPREAD * (cell[axis] > min(c[axis] for c in cells))
        jitter = rng.uniform(-_JITTER_ACROSS[2], _JITTER_ACROSS[2])
        point = (along, across + jitter) if axis == 0 else (across + jitter, along)
        out.append((_r4(point[0]), _r4(point[1])))
    return out


def sample_scene(rng: np.random.Generator, n_objects: int, background: tuple[int, int, int],
                 same_side: bool = False) -> Scene:
    """A random scene with distinct shapes and distinct colours (so bindings are unambiguous); same_side
    (two objects): both on one side of the image centre."""
    if n_objects not in (1, 2, 3):
        raise ValueError("scenes hold one, two or three objects")
    if same_side and n_objects != 2:
        raise ValueError("same-side scenes hold two objects")
    shapes = rng.permutation(len(SHAPES))[:n_objects]
    colour_names = list(COLOURS)
    colours = rng.permutation(len(colour_names))[:n_objects]
    sizes = rng.random(n_objects) < 0.5
    cells = layout_cells(rng, n_objects)
    centers = _layout_centers(rng, cells, same_side)
    objs = tuple(
        SceneObject(
            shape=SHAPES[int(shapes[i])],
            colour=colour_names[int(colours[i])],
            size="large" if sizes[i] else "small",
            cell=cells[i],
            center=centers[i],
        )
        for i in range(n_objects)
    )
    return Scene(objs, background)


# --- twin operations -------------------------------------------------------------------

# The shapes world's twin kinds, in the order families draw them.
TWIN_KINDS: tuple[str, ...] = ("colour", "shape", "size", "relation")
ATTRIBUTES: tuple[str, ...] = ("colour", "shape", "size")


@dataclass(frozen=True)
class Swap:
    """One twin operation: swap an attribute between two objects, or mirror along an axis."""

    kind: str  # colour | shape | size | relation
    objects: tuple[int, int] | None = None  # attribute swaps
    axis: str | None = None  # relation swaps: horizontal (left<->right) | vertical (above<->below)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d: dict[str, Any] = {"kind": self.kind}
        if self.objects is not None:
            d["objects"] = list(self.objects)
        if self.axis is not None:
            d["axis"] = self.axis
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Swap":
        """Inverse of to_json."""
        objs = d.get("objects")
        return Swap(d["kind"], tuple(objs) if objs is not None else None, d.get("axis"))  # type: ignore[arg-type]


def possible_swaps(scene: Scene, kind: str) -> list[Swap]:
    """All swaps of ``kind`` that change the scene's meaning."""
    objs = scene.objects
    if kind == "relation":
        axes = sorted({"horizontal" if r.predicate in HORIZONTAL else "vertical" for r in scene.relations})
        return [Swap("relation", axis=a) for a in axes]
    out = []
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            if getattr(objs[i], kind) != getattr(objs[j], kind):
                out.append(Swap(kind, objects=(i, j)))
    return out


def apply_swap(scene: Scene, swap: Swap) -> Scene:
    """The twin scene: attribute exchanged between two objects, or positions mirrored."""
    objs = list(scene.objects)
    if swap.kind == "relation":
        # Mirroring flips exactly the relations along that axis and keeps the others.
        new = []
        for o in objs:
            if swap.axis == "horizontal":
                new.append(replace(o, cell=(2 - o.cell[0], o.cell[1]), center=(_r4(1.0 - o.center[0]), o.center[1])))
            else:
                new.append(replace(o, cell=(o.cell[0], 2 - o.cell[1]), center=(o.center[0], _r4(1.0 - o.center[1]))))
        return Scene(tuple(new), scene.background)
    assert swap.objects is not None
    i, j = swap.objects
    a, b = objs[i], objs[j]
    objs[i] = replace(a, **{swap.kind: getattr(b, swap.kind)})
    objs[j] = replace(b, **{swap.kind: getattr(a, swap.kind)})
    return Scene(tuple(objs), scene.background)


def shapes_difference(a: Scene, b: Scene) -> str:
    """What differs between two scenes of one family: "colour", "shape", "size", "relation" or "two swaps"."""
    return difference(a.objects, b.objects, ATTRIBUTES)
