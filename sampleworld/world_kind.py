"""The interface every kind of sample world implements, so that generation, loading and evaluation never ask which
kind they hold (sampleworld/registry.py finds a kind by name)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .records import ImageRecord, WorldConfig
from .scene_token_grid import GridTokenizer, SceneTokenConfig


@dataclass(frozen=True, eq=False)  # one object per kind: compared and hashed by identity
class WorldKind:
    """One kind of world: its name, twin kinds and command-line defaults, and the functions that draw, render,
    describe, read back and compare its scenes, read its held-out combinations and build its perfect scene tokens."""

    name: str
    # The twin kinds its families are drawn with, in drawing order; evaluation and reports list them in this order.
    twin_kinds: tuple[str, ...]
    records: Callable[[WorldConfig], list[ImageRecord]]  # every image record of a world, without touching the disk
    render: Callable[[Any, int, int], np.ndarray]  # (scene, image size, seed) -> RGB uint8 pixels
    vocabulary: Callable[[], dict[str, Any]]  # world.json's vocabulary
    scene_from_json: Callable[[dict], Any]  # a world.json image record -> its scene
    swap_from_json: Callable[[dict], Any]
    difference: Callable[[Any, Any], str]  # what differs between two scenes of one family: a twin kind or TWO_SWAPS
    grounding: Callable[[str, Any], list[list[float]]]  # (caption, scene) -> [[word index, centre x, centre y], ...]
    # (VALUE+VALUE specs, mode) -> the kind's held-out combinations; ValueError names a value the kind does not know,
    # so a checkpoint's `held_out` can be checked before anything is generated.
    parse_held_out: Callable[[Iterable[str], str], Any]
    # SceneTokenConfig -> the painter of the kind's perfect scene tokens (a diagnostic token source, never a backbone).
    scene_tokenizer: Callable[[SceneTokenConfig], GridTokenizer]
    # WorldConfig values an unset command-line option takes where this kind's differ from WorldConfig's.
    defaults: dict[str, Any] = field(default_factory=dict)
