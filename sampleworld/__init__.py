"""The sample world: a deterministic generator of compositional image-caption data with
attribute-swapped hard distractors, plus a loopback HTTP server to download it from."""

from .scene import COLOURS, RELATIONS, SHAPES, SIZES, Relation, Scene, SceneObject, Swap
from .server import LoopbackServer, serve_directory
from .world import (
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
    "serve_directory",
    "url_rows",
    "write_url_list",
]
