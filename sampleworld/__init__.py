"""The sample world: a deterministic generator of compositional image-caption data with
attribute-swapped hard distractors, plus a loopback HTTP server to download it from. Two kinds: "shapes"
(the default) and "open" (emoji glyphs of hundreds of real nouns; open_world.py)."""

from .open_world import open_world_config
from .scene import COLOURS, RELATIONS, SHAPES, SIZES, Relation, Scene, SceneObject, Swap
from .server import LoopbackServer, serve_directory
from .world import (
    KINDS,
    SPLITS,
    ImageRecord,
    WorldConfig,
    WorldManifest,
    generate,
    load_world,
    url_rows,
    write_url_list,
)

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
    "generate",
    "load_world",
    "open_world_config",
    "serve_directory",
    "url_rows",
    "write_url_list",
]
