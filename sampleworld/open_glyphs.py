"""The open world's vocabulary at run time: the committed glyph table (open_assets/glyphs.tsv), read once."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .open_table import COLUMNS, TABLE_PATH


@dataclass(frozen=True)
class Glyph:
    """One drawable thing: its sprite index, noun, plural, synonyms, category, neighbour group and default facing."""

    index: int
    codepoint: str
    noun: str
    plural: str
    category: str
    group: str
    synonyms: tuple[tuple[str, str], ...]  # (singular, plural)
    facing: str  # "left" | "right" | "" (no direction: never mirrored, never described as facing)

    @property
    def directional(self) -> bool:
        """Whether the glyph faces a way (so it can be mirrored and described as facing left/right)."""
        return bool(self.facing)

    @property
    def names(self) -> tuple[tuple[str, str], ...]:
        """(singular, plural) of the noun and every synonym, the noun first."""
        return ((self.noun, self.plural),) + self.synonyms


@dataclass(frozen=True)
class GlyphTable:
    """All glyphs, by noun, and each group's members."""

    glyphs: tuple[Glyph, ...]

    @functools.cached_property
    def by_noun(self) -> dict[str, Glyph]:
        """Glyph of each noun."""
        return {g.noun: g for g in self.glyphs}

    @functools.cached_property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Nouns of each neighbour group, in table order."""
        out: dict[str, list[str]] = {}
        for g in self.glyphs:
            out.setdefault(g.group, []).append(g.noun)
        return {k: tuple(v) for k, v in out.items()}

    def neighbours(self, noun: str) -> tuple[str, ...]:
        """The other nouns of ``noun``'s group (what a noun twin may swap it for)."""
        return tuple(n for n in self.groups[self.by_noun[noun].group] if n != noun)

    @property
    def nouns(self) -> tuple[str, ...]:
        """Every noun, in table order."""
        return tuple(g.noun for g in self.glyphs)

    @functools.cached_property
    def categories(self) -> tuple[str, ...]:
        """Distinct categories, in table order."""
        return tuple(dict.fromkeys(g.category for g in self.glyphs))


def _row(index: int, fields: dict[str, str]) -> Glyph:
    syns = tuple(tuple(s.split("/", 1)) for s in fields["synonyms"].split("|") if s)
    return Glyph(index, fields["codepoint"], fields["noun"], fields["plural"], fields["category"], fields["group"],
                 syns, fields["facing"])  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4)
def load_glyphs(path: Path = TABLE_PATH) -> GlyphTable:
    """The glyph table (row i is sprite i of the sheet)."""
    lines = Path(path).read_text(encoding="utf-8").rstrip("\n").split("\n")
    header = tuple(lines[0].split("\t"))
    if header != COLUMNS:
        raise ValueError(f"{path}: columns {header} are not {COLUMNS}")
    return GlyphTable(tuple(_row(i, dict(zip(COLUMNS, line.split("\t")))) for i, line in enumerate(lines[1:])))
