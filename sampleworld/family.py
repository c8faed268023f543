"""Families of the shapes world: a base scene plus twins that differ only in binding.

Each twin applies one swap (colour, shape, size between two objects, or a mirror that flips
a relation) to the base, so its captions reuse the base's words in a different binding.
Families larger than base + one twin per applicable kind compose two swaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pickers import choose
from .scene import TWIN_KINDS, Scene, Swap, apply_swap, possible_swaps, sample_background, sample_scene
from .twins import role

_MAX_TRIES = 50


@dataclass(frozen=True)
class Member:
    """One image of a family: its scene, and the swaps that turn the base into it."""

    scene: Scene
    swaps: tuple[Swap, ...]

    @property
    def role(self) -> str:
        """``base`` or e.g. ``colour_swap`` / ``size_swap+relation_swap``."""
        return role(self.swaps)


def _twin(rng: np.random.Generator, base: Scene, kinds: list[str], index: int) -> Member:
    """Twin number ``index``: one swap per kind in turn; compose two once kinds run out."""
    first = kinds[index % len(kinds)]
    swaps = [choose(rng, possible_swaps(base, first))]
    if index >= len(kinds):
        second = [k for k in kinds if k != first]
        k2 = second[int(rng.integers(len(second)))]
        swaps.append(choose(rng, possible_swaps(apply_swap(base, swaps[0]), k2)))
    scene = base
    for s in swaps:
        scene = apply_swap(scene, s)
    return Member(scene, tuple(swaps))


def sample_family(
    rng: np.random.Generator,
    family_size: int,
    taken: set[tuple] | None = None,
    objects: tuple[int, int] = (2, 3),
    same_side_rate: float = 0.0,
) -> list[Member]:
    """A base scene and ``family_size - 1`` twins, all with distinct signatures not in ``taken``.
    A share ``same_side_rate`` of two-object families put both objects on one side of the image centre.

    ``taken`` (updated in place) keeps every scene meaning unique across the world, so each
    caption describes exactly one image of the corpus.
    """
    if family_size < 1:
        raise ValueError("family_size must be >= 1")
    lo, hi = objects
    if not 1 <= lo <= hi <= 3:
        raise ValueError(f"objects per scene must lie in 1..3, got {objects}")
    if hi == 1 and family_size > 1:
        raise ValueError("one-object scenes have no twins (nothing to swap): use family_size 1")
    if hi == 1:
        # Only 96 one-object meanings exist: such worlds (training curricula) repeat them at other
        # places and backgrounds, so a caption there does not name exactly one image.
        taken = set()
    taken = taken if taken is not None else set()
    for _ in range(_MAX_TRIES):
        background = sample_background(rng)
        n_objects = lo + int(rng.integers(hi - lo + 1))  # (2, 3): the stream every world so far was drawn from
        # Drawn only when asked for, so worlds without same-side scenes keep their random stream.
        same_side = n_objects == 2 and same_side_rate > 0 and rng.random() < same_side_rate
        base = sample_scene(rng, n_objects, background, same_side)
        members = [Member(base, ())]
        seen = {base.signature()}
        if base.signature() in taken:
            continue
        kinds = [k for k in TWIN_KINDS if possible_swaps(base, k)]
        kinds = [kinds[i] for i in rng.permutation(len(kinds))]
        if not kinds and family_size > 1:
            continue  # a one-object base has no twins
        ok = True
        for t in range(family_size - 1):
            for _attempt in range(_MAX_TRIES):
                m = _twin(rng, base, kinds, t)
                sig = m.scene.signature()
                if sig not in seen and sig not in taken:
                    break
            else:
                ok = False
                break
            members.append(m)
            seen.add(sig)
        if ok:
            taken.update(seen)
            return members
    raise RuntimeError(f"could not sample a family of {family_size} distinct scenes")
