"""Generate the sample world on disk: images, Karpathy-style annotations, world.json, url lists."""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .pixels import encode_jpeg
from .records import DEFAULT_KIND, IMAGE_DIR, SPLITS, ImageRecord, WorldConfig
from .registry import world_kind

FORMAT_VERSION = "sampleworld/1"
WORLD_JSON = "world.json"
_ID_RE = re.compile(r"^sw_\d{6,}\.jpg$")


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


def _dump(path: Path, obj: Any) -> None:
    # Compact, key order as built, UTF-8: byte-stable for the same content.
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def annotation_path(root: str | Path, split: str) -> Path:
    """Path of the Karpathy-style annotation file of ``split``."""
    return Path(root) / f"flickr30k_{split}.json"


def _annotations(records: Sequence[ImageRecord], split: str, grounding: Callable[[str, Any], list]) -> list[dict[str, Any]]:
    """BLIP/EDJE format: train has one entry per caption, val/test one per image; each caption's grounding
    (the kind's, e.g. sampleworld/grounding.py: word index and object centre) rides along as phrase-box annotations do."""
    if split == "train":
        return [{"image": r.image, "caption": c, "image_id": r.image_id, "grounding": grounding(c, r.scene)}
                for r in records for c in r.captions]
    return [{"image": r.image, "caption": list(r.captions), "image_id": r.image_id,
             "grounding": [grounding(c, r.scene) for c in r.captions]} for r in records]


def sample_records(config: WorldConfig) -> list[ImageRecord]:
    """All image records (scenes, captions, seeds) without touching the disk."""
    kind = world_kind(config.kind)
    if config.image_size < 16:
        raise ValueError("image_size must be >= 16")
    return kind.records(config)


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
    if config.kind == DEFAULT_KIND:
        del cfg["kind"]
    return cfg


def generate(config: WorldConfig, out_dir: str | Path, images: bool = True) -> WorldManifest:
    """Write images, annotations and world.json for ``config`` under ``out_dir`` (``images=False``: no image yet;
    ``draw_images`` draws those a caller needs)."""
    root = Path(out_dir)
    image_dir = root / IMAGE_DIR
    image_dir.mkdir(parents=True, exist_ok=True)
    kind = world_kind(config.kind)
    records = sample_records(config)
    # Without images every earlier one goes: an id drawn for another world would otherwise pass for this one's.
    _clear_stale_images(image_dir, {f"{r.image_id}.jpg" for r in records} if images else set())
    if images:
        for r in records:
            _draw(kind, config, r, image_dir / f"{r.image_id}.jpg")

    splits = {s: tuple(r.image_id for r in records if r.split == s) for s in SPLITS}
    annotations = {}
    for s in SPLITS:
        path = annotation_path(root, s)
        _dump(path, _annotations([r for r in records if r.split == s], s, kind.grounding))
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
            "vocabulary": kind.vocabulary(),
            "images": [r.to_json() for r in records],
        },
    )
    return WorldManifest(root, config, tuple(records), splits, annotations)


def _draw(kind, config: WorldConfig, record: ImageRecord, path: Path) -> None:
    pixels = kind.render(record.scene, config.image_size, record.render_seed)
    path.write_bytes(encode_jpeg(pixels))


def draw_images(world: WorldManifest, image_ids: Iterable[str]) -> int:
    """Draw the named images of a world generated without them (or with some lost); how many were drawn."""
    kind, records, drawn = world_kind(world.config.kind), world.by_id(), 0
    for image_id in image_ids:
        path = world.image_path(image_id)
        if path.exists():
            continue
        # Drawn beside and renamed: a run stopped mid-write leaves no half image that a later run would take as drawn.
        partial = path.with_name(f".{path.name}.partial")
        _draw(kind, world.config, records[image_id], partial)
        os.replace(partial, path)
        drawn += 1
    return drawn


def _read_world_json(root: Path) -> dict:
    """A world.json's contents, its format checked."""
    data = json.loads((root / WORLD_JSON).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"{root / WORLD_JSON}: unknown format {data.get('format')!r}")
    return data


def _config(data: dict) -> WorldConfig:
    return WorldConfig(**{**data["config"], "held_out": tuple(data["config"].get("held_out", ()))})


def load_world_config(world_dir: str | Path) -> WorldConfig:
    """The config a generated world was made with, without building its image records."""
    return _config(_read_world_json(Path(world_dir)))


def load_world(world_dir: str | Path) -> WorldManifest:
    """Read a generated world back from its world.json."""
    root = Path(world_dir)
    data = _read_world_json(root)
    config = _config(data)
    kind = world_kind(config.kind)
    records = tuple(ImageRecord.from_json(d, kind.scene_from_json, kind.swap_from_json) for d in data["images"])
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
