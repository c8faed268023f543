"""The open world's records and vocabulary, for `world.generate` (``WorldConfig(kind="open")``, ``generate --world open``)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .open_captions import make_open_captions, template_ids
from .open_family import sample_open_family
from .open_glyphs import load_glyphs
from .open_held_out import OpenHeldOut
from .open_scene import COUNT_WORDS, FACINGS, SIZES, TWIN_KINDS
from .open_sprites import CELL
from .scene import RELATIONS

# What an open world draws when the command line leaves these unset: one to four things per scene and a
# quarter of two-thing families on one side of the image centre (the relation's same-side subset).
OPEN_DEFAULTS: dict[str, Any] = {"min_objects": 1, "max_objects": 4, "same_side_rate": 0.25}


def open_world_config(**overrides: Any):
    """A WorldConfig of kind "open" with OPEN_DEFAULTS, then ``overrides``."""
    from .world import WorldConfig

    return replace(WorldConfig(kind="open", **OPEN_DEFAULTS), **overrides)


def sample_open_records(config) -> list:
    """All image records of an open world (scenes, captions with their templates, seeds), without touching the disk."""
    from .world import SPLITS, ImageRecord, image_id

    if config.image_size < 16:
        raise ValueError("image_size must be >= 16")
    table = load_glyphs()
    rng = np.random.default_rng(config.seed)
    held = OpenHeldOut.parse(config.held_out, table, config.held_out_mode) if config.held_out else None
    taken: set[tuple] = set()
    records: list = []
    family_id = 0
    for split in SPLITS:
        for _ in range(config.families(split)):
            members = sample_open_family(rng, table, config.family_size, (config.min_objects, config.max_objects),
                                         config.same_side_rate, taken, held)
            # One caption seed per family: every member gets the same templates and synonym slots.
            caption_seed = int(rng.integers(2**63))
            for m in members:
                caps = make_open_captions(m.scene, config.captions_per_image, caption_seed, table, with_held_out=split == "test")
                records.append(ImageRecord(
                    image_id=image_id(len(records)), split=split, family_id=family_id, role=m.role, swaps=m.swaps,
                    scene=m.scene, captions=tuple(c.text for c in caps), render_seed=int(rng.integers(2**63)),
                    caption_templates=tuple(c.template for c in caps), held_out_captions=tuple(c.held_out for c in caps)))
            family_id += 1
    return records


def open_vocabulary() -> dict[str, Any]:
    """world.json's vocabulary of an open world: the glyph table's nouns, attribute values, relations, templates."""
    table = load_glyphs()
    return {
        "kind": "open",
        "glyphs": [{"noun": g.noun, "codepoint": g.codepoint, "category": g.category, "group": g.group,
                    "facing": g.facing, "synonyms": [s for s, _ in g.synonyms]} for g in table.glyphs],
        "categories": list(table.categories),
        "sizes": dict(SIZES),
        "counts": {str(k): v for k, v in COUNT_WORDS.items()},
        "facings": list(FACINGS),
        "relations": list(RELATIONS),
        "twin_kinds": list(TWIN_KINDS),
        "templates": {"train": template_ids(held_out=False), "held_out": template_ids(held_out=True)},
        "sprite_cell": CELL,
    }
