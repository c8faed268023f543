"""Held-out noun-attribute combinations of the open world, as `held_out.py` holds out colour/shape/size ones.

A combination pairs two values of one thing, of two different attributes: a noun or a category ("dog",
"animal"), a size ("small", "large"), a count ("one", "two", "three") or a facing ("left", "right"); e.g.
"dog+large", "car+left", "apple+two", "animal+three". `exclude` worlds show none of them; `only` worlds show
one in every image (twins included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .held_out_specs import check_mode, parse_combos
from .open_glyphs import GlyphTable
from .open_scene import COUNT_WORDS, FACINGS, SIZES, OpenScene, Thing

_IDENTITY = "noun or category"


def _attribute(value: str, table: GlyphTable) -> str:
    """Which attribute a value belongs to; nouns and categories both name what a thing is."""
    if value in table.by_noun or value in table.categories:
        return _IDENTITY
    if value in SIZES:
        return "size"
    if value in COUNT_WORDS.values():
        return "count"
    if value in FACINGS:
        return "facing"
    raise ValueError(f"unknown open-world value {value!r}: a noun of the glyph table, a category "
                     f"{list(table.categories)}, a size {list(SIZES)}, a count {list(COUNT_WORDS.values())} or a facing {list(FACINGS)}")


@dataclass(frozen=True)
class OpenHeldOut:
    """Withheld (value, value) combinations of one thing's attributes, and how a world treats them."""

    combos: tuple[tuple[str, str], ...]
    table: GlyphTable
    mode: str = "exclude"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        for a, b in self.combos:
            if _attribute(a, self.table) == _attribute(b, self.table):
                raise ValueError(f"{a}+{b}: a combination pairs two different attributes (noun or category, size, count, facing)")

    @classmethod
    def parse(cls, specs: Iterable[str], table: GlyphTable, mode: str = "exclude") -> "OpenHeldOut":
        """From strings such as "dog+large" and "animal+two"."""
        return cls(parse_combos(specs, "dog+large"), table, mode)

    def values(self, thing: Thing) -> set[str]:
        """A thing's values, its category included."""
        return {*thing.values(), self.table.by_noun[thing.noun].category}

    def hits(self, thing: Thing) -> bool:
        """Whether a thing carries a withheld combination."""
        vals = self.values(thing)
        return any(a in vals and b in vals for a, b in self.combos)

    def in_scene(self, scene: OpenScene) -> bool:
        """Whether any thing of the scene carries a withheld combination."""
        return any(self.hits(t) for t in scene.things)

    def admits_things(self, things: Sequence[Thing]) -> bool:
        """Whether one scene's things belong in the world: none hit (exclude), or one does (only)."""
        hit = any(self.hits(t) for t in things)
        return not hit if self.mode == "exclude" else hit
