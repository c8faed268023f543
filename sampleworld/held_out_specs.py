"""Held-out combinations as both kinds write them: VALUE+VALUE specs and the two ways a world treats them."""
from __future__ import annotations

from typing import Iterable

# exclude: no image shows a withheld combination (training worlds); only: every image shows one (the test world).
MODES = ("exclude", "only")


def check_mode(mode: str) -> None:
    """ValueError unless ``mode`` is one of MODES."""
    if mode not in MODES:
        raise ValueError(f"held-out mode must be one of {MODES}, got {mode!r}")


def parse_combos(specs: Iterable[str], example: str) -> tuple[tuple[str, str], ...]:
    """("a", "b") pairs from "a+b" strings; ``example`` (e.g. "red+circle") shows the syntax in the error."""
    combos = []
    for spec in specs:
        parts = spec.split("+")
        if len(parts) != 2:
            raise ValueError(f"a held-out combination is VALUE+VALUE, e.g. {example}; got {spec!r}")
        combos.append((parts[0].strip(), parts[1].strip()))
    return tuple(combos)
