"""Twins as both kinds name them: a member's role from its swaps, and what differs between two scenes."""
from __future__ import annotations

from typing import Any, Sequence

# What a scene difference is called when it is not one twin kind alone.
TWO_SWAPS = "two swaps"


def role(swaps: Sequence[Any]) -> str:
    """``base`` or e.g. ``colour_swap`` / ``size_swap+relation_swap``."""
    return "+".join(f"{s.kind}_swap" for s in swaps) or "base"


def difference(a: Sequence[Any], b: Sequence[Any], attributes: Sequence[str]) -> str:
    """What differs between the objects of two scenes of one family: an attribute's name when objects in the same
    cells differ in that attribute alone, "relation" when the same objects stand elsewhere, else TWO_SWAPS."""
    def values(o: Any) -> tuple:
        return tuple(getattr(o, k) for k in attributes)

    if sorted(values(o) for o in a) == sorted(values(o) for o in b):
        return "relation"
    at = {o.cell: o for o in b}
    if set(at) != {o.cell for o in a}:
        return TWO_SWAPS
    kinds = {k for o in a for k in attributes if getattr(o, k) != getattr(at[o.cell], k)}
    return next(iter(kinds)) if len(kinds) == 1 else TWO_SWAPS
