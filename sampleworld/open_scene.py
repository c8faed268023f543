"""Scene model of the open world: things (a noun drawn once or as a small group), their cells and places.

A scene holds one to four things. Each has a noun (a glyph of the table), a size, a count (1-3 copies drawn
as a cluster) and, for glyphs that face a way, a facing. Things sit on the shapes world's logical 3x3 grid
(one in the middle; two on one axis; three in a row or around an anchor; four in the corners), so relations
are exact and derived from cells only (`edje.sampleworld.relations.relation_between`); the continuous centres
add jitter. A family shares its slots (cells, centres, scales) and backdrop; twins change what stands in them.

For code written against the shapes world's ``Scene`` (evaluation's twin bucketing, training's world
records), an object also answers ``shape`` (the noun and count: what is drawn), ``colour`` (the facing)
and ``key()``; `open_difference` names what differs in the open world's own terms.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from .relations import INVERSE, Relation, relation_between
from .relations import layout_cells as related_cells
from .twins import difference

KIND = "open"
# Half-extent of one copy as a fraction of the image side (the shapes world's 0.075 / 0.14, so size reads
# the same at 64 px); each slot scales it by a jitter in SCALE_JITTER.
SIZES: dict[str, float] = {"small": 0.08, "large": 0.14}
SCALE_JITTER = (0.92, 1.08)
COUNTS: tuple[int, ...] = (1, 2, 3)
COUNT_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three"}
FACINGS: tuple[str, ...] = ("left", "right")
TWIN_KINDS: tuple[str, ...] = ("size", "facing", "count", "relation", "noun")

# Copy centres of a group, in units of the copy's half-extent; drawn in this order (the front ones last).
GROUP_OFFSETS: dict[int, tuple[tuple[float, float], ...]] = {
    1: ((0.0, 0.0),),
    2: ((-0.78, 0.1), (0.78, -0.1)),
    3: ((0.0, -0.48), (-0.8, 0.42), (0.8, 0.42)),
}

# Corner cells of four things: 0 top left, 1 top right, 2 bottom left, 3 bottom right.
_GRID4 = ((0, 0), (2, 0), (0, 2), (2, 2))


def _r4(x: float) -> float:
    return round(float(x), 4)


@dataclass(frozen=True)
class Thing:
    """What stands in a slot: noun, size, count and facing ("" when the glyph has no direction)."""

    noun: str
    size: str
    count: int
    facing: str

    def values(self) -> tuple[str, str, str, str]:
        """Attribute values as words: noun, size, count word, facing."""
        return (self.noun, self.size, COUNT_WORDS[self.count], self.facing)


@dataclass(frozen=True)
class OpenObject:
    """A thing placed: its cell, centre and the slot's scale jitter."""

    noun: str
    size: str
    count: int
    facing: str
    cell: tuple[int, int]
    center: tuple[float, float]
    scale: float = 1.0

    @property
    def thing(self) -> Thing:
        """The attributes without the place."""
        return Thing(self.noun, self.size, self.count, self.facing)

    @property
    def radius(self) -> float:
        """Half-extent of one copy as a fraction of the image side."""
        return SIZES[self.size] * self.scale

    @property
    def shape(self) -> str:
        """Shapes-world view: what is drawn (noun, with the count when more than one)."""
        return self.noun if self.count == 1 else f"{COUNT_WORDS[self.count]} {self.noun}"

    @property
    def colour(self) -> str:
        """Shapes-world view: the facing ("-" for glyphs without a direction)."""
        return self.facing or "-"

    def key(self) -> tuple[str, str, str, int, int]:
        """Binding key: attributes and cell, without the jitter (shapes-world layout: shape, colour, size, cell)."""
        return (self.shape, self.colour, self.size, self.cell[0], self.cell[1])

    def extent(self) -> tuple[float, float]:
        """Half-width and half-height of the drawn group (fractions of the image side)."""
        offs = GROUP_OFFSETS[self.count]
        r = self.radius
        return ((max(abs(dx) for dx, _ in offs) + 1.0) * r, (max(abs(dy) for _, dy in offs) + 1.0) * r)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; ``shape``/``colour`` repeat noun+count/facing for readers of shapes worlds."""
        return {"noun": self.noun, "size": self.size, "count": self.count, "facing": self.facing,
                "shape": self.shape, "colour": self.colour, "cell": list(self.cell), "center": list(self.center),
                "scale": self.scale, "radius": _r4(self.radius)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "OpenObject":
        """Inverse of to_json."""
        return OpenObject(d["noun"], d["size"], int(d["count"]), d["facing"], tuple(d["cell"]), tuple(d["center"]),  # type: ignore[arg-type]
                          float(d["scale"]))


@dataclass(frozen=True)
class Backdrop:
    """A family's background: a gradient between two colours along one of eight directions, plus smooth colour noise."""

    colours: tuple[tuple[int, int, int], tuple[int, int, int]]
    direction: int  # index into open_render.DIRECTIONS
    noise_seed: int

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"colours": [list(c) for c in self.colours], "direction": self.direction, "noise_seed": self.noise_seed}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Backdrop":
        """Inverse of to_json."""
        c0, c1 = (tuple(c) for c in d["colours"])
        return Backdrop((c0, c1), int(d["direction"]), int(d["noise_seed"]))  # type: ignore[arg-type]


