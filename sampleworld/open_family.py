"""Families of the open world: a base scene plus twins that each change one thing in one labelled way.

Twin kinds (open_scene.TWIN_KINDS): sizes swapped between two things (or one size changed when all match),
a facing flipped, a count changed, two things' places exchanged (relation), a noun replaced by a neighbour
from its group (dog/wolf, car/taxi, apple/pear). As in the shapes world each twin applies one kind in turn and
families larger than base + one twin per kind compose two. The slots (cells, centres, scales) are placed
last, for the largest group any member puts in each, so every member fits the same layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .open_glyphs import GlyphTable
from .open_held_out import OpenHeldOut
from .open_scene import (
    COUNTS,
    FACINGS,
    SCALE_JITTER,
    TWIN_KINDS,
    Backdrop,
    OpenObject,
    OpenScene,
    OpenSwap,
    Thing,
    apply_swap,
    layout_cells,
    place,
    possible_swaps,
)
from .pickers import choose
from .twins import role

_MAX_TRIES = 200
# Count weights by number of things: crowded scenes get fewer groups (they would not fit).
_COUNT_WEIGHTS = {1: (0.5, 0.3, 0.2), 2: (0.6, 0.25, 0.15), 3: (0.75, 0.15, 0.1), 4: (0.85, 0.1, 0.05)}
_BACKDROP_RANGE = (30, 227)


@dataclass(frozen=True)
class OpenMember:
    """One image of a family: its scene and the swaps that turn the base into it."""

    scene: OpenScene
    swaps: tuple[OpenSwap, ...]

    @property
    def role(self) -> str:
        """``base`` or e.g. ``noun_swap`` / ``size_swap+relation_swap`` (the shapes world's naming)."""
        return role(self.swaps)


def sample_backdrop(rng: np.random.Generator) -> Backdrop:
    """Two random colours, a gradient direction and a noise seed."""
    c = rng.integers(*_BACKDROP_RANGE, size=(2, 3))
    return Backdrop((tuple(int(v) for v in c[0]), tuple(int(v) for v in c[1])), int(rng.integers(8)),  # type: ignore[arg-type]
                    int(rng.integers(2**31)))


def _thing(rng: np.random.Generator, table: GlyphTable, index: int, n_things: int) -> Thing:
    g = table.glyphs[index]
    size = "large" if rng.random() < 0.5 else "small"
    count = COUNTS[int(rng.choice(len(COUNTS), p=_COUNT_WEIGHTS[n_things]))]
    facing = FACINGS[int(rng.integers(2))] if g.directional else ""
    return Thing(g.noun, size, count, facing)


def _forced(rng: np.random.Generator, table: GlyphTable, held: OpenHeldOut, taken_nouns: set[str]) -> Thing:
    """A thing carrying one of the withheld combinations (for `only` worlds)."""
    a, b = held.combos[int(rng.integers(len(held.combos)))]
    vals = {a, b}
    names_what = bool(vals & set(table.categories)) or any(v in table.by_noun for v in vals)
    pool = [g for g in table.glyphs if g.noun not in taken_nouns and (g.noun in vals or g.category in vals or not names_what)]
    if vals & set(FACINGS):
        pool = [g for g in pool if g.directional]
    if not pool:
        raise ValueError(f"no glyph can carry {a}+{b}")
    g = pool[int(rng.integers(len(pool)))]
    size = next((v for v in vals if v in ("small", "large")), "large" if rng.random() < 0.5 else "small")
    words = {"one": 1, "two": 2, "three": 3}
    count = next((words[v] for v in vals if v in words), 1)
    facing = next((v for v in vals if v in FACINGS), FACINGS[int(rng.integers(2))] if g.directional else "")
    return Thing(g.noun, size, count, facing)


def sample_things(rng: np.random.Generator, table: GlyphTable, n: int, held: OpenHeldOut | None = None) -> tuple[Thing, ...]:
    """``n`` things with distinct nouns; with held-out combinations, none (exclude) or at least one (only) carries one."""
    for _ in range(_MAX_TRIES):
        picks = rng.choice(len(table.glyphs), size=n, replace=False)
        things = [_thing(rng, table, int(i), n) for i in picks]
        if held is not None and held.mode == "only" and not held.admits_things(things):
            slot = int(rng.integers(n))
            things[slot] = _forced(rng, table, held, {t.noun for k, t in enumerate(things) if k != slot})
        if held is None or held.admits_things(things):
            return tuple(things)
    raise ValueError(f"no scene of {n} things fits held-out {held.combos if held else ()} in {_MAX_TRIES} draws")


def _twin(rng: np.random.Generator, base: tuple[Thing, ...], kinds: list[str], index: int,
          table: GlyphTable) -> tuple[tuple[Thing, ...], tuple[OpenSwap, ...]]:
    """Twin number ``index``: one change per kind in turn; two composed once kinds run out."""
    first = kinds[index % len(kinds)]
    swaps = [choose(rng, _options(base, first, table))]
    things = apply_swap(base, swaps[0])
    if index >= len(kinds):
        second = [k for k in kinds if k != first and _options(things, k, table)]
        if second:
            k2 = second[int(rng.integers(len(second)))]
            swaps.append(choose(rng, _options(things, k2, table)))
            things = apply_swap(things, swaps[1])
    return things, tuple(swaps)


def _options(things: tuple[Thing, ...], kind: str, table: GlyphTable) -> list[OpenSwap]:
    return possible_swaps(things, kind, table.neighbours, lambda noun: table.by_noun[noun].directional)


def _signature(things: tuple[Thing, ...], cells: list[tuple[int, int]]) -> tuple:
    return tuple(sorted((t.noun, t.size, t.count, t.facing, c) for t, c in zip(things, cells)))


def sample_open_family(rng: np.random.Generator, table: GlyphTable, family_size: int, objects: tuple[int, int] = (1, 4),
                       same_side_rate: float = 0.0, taken: set[tuple] | None = None,
                       held: OpenHeldOut | None = None) -> list[OpenMember]:
    """A base scene and ``family_size - 1`` twins, all with distinct meanings not in ``taken`` (updated in place),
    all admitted by ``held``. A share ``same_side_rate`` of two-thing families put both on one side of the centre."""
    if family_size < 1:
        raise ValueError("family_size must be >= 1")
    lo, hi = objects
    if not 1 <= lo <= hi <= 4:
        raise ValueError(f"things per open scene must lie in 1..4, got {objects}")
    # One-thing worlds (curricula) have a few thousand meanings: as in the shapes world they may repeat one.
    taken = set() if taken is None or hi == 1 else taken
    for _ in range(_MAX_TRIES):
        backdrop = sample_backdrop(rng)
        n = lo + int(rng.integers(hi - lo + 1))
        same_side = n == 2 and same_side_rate > 0 and rng.random() < same_side_rate
        cells = layout_cells(rng, n)
        scales = [round(float(s), 3) for s in rng.uniform(*SCALE_JITTER, size=n)]
        base = sample_things(rng, table, n, held)
        kinds = [k for k in TWIN_KINDS if _options(base, k, table)]
        kinds = [kinds[i] for i in rng.permutation(len(kinds))]
        if family_size > 1 and not kinds:
            continue
        members: list[tuple[tuple[Thing, ...], tuple[OpenSwap, ...]]] = [(base, ())]
        seen = {_signature(base, cells)}
        if next(iter(seen)) in taken:
            continue
        ok = True
        for t in range(family_size - 1):
            for _attempt in range(_MAX_TRIES):
                things, swaps = _twin(rng, base, kinds, t, table)
                sig = _signature(things, cells)
                if sig not in seen and sig not in taken and (held is None or held.admits_things(things)):
                    break
            else:
                ok = False
                break
            members.append((things, swaps))
            seen.add(sig)
        if not ok:
            continue
        # Each slot must hold the largest group any member puts there.
        slot_objects = [[OpenObject(t[i].noun, t[i].size, t[i].count, t[i].facing, cells[i], (0.5, 0.5), scales[i])
                         for t, _ in members] for i in range(n)]
        extents = [(max(o.extent()[0] for o in objs), max(o.extent()[1] for o in objs)) for objs in slot_objects]
        centres = place(rng, cells, extents, same_side)
        if centres is None:
            continue
        slots = OpenScene(tuple(OpenObject("", "small", 1, "", cells[i], centres[i], scales[i]) for i in range(n)), backdrop)
        taken.update(seen)
        return [OpenMember(slots.with_things(things), swaps) for things, swaps in members]
    raise RuntimeError(f"could not sample an open family of {family_size} distinct scenes")
