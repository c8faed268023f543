"""Karpathy-style annotation files (Flickr30k / COCO, BLIP format) as images + captions.

Two shapes are accepted: one entry per caption (`{"image", "caption": str, "image_id"}`, the
train split) and one entry per image (`{"image", "caption": [str, ...], "image_id"}`, val/test).
Image paths are relative to the JSON file's folder. Training, evaluation and the serving miner all
read them (the sample world writes them), so the reader sits with the other formats that cross a boundary.

One id rule for every reader (`image_id_of`): an entry's `image_id` when it has one, else its `image`
path exactly as the file writes it (e.g. "images/0001.jpg", not the stem), so the same file gives the
same ids in evaluation, training and the miner.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List

import numpy as np


@dataclass(frozen=True)
class Annotations:
    """Images (ids, files) and all their captions, flattened, with the image each caption describes."""

    path: Path
    image_ids: List[str]
    image_paths: List[Path]
    captions: List[str]
    caption_image: np.ndarray  # [num_captions] index into image_ids

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    def captions_of(self, image_index: int) -> List[str]:
        """All captions of one image, in file order."""
        return [self.captions[j] for j in np.flatnonzero(self.caption_image == image_index)]

    def image_to_captions(self) -> List[np.ndarray]:
        """For each image, the indices of its captions."""
        order = np.argsort(self.caption_image, kind="stable")
        bounds = np.searchsorted(self.caption_image[order], np.arange(self.num_images + 1))
        return [order[bounds[i]:bounds[i + 1]] for i in range(self.num_images)]


def image_id_of(entry: dict) -> str:
    """The id of an annotation entry's image: its `image_id`, else its `image` path as written."""
    return str(entry.get("image_id", entry["image"]))


def read_entries(path: str | Path) -> list:
    """The entries of an annotation JSON on any fsspec path; ValueError unless a non-empty list."""
    import fsspec

    with fsspec.open(str(path), "r", encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty JSON list of annotation entries")
    return entries


def load_annotations(path: str | Path) -> Annotations:
    """Read a Karpathy/BLIP annotation JSON; raises ValueError naming the first malformed entry."""
    entries = read_entries(path)
    path = Path(path)
    index: dict = {}
    image_ids: List[str] = []
    image_paths: List[Path] = []
    captions: List[str] = []
    owner: List[int] = []
    for n, e in enumerate(entries):
        if not isinstance(e, dict) or "image" not in e or "caption" not in e:
            raise ValueError(f"{path}: entry {n} needs 'image' and 'caption', got {str(e)[:120]}")
        key = image_id_of(e)
        if key not in index:
            index[key] = len(image_ids)
            image_ids.append(key)
            image_paths.append(path.parent / e["image"])
        caps = e["caption"] if isinstance(e["caption"], list) else [e["caption"]]
        for c in caps:
            if not isinstance(c, str) or not c.strip():
                raise ValueError(f"{path}: entry {n} has an empty or non-string caption")
            captions.append(c)
            owner.append(index[key])
    return Annotations(path, image_ids, image_paths, captions, np.asarray(owner, dtype=np.int64))


def load_grounding(path: str | Path) -> dict:
    """{(image id, caption): float32 [words, 3] of (word index, centre x, centre y)} from an annotation file whose
    entries carry `grounding` (one list per caption, as `caption` is a string or a list); ValueError if none does."""
    out: dict = {}
    for n, e in enumerate(read_entries(path)):
        if "grounding" not in e:
            continue
        caps = e["caption"] if isinstance(e["caption"], list) else [e["caption"]]
        grounds = e["grounding"] if isinstance(e["caption"], list) else [e["grounding"]]
        if len(grounds) != len(caps):
            raise ValueError(f"{path}: entry {n} has {len(caps)} captions but {len(grounds)} groundings")
        for c, g in zip(caps, grounds):
            rows = np.asarray(g, dtype=np.float32).reshape(-1, 3)
            if len(rows) and not (rows[:, 0] >= 0).all():
                raise ValueError(f"{path}: entry {n} grounds a negative word index")
            out[(image_id_of(e), c)] = rows
    if not out:
        raise ValueError(f"{path}: no entry carries 'grounding' (word index, centre x, centre y per grounded word)")
    return out