# Which slot pairs carry a relation, per number of things (subject, object).
_RELATED: dict[int, tuple[tuple[int, int], ...]] = {1: (), 2: ((0, 1),), 3: ((0, 1), (2, 1)), 4: ((0, 1), (2, 3), (0, 2), (1, 3))}


@dataclass(frozen=True)
class OpenScene:
    """Things in cells on a backdrop; relations are derived from the cells."""

    objects: tuple[OpenObject, ...]
    backdrop: Backdrop
    kind: str = KIND

    @property
    def background(self) -> tuple[int, int, int]:
        """Shapes-world view: the backdrop's first colour."""
        return self.backdrop.colours[0]

    @property
    def relations(self) -> tuple[Relation, ...]:
        """Two things: 0 rel 1. Three: 0 rel 1 and 2 rel 1 (1 is the anchor). Four: both rows, then both columns."""
        return tuple(Relation(s, relation_between(self.objects[s].cell, self.objects[o].cell), o)
                     for s, o in _RELATED[len(self.objects)])

    @property
    def is_row(self) -> bool:
        """True when three things lie on one line (the anchor is between the others)."""
        rels = self.relations
        return len(self.objects) == 3 and rels[0].predicate == INVERSE[rels[1].predicate]

    @property
    def things(self) -> tuple[Thing, ...]:
        """What stands in each slot."""
        return tuple(o.thing for o in self.objects)

    def signature(self) -> tuple:
        """Order-free meaning: two scenes with equal signatures are described by the same captions."""
        return tuple(sorted((o.noun, o.size, o.count, o.facing, o.cell) for o in self.objects))

    def with_things(self, things: Sequence[Thing]) -> "OpenScene":
        """The same slots holding ``things``."""
        return replace(self, objects=tuple(replace(o, noun=t.noun, size=t.size, count=t.count, facing=t.facing)
                                           for o, t in zip(self.objects, things)))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (kind, backdrop, objects, relations; ``background`` for readers of shapes worlds)."""
        return {"scene_kind": self.kind, "background": list(self.background), "backdrop": self.backdrop.to_json(),
                "objects": [o.to_json() for o in self.objects], "relations": [r.to_json() for r in self.relations]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "OpenScene":
        """Inverse of to_json (relations are re-derived)."""
        return OpenScene(tuple(OpenObject.from_json(o) for o in d["objects"]), Backdrop.from_json(d["backdrop"]))


# --- layout -------------------------------------------------------------------------------

_MARGIN = 0.01
_JITTER = 0.02  # each centre moves this far at most off its row/column line
OVERLAP = 0.12  # neighbouring groups may overlap by this share of their half-extents
_SIDE_GAP = 0.01  # same-side pairs: both centres at least this far short of the image centre


def layout_cells(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """Logical cells: one in the middle; two on a random axis; three in a row or around an anchor; four in the corners."""
    if n == 4:
        return list(_GRID4)
    if n not in (1, 2, 3):
        raise ValueError("open scenes hold one to four things")
    return related_cells(rng, n)


def _axis_positions(rng: np.random.Generator, coords: list[int], half: dict[int, float], lo: float,
                    hi: float) -> dict[int, float] | None:
    """Centres of the grid lines ``coords`` (ascending) on one axis: lines ``half`` apart as needed, all groups inside
    [lo, hi] (their extents included), the spare room spread at random. None when they do not fit."""
    first, last = coords[0], coords[-1]
    c_lo = lo + half[first] + _JITTER
    c_hi = hi - half[last] - _JITTER
    gaps = [(half[a] + half[b]) * (1.0 - OVERLAP) + 2 * _JITTER for a, b in zip(coords, coords[1:])]
    slack = c_hi - c_lo - sum(gaps)
    if slack < 0:
        return None
    w = rng.random(len(coords) + 1)
    parts = slack * w / w.sum()
    pos, x = {}, c_lo + parts[0]
    for i, c in enumerate(coords):
        if i:
            x += gaps[i - 1] + parts[i]
        pos[c] = x
    return pos


def _halves(cells: list[tuple[int, int]], extents: list[tuple[float, float]], axis: int) -> tuple[list[int], dict[int, float]]:
    """Grid lines used on ``axis`` and the largest half-extent of a group on each."""
    coords = sorted({c[axis] for c in cells})
    return coords, {c: max(e[axis] for cell, e in zip(cells, extents) if cell[axis] == c) for c in coords}


def place(rng: np.random.Generator, cells: list[tuple[int, int]], extents: list[tuple[float, float]],
          same_side: bool = False) -> list[tuple[float, float]] | None:
    """Jittered centres for ``cells`` whose groups have half ``extents`` (the largest any family member puts there);
    None when they do not fit in the frame. same_side (two things): both centres on one random side of the image
    centre along their axis, so the subject's side alone does not decide the relation."""
    bounds = {0: (_MARGIN, 1.0 - _MARGIN), 1: (_MARGIN, 1.0 - _MARGIN)}
    if same_side:
        if len(cells) != 2:
            raise ValueError("same-side layouts place two things")
        axis = 0 if cells[0][1] == cells[1][1] else 1
        coords, half = _halves(cells, extents, axis)
        # The bound on a group's edge that keeps its centre (jitter included) short of the middle.
        if rng.random() < 0.5:
            bounds[axis] = (_MARGIN, min(1.0 - _MARGIN, 0.5 - _SIDE_GAP + half[coords[-1]]))
        else:
            bounds[axis] = (max(_MARGIN, 0.5 + _SIDE_GAP - half[coords[0]]), 1.0 - _MARGIN)
    centres: list[list[float]] = [[0.0, 0.0] for _ in cells]
    for axis in (0, 1):
        coords, half = _halves(cells, extents, axis)
        pos = _axis_positions(rng, coords, half, *bounds[axis])
        if pos is None:
            return None
        for i, cell in enumerate(cells):
            centres[i][axis] = pos[cell[axis]] + rng.uniform(-_JITTER, _JITTER)
    return [(_r4(x), _r4(y)) for x, y in centres]


