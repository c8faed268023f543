"""Held-out attribute combinations of the shapes world: a world whose training never shows them, and a test world
made only of them.

A combination pairs two attribute values of one object, e.g. "red+circle" (colour and shape) or
"large+square" (size and shape). `exclude` worlds contain no object with any withheld combination;
`only` worlds contain one in every image (twins included). A reranker trained on an `exclude` world
and tested on an `only` world shows whether binding is learned or memorised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .held_out_specs import check_mode, parse_combos
from .scene import COLOURS, SHAPES, SIZES, Scene

_VALUES = {**{c: "colour" for c in COLOURS}, **{s: "shape" for s in SHAPES}, **{z: "size" for z in SIZES}}


@dataclass(frozen=True)
class HeldOut:
    """Withheld (value, value) combinations of one object's attributes, and how a world treats them."""

    combos: tuple[tuple[str, str], ...]
    mode: str = "exclude"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        for a, b in self.combos:
            for v in (a, b):
                if v not in _VALUES:
                    raise ValueError(f"unknown attribute value {v!r}; known: {sorted(_VALUES)}")
            if _VALUES[a] == _VALUES[b]:
                raise ValueError(f"{a}+{b}: a combination pairs two different attributes (colour, shape, size)")

    @classmethod
    def parse(cls, specs: Iterable[str], mode: str = "exclude") -> "HeldOut":
        """From strings such as "red+circle" and "large+square"."""
        return cls(parse_combos(specs, "red+circle"), mode)

    def in_scene(self, scene: Scene) -> bool:
        """Whether any object of the scene carries a withheld combination."""
        return any({a, b} <= {o.colour, o.shape, o.size} for o in scene.objects for a, b in self.combos)

    def admits(self, scenes: Sequence[Scene]) -> bool:
        """Whether a family of scenes belongs in the world: none hit (exclude), or every one hits (only)."""
        hits = [self.in_scene(s) for s in scenes]
        return not any(hits) if self.mode == "exclude" else all(hits)
