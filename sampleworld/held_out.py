"""Held-out attribute combinations of the shapes world: a world whose training never shows them, and a test world
made only of them.

A combination pairs two values of one object, of two different attributes: a colour, a shape, a size or a
relation side ("left", "right", "above", "below"); e.g. "red+circle", "large+square", "star+left". A side
means the object lies on that side of another object of the scene exactly as the captions state relations
(`object_sides`): "star+left" is a star that some caption calls left of another object, or that another
object is called right of. At most one side per combination ("left+above" is refused). `exclude` worlds
contain no object with any withheld combination; `only` worlds contain one in every image (twins included).
A reranker trained on an `exclude` world and tested on an `only` world shows whether binding is learned or
memorised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .held_out_specs import check_mode, parse_combos
from .relations import INVERSE
from .scene import COLOURS, SHAPES, SIZES, Scene

# The relation values of a combination, by the predicate they name; unlike the open world's facings
# ("car+left": a left-facing car), a side here is where the object lies relative to another object.
SIDES: dict[str, str] = {"left": "left_of", "right": "right_of", "above": "above", "below": "below"}
_SIDE_OF = {p: s for s, p in SIDES.items()}
_VALUES = {**{c: "colour" for c in COLOURS}, **{s: "shape" for s in SHAPES}, **{z: "size" for z in SIZES},
           **{s: "relation" for s in SIDES}}


def object_sides(scene: Scene, index: int) -> set[str]:
    """The sides ("left", "above", ...) on which object ``index`` lies of another object, by the captions' rule."""
    # Captions state exactly the scene's relations, either way round ("a star left of a circle", "the circle is
    # right of the star"), so an object has the side of each relation it is the subject of and the inverse side of
    # each it is the reference of. Cells decide, never centres: a same-side scene's star left of a circle is left of
    # it even when both lie right of the centre. Diagonal neighbours (three objects in an L) are unrelated, as in
    # every caption.
    preds = {r.predicate for r in scene.relations if r.subject == index}
    preds |= {INVERSE[r.predicate] for r in scene.relations if r.object == index}
    return {_SIDE_OF[p] for p in preds}


def _object_values(scene: Scene, index: int) -> set[str]:
    """Every value object ``index`` carries: its colour, shape and size, and its sides."""
    o = scene.objects[index]
    return {o.colour, o.shape, o.size} | object_sides(scene, index)


@dataclass(frozen=True)
class HeldOut:
    """Withheld (value, value) combinations of one object's attributes and sides, and how a world treats them."""

    combos: tuple[tuple[str, str], ...]
    mode: str = "exclude"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        for a, b in self.combos:
            for v in (a, b):
                if v not in _VALUES:
                    raise ValueError(f"unknown attribute value {v!r}; known: {sorted(_VALUES)}")
            if _VALUES[a] == _VALUES[b]:
                raise ValueError(f"{a}+{b}: both are {_VALUES[a]} values; a combination pairs two different "
                                 f"attributes (colour, shape, size, relation: {'/'.join(SIDES)})")

    @classmethod
    def parse(cls, specs: Iterable[str], mode: str = "exclude") -> "HeldOut":
        """From strings such as "red+circle", "large+square" and "star+left"."""
        return cls(parse_combos(specs, "red+circle"), mode)

    def in_scene(self, scene: Scene) -> bool:
        """Whether any object of the scene carries a withheld combination."""
        values = [_object_values(scene, i) for i in range(len(scene.objects))]
        return any({a, b} <= v for v in values for a, b in self.combos)

    def admits(self, scenes: Sequence[Scene]) -> bool:
        """Whether a family of scenes belongs in the world: none hit (exclude), or every one hits (only)."""
        hits = [self.in_scene(s) for s in scenes]
        return not any(hits) if self.mode == "exclude" else all(hits)