# --- twins -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenSwap:
    """One twin operation: sizes swapped (two objects) or changed (one), a facing flipped, a count changed,
    two things' places exchanged (relation), or a noun replaced by a neighbour."""

    kind: str
    objects: tuple[int, ...]
    to: str | int | None = None  # the new value (size change, count, noun)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the shapes world's kind/objects, plus the new value where there is one)."""
        d: dict[str, Any] = {"kind": self.kind, "objects": list(self.objects)}
        if self.to is not None:
            d["to"] = self.to
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "OpenSwap":
        """Inverse of to_json."""
        return OpenSwap(d["kind"], tuple(d["objects"]), d.get("to"))


def possible_swaps(things: Sequence[Thing], kind: str, neighbours, directional) -> list[OpenSwap]:
    """Every twin operation of ``kind`` that changes the meaning. ``neighbours(noun)`` lists a noun's group mates,
    ``directional(noun)`` says whether its glyph faces a way."""
    n = len(things)
    if kind == "size":
        pairs = [OpenSwap("size", (i, j)) for i in range(n) for j in range(i + 1, n) if things[i].size != things[j].size]
        return pairs or [OpenSwap("size", (i,), "large" if things[i].size == "small" else "small") for i in range(n)]
    if kind == "facing":
        return [OpenSwap("facing", (i,), FACINGS[1 - FACINGS.index(t.facing)]) for i, t in enumerate(things) if t.facing]
    if kind == "count":
        return [OpenSwap("count", (i,), c) for i, t in enumerate(things) for c in COUNTS if c != t.count]
    if kind == "relation":
        return [OpenSwap("relation", (i, j)) for i in range(n) for j in range(i + 1, n)]
    if kind == "noun":
        present = {t.noun for t in things}
        return [OpenSwap("noun", (i,), m) for i, t in enumerate(things) for m in neighbours(t.noun)
                if m not in present and directional(m) == bool(t.facing)]
    raise ValueError(f"unknown twin kind {kind!r}")


def apply_swap(things: Sequence[Thing], swap: OpenSwap) -> tuple[Thing, ...]:
    """The twin's things."""
    out = list(things)
    if swap.kind == "relation":
        i, j = swap.objects
        out[i], out[j] = out[j], out[i]
    elif swap.kind == "size" and len(swap.objects) == 2:
        i, j = swap.objects
        out[i], out[j] = replace(out[i], size=things[j].size), replace(out[j], size=things[i].size)
    else:
        (i,) = swap.objects
        field = {"size": "size", "facing": "facing", "count": "count", "noun": "noun"}[swap.kind]
        out[i] = replace(out[i], **{field: swap.to})
    return tuple(out)


def open_difference(a: OpenScene, b: OpenScene) -> str:
    """What differs between two scenes of one family: "size", "facing", "count", "noun" when things in the same
    cells differ in that attribute alone, "relation" when the same things stand elsewhere, else "two swaps"."""
    return difference(a.objects, b.objects, ("noun", "size", "count", "facing"))
