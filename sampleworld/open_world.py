"""The open world as a registered kind: its records, vocabulary and the WorldKind that sampleworld/registry.py holds
(``WorldConfig(kind="open")``, ``generate --world open``)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

import numpy as np

from .open_captions import make_open_captions, template_ids
from .open_family import sample_open_family
from .open_glyphs import load_glyphs
from .open_grounding import open_caption_grounding
from .open_held_out import OpenHeldOut
from .open_render import render_open
from .open_scene import COUNT_WORDS, FACINGS, KIND, SIZES, TWIN_KINDS, OpenScene, OpenSwap, open_difference
from .open_scene_tokens import OpenSceneTokenizer
from .open_sprites import CELL
from .records import SPLITS, ImageRecord, WorldConfig, image_id
from .relations import RELATIONS
from .world_kind import WorldKind

# What an open world draws when the command line leaves these unset: one to four things per scene and a
# quarter of two-thing families on one side of the image centre (the relation's same-side subset).
OPEN_DEFAULTS: dict[str, Any] = {"min_objects": 1, "max_objects": 4, "same_side_rate": 0.25}


def open_world_config(**overrides: Any) -> WorldConfig:
    """A WorldConfig of kind "open" with OPEN_DEFAULTS, then ``overrides``."""
    return replace(WorldConfig(kind=KIND, **OPEN_DEFAULTS), **overrides)


def sample_open_records(config: WorldConfig) -> list[ImageRecord]:
    """All image records of an open world (scenes, captions with their templates, seeds), without touching the disk."""
    table = load_glyphs()
    rng = np.random.default_rng(config.seed)
    held = OpenHeldOut.parse(config.held_out, table, config.held_out_mode) if config.held_out else None
    taken: set[tuple] = set()
    records: list[ImageRecord] = []
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


def parse_open_held_out(specs: Iterable[str], mode: str = "exclude") -> OpenHeldOut:
    """Held-out combinations of an open world ("dog+large", "animal+two") over the glyph table."""
    return OpenHeldOut.parse(specs, load_glyphs(), mode)


def open_vocabulary() -> dict[str, Any]:
    """world.json's vocabulary of an open world: the glyph table's nouns, attribute values, relations, templates."""
    table = load_glyphs()
    return {
        "kind": KIND,
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


OPEN_WORLD = WorldKind(
    name=KIND,
    twin_kinds=TWIN_KINDS,
    records=sample_open_records,
    render=render_open,
    vocabulary=open_vocabulary,
    scene_from_json=OpenScene.from_json,
    swap_from_json=OpenSwap.from_json,
    difference=open_difference,
    grounding=open_caption_grounding,
    parse_held_out=parse_open_held_out,
    scene_tokenizer=OpenSceneTokenizer,
    defaults=OPEN_DEFAULTS,
)
