"""The world kinds by name: the one place that decides which kind a config, a scene or a world.json record is."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .open_world import OPEN_WORLD
from .records import DEFAULT_KIND, WorldConfig
from .shapes_world import SHAPES_WORLD
from .twins import TWO_SWAPS
from .world_kind import WorldKind

_BY_NAME: dict[str, WorldKind] = {k.name: k for k in (SHAPES_WORLD, OPEN_WORLD)}
KINDS: tuple[str, ...] = tuple(_BY_NAME)
# Every scene difference evaluation can report: each kind's twin kinds (the default kind's first), then TWO_SWAPS.
ALL_TWIN_KINDS: tuple[str, ...] = (*dict.fromkeys(t for k in _BY_NAME.values() for t in k.twin_kinds), TWO_SWAPS)


def world_kind(name: str) -> WorldKind:
    """The kind registered as ``name`` (a WorldConfig's ``kind``, ``--world``)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"world kind must be one of {KINDS}, got {name!r}") from None


def world_config(name: str, **overrides: Any) -> WorldConfig:
    """A WorldConfig of kind ``name`` with that kind's defaults, then ``overrides``."""
    return replace(WorldConfig(kind=name, **world_kind(name).defaults), **overrides)


def kind_of(scene: Any) -> WorldKind:
    """The kind a scene object belongs to."""
    return world_kind(scene.kind)


def scene_from_json(record: dict[str, Any]) -> Any:
    """The scene of a world.json image record, of whichever kind wrote it (the default kind writes no marker)."""
    return world_kind(record.get("scene_kind", DEFAULT_KIND)).scene_from_json(record)
