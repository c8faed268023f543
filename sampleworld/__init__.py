"""The sample world, installed as `edje.sampleworld`: a deterministic generator of compositional image-caption data
with attribute-swapped hard distractors, plus a loopback HTTP server to download it from.

A shared core (relations, phrases, pickers, pixels, twins, held-out specs, records and WorldConfig) under two kinds
that stand side by side behind one interface (world_kind.py), registered by name (registry.py): "shapes" (the
default; shapes_world.py over scene, captions, family, render, grounding, held_out) and "open" (emoji glyphs of
hundreds of real nouns; open_world.py over the open_* modules). world.py writes and reads either on disk.
"""

from .open_world import open_world_config
from .records import SPLITS, ImageRecord, WorldConfig
from .registry import KINDS
from .relations import RELATIONS, Relation
from .scene import COLOURS, SHAPES, SIZES, Scene, SceneObject, Swap
from .server import LoopbackServer, serve_directory
from .world import WorldManifest, draw_images, generate, load_world, load_world_config, url_rows, write_url_list

__all__ = [
    "COLOURS",
    "KINDS",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "ImageRecord",
    "LoopbackServer",
    "Relation",
    "Scene",
    "SceneObject",
    "Swap",
    "WorldConfig",
    "WorldManifest",
    "draw_images",
    "generate",
    "load_world",
    "load_world_config",
    "open_world_config",
    "serve_directory",
    "url_rows",
    "write_url_list",
]
