"""The shapes world as a registered kind: its records, vocabulary and the WorldKind that sampleworld/registry.py holds.

Six shapes in eight colours and two sizes, two or three to a scene (sampleworld/scene.py); the default kind.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .captions import make_captions
from .family import sample_family
from .grounding import caption_grounding
from .held_out import HeldOut
from .records import SPLITS, ImageRecord, WorldConfig, image_id
from .relations import RELATIONS
from .render import render
from .scene import COLOURS, SHAPES, SIZES, TWIN_KINDS, Scene, Swap, shapes_difference
from .scene_tokens import SceneTokenizer
from .world_kind import WorldKind

_HELD_OUT_TRIES = 10_000


def sample_shapes_records(config: WorldConfig) -> list[ImageRecord]:
    """All image records of a shapes world (scenes, captions, seeds), without touching the disk."""
    rng = np.random.default_rng(config.seed)
    held = HeldOut.parse(config.held_out, config.held_out_mode) if config.held_out else None
    taken: set[tuple] = set()
    records: list[ImageRecord] = []
    family_id = 0
    for split in SPLITS:
        for _ in range(config.families(split)):
            members = sample_family(rng, config.family_size, taken, (config.min_objects, config.max_objects),
                                    config.same_side_rate)
            tries = 1
            while held is not None and not held.admits([m.scene for m in members]):
                # Only worlds with held-out combinations draw again, so every other seed keeps its bytes.
                if tries >= _HELD_OUT_TRIES:
                    raise ValueError(f"no family fits held-out {config.held_out} ({config.held_out_mode}) "
                                     f"in {tries} draws")
                members = sample_family(rng, config.family_size, taken, (config.min_objects, config.max_objects),
                                        config.same_side_rate)
                tries += 1
            # One caption seed per family: every member gets the same templates and synonym slots.
            caption_seed = int(rng.integers(2**63))
            for m in members:
                records.append(
                    ImageRecord(
                        image_id=image_id(len(records)),
                        split=split,
                        family_id=family_id,
                        role=m.role,
                        swaps=m.swaps,
                        scene=m.scene,
                        captions=tuple(make_captions(m.scene, config.captions_per_image, caption_seed)),
                        render_seed=int(rng.integers(2**63)),
                    )
                )
            family_id += 1
    return records


def shapes_vocabulary() -> dict[str, Any]:
    """world.json's vocabulary of a shapes world: shapes, colours with their RGB, sizes with their radii, relations."""
    return {
        "shapes": list(SHAPES),
        "colours": {k: list(v) for k, v in COLOURS.items()},
        "sizes": dict(SIZES),
        "relations": list(RELATIONS),
    }


SHAPES_WORLD = WorldKind(
    name=Scene.kind,
    twin_kinds=TWIN_KINDS,
    records=sample_shapes_records,
    render=render,
    vocabulary=shapes_vocabulary,
    scene_from_json=Scene.from_json,
    swap_from_json=Swap.from_json,
    difference=shapes_difference,
    grounding=caption_grounding,
    parse_held_out=HeldOut.parse,
    scene_tokenizer=SceneTokenizer,
)
