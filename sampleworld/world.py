"""Generate the sample world on disk: images, Karpathy-style annotations, world.json, url lists."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .captions import make_captions
from .family import sample_family
from .grounding import caption_grounding
from .held_out import HeldOut
from .open_render import render_open
from .open_scene import OpenSwap, is_open_json
from .open_world import open_vocabulary, sample_open_records
from .render import encode_jpeg, render
from .scene import COLOURS, RELATIONS, SHAPES, SIZES, Scene, Swap

SPLITS: tuple[str, ...] = ("train", "val", "test")
KINDS: tuple[str, ...] = ("shapes", "open")
FORMAT_VERSION = "sampleworld/1"
IMAGE_DIR = "images"
WORLD_JSON = "world.json"
_ID_RE = re.compile(r"^sw_\d{6,}\.jpg$")
_HELD_OUT_TRIES = 10_000


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
    # Withheld attribute combinations ("red+circle", "large+square"; sampleworld/held_out.py) and whether the
    # world excludes them everywhere or is made only of images that show one.
    held_out: tuple[str, ...] = ()
    held_out_mode: str = "exclude"
    # Share of two-object families whose objects both lie on one side of the image centre (the relation
    # cannot be read from the subject's side alone; reported as the "same side" subset).
    same_side_rate: float = 0.0
    # "shapes" (sampleworld/scene.py) or "open": emoji glyphs of hundreds of real nouns (sampleworld/open_world.py).
    kind: str = "shapes"

    def families(self, split: str) -> int:
        """Number of families in ``split`` (nearest whole number; at least one if asked for any)."""
        n = {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]
        if n <= 0:
            return 0
        return max(1, (n + self.family_size // 2) // self.family_size)


@dataclass(frozen=True)
class ImageRecord:
    """One image of the world with its scene, family and captions."""

    image_id: str
    split: str
    family_id: int
    role: str
    swaps: tuple[Swap, ...]
    scene: Scene
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
    def from_json(d: dict[str, Any]) -> "ImageRecord":
        """Inverse of to_json."""
        swap = OpenSwap.from_json if is_open_json(d) else Swap.from_json
        return ImageRecord(
            image_id=d["image_id"],
            split=d["split"],
            family_id=d["family_id"],
            role=d["role"],
            swaps=tuple(swap(s) for s in d["swaps"]),  # type: ignore[misc]
            scene=Scene.from_json(d),
            captions=tuple(d["captions"]),
            render_seed=d["render_seed"],
            caption_templates=tuple(d.get("caption_templates", ())),
            held_out_captions=tuple(d.get("held_out_captions", ())),
        )


@dataclass(frozen=True)
class WorldManifest:
    """What ``generate`` wrote (or ``load_world`` read): records, splits and file paths."""

    root: Path
    config: WorldConfig
    images: tuple[ImageRecord, ...]
    splits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    annotations: dict[str, Path] = field(default_factory=dict)

    @property
    def world_json(self) -> Path:
        """Path of world.json."""
        return self.root / WORLD_JSON

    def image_path(self, image_id: str) -> Path:
        """Absolute path of an image file."""
        return self.root / IMAGE_DIR / f"{image_id}.jpg"

    def by_id(self) -> dict[str, ImageRecord]:
        """Records keyed by image id."""
        return {r.image_id: r for r in self.images}


def image_id(index: int) -> str:
    """Stable id of the ``index``-th generated image."""
    return f"sw_{index:06d}"


def _dump(path: Path, obj: Any) -> None:
    # Compact, key order as built, UTF-8: byte-stable for the same content.
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def annotation_path(root: str | Path, split: str) -> Path:
    """Path of the Karpathy-style annotation file of ``split``."""
    return Path(root) / f"flickr30k_{split}.json"


def _annotations(records: Sequence[ImageRecord], split: str) -> list[dict[str, Any]]:
    """BLIP/EDJE format: train has one entry per caption, val/test one per image; each caption's grounding
    (sampleworld/grounding.py: word index and object centre) rides along as phrase-box annotations do."""
    if split == "train":
        return [{"image": r.image, "caption": c, "image_id": r.image_id, "grounding": caption_grounding(c, r.scene)}
                for r in records for c in r.captions]
    return [{"image": r.image, "caption": list(r.captions), "image_id": r.image_id,
             "grounding": [caption_grounding(c, r.scene) for c in r.captions]} for r in records]


def _vocabulary() -> dict[str, Any]:
    return {
        "shapes": list(SHAPES),
        "colours": {k: list(v) for k, v in COLOURS.items()},
        "sizes": dict(SIZES),
        "relations": list(RELATIONS),
    }


def sample_records(config: WorldConfig) -> list[ImageRecord]:
    """All image records (scenes, captions, seeds) without touching the disk."""
    if config.kind not in KINDS:
        raise ValueError(f"world kind must be one of {KINDS}, got {config.kind!r}")
    if config.kind == "open":
        return sample_open_records(config)
    if config.image_size < 16:
        raise ValueError("image_size must be >= 16")
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


def _clear_stale_images(image_dir: Path, keep: set[str]) -> None:
    # Only our own file names are removed, so a re-generation into the same directory leaves
    # exactly this world's images (and the tree hash stays a function of the seed).
    for p in image_dir.iterdir():
        if _ID_RE.match(p.name) and p.name not in keep:
            p.unlink()


def _config_json(config: WorldConfig) -> dict[str, Any]:
    """world.json's config; a world without held-out combinations or same-side scenes writes the same bytes as
    before they existed."""
    cfg = asdict(config)
    if not config.held_out:
        del cfg["held_out"], cfg["held_out_mode"]
    if not config.same_side_rate:
        del cfg["same_side_rate"]
    if config.kind == "shapes":
        del cfg["kind"]
    return cfg


def generate(config: WorldConfig, out_dir: str | Path) -> WorldManifest:
    """Write images, annotations and world.json for ``config`` under ``out_dir``."""
    root = Path(out_dir)
    image_dir = root / IMAGE_DIR
    image_dir.mkdir(parents=True, exist_ok=True)
    records = sample_records(config)
    _clear_stale_images(image_dir, {f"{r.image_id}.jpg" for r in records})
    draw = render_open if config.kind == "open" else render
    for r in records:
        pixels = draw(r.scene, config.image_size, r.render_seed)  # type: ignore[arg-type]
        (image_dir / f"{r.image_id}.jpg").write_bytes(encode_jpeg(pixels))

    splits = {s: tuple(r.image_id for r in records if r.split == s) for s in SPLITS}
    annotations = {}
    for s in SPLITS:
        path = annotation_path(root, s)
        _dump(path, _annotations([r for r in records if r.split == s], s))
        annotations[s] = path
    counts = {s: len(splits[s]) for s in SPLITS}
    _dump(
        root / WORLD_JSON,
        {
            "format": FORMAT_VERSION,
            "config": _config_json(config),
            "counts": {
                "images": counts,
                "families": {s: config.families(s) for s in SPLITS},
                "total_images": len(records),
            },
            "vocabulary": open_vocabulary() if config.kind == "open" else _vocabulary(),
            "images": [r.to_json() for r in records],
        },
    )
    return WorldManifest(root, config, tuple(records), splits, annotations)


def load_world(world_dir: str | Path) -> WorldManifest:
    """Read a generated world back from its world.json."""
    root = Path(world_dir)
    data = json.loads((root / WORLD_JSON).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"{root / WORLD_JSON}: unknown format {data.get('format')!r}")
    config = WorldConfig(**{**data["config"], "held_out": tuple(data["config"].get("held_out", ()))})
    records = tuple(ImageRecord.from_json(d) for d in data["images"])
    splits = {s: tuple(r.image_id for r in records if r.split == s) for s in SPLITS}
    annotations = {s: annotation_path(root, s) for s in SPLITS}
    return WorldManifest(root, config, records, splits, annotations)


URL_COLUMNS: tuple[str, ...] = ("url", "caption", "image_id")


def url_rows(world_dir: str | Path, base_url: str, splits: Iterable[str] = SPLITS) -> list[dict[str, str]]:
    """One row per image of ``splits``: url, first caption, image id (generation order)."""
    wanted = set(splits)
    unknown = wanted - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)}")
    base = base_url.rstrip("/")
    world = load_world(world_dir)
    return [
        {"url": f"{base}/{r.image}", "caption": r.captions[0], "image_id": r.image_id}
        for r in world.images
        if r.split in wanted
    ]


def write_url_list(
    world_dir: str | Path,
    base_url: str,
    out_path: str | Path,
    splits: Sequence[str] = SPLITS,
    fmt: str = "tsv",
) -> Path:
    """Write a CC12M-style url list (columns url, caption, image_id) as TSV or Parquet."""
    rows = url_rows(world_dir, base_url, splits)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "tsv":
        with out.open("w", encoding="utf-8", newline="") as f:
            # Captions never contain tabs, newlines or quotes, so no quoting is ever needed;
            # QUOTE_NONE makes any violation fail loudly instead of writing odd quoting.
            w = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar=None)
            w.writerow(URL_COLUMNS)
            for r in rows:
                w.writerow([r[c] for c in URL_COLUMNS])
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: pa.array([r[c] for r in rows], type=pa.string()) for c in URL_COLUMNS})
        pq.write_table(table, out)
    else:
        raise ValueError(f"fmt must be 'tsv' or 'parquet', not {fmt!r}")
    return out
