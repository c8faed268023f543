"""What a sample world is made of, whatever its kind: the config that draws it and one record per image."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_KIND = "shapes"
IMAGE_DIR = "images"


@dataclass(frozen=True)
class WorldConfig:
    """What to generate; image counts are rounded to whole families."""

    seed: int = 0
    n_train: int = 6000
    n_val: int = 500
    n_test: int = 1000
    image_size: int = 128
    family_size: int = 4
    captions_per_image: int = 5
    # Objects per scene (inclusive). (1, 1) makes the curriculum's first world: one object per
    # image, no twins (family_size 1), captions that name its three attributes.
    min_objects: int = 2
    max_objects: int = 3
    # Withheld attribute combinations ("red+circle", "large+square", "star+left"; sampleworld/held_out.py) and whether the
    # world excludes them everywhere or is made only of images that show one.
    held_out: tuple[str, ...] = ()
    held_out_mode: str = "exclude"
    # Share of two-object families whose objects both lie on one side of the image centre (the relation
    # cannot be read from the subject's side alone; reported as the "same side" subset).
    same_side_rate: float = 0.0
    # A registered world kind (sampleworld/registry.py): "shapes" (sampleworld/shapes_world.py) or "open", emoji
    # glyphs of hundreds of real nouns (sampleworld/open_world.py).
    kind: str = DEFAULT_KIND

    def families(self, split: str) -> int:
        """Number of families in ``split`` (nearest whole number; at least one if asked for any)."""
        n = {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]
        if n <= 0:
            return 0
        return max(1, (n + self.family_size // 2) // self.family_size)


def image_id(index: int) -> str:
    """Stable id of the ``index``-th generated image."""
    return f"sw_{index:06d}"


@dataclass(frozen=True)
class ImageRecord:
    """One image of the world with its scene, family and captions (the scene and swaps of the world's kind)."""

    image_id: str
    split: str
    family_id: int
    role: str
    swaps: tuple[Any, ...]
    scene: Any
    captions: tuple[str, ...]
    render_seed: int
    # Open worlds: each caption's template id and whether it is a held-out (test-only) template.
    caption_templates: tuple[str, ...] = ()
    held_out_captions: tuple[bool, ...] = ()

    @property
    def image(self) -> str:
        """Path relative to the world root."""
        return f"{IMAGE_DIR}/{self.image_id}.jpg"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict as stored in world.json."""
        return {
            "image_id": self.image_id,
            "image": self.image,
            "split": self.split,
            "family_id": self.family_id,
            "role": self.role,
            "swaps": [s.to_json() for s in self.swaps],
            **self.scene.to_json(),
            "captions": list(self.captions),
            **({"caption_templates": list(self.caption_templates), "held_out_captions": list(self.held_out_captions)}
               if self.caption_templates else {}),
            "render_seed": self.render_seed,
        }

    @staticmethod
    def from_json(d: dict[str, Any], scene_from_json: Callable[[dict], Any],
                  swap_from_json: Callable[[dict], Any]) -> "ImageRecord":
        """Inverse of to_json, reading the scene and swaps with the world kind's readers."""
        return ImageRecord(
            image_id=d["image_id"],
            split=d["split"],
            family_id=d["family_id"],
            role=d["role"],
            swaps=tuple(swap_from_json(s) for s in d["swaps"]),
            scene=scene_from_json(d),
            captions=tuple(d["captions"]),
            render_seed=d["render_seed"],
            caption_templates=tuple(d.get("caption_templates", ())),
            held_out_captions=tuple(d.get("held_out_captions", ())),
        )
