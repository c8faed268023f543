"""The left/right diagnostic of a backbone's towers (benchmarks/orientation_accuracy.py), on images with known answers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orientation_accuracy as oa
import pytest
from PIL import Image

BACKBONE = Path(__file__).resolve().parents[1] / "checkpoints" / "edje-open-convvit-128.safetensors"


def _world(tmp_path: Path) -> Path:
    """Three images: one symmetric left to right (not top to bottom), one dark on its left and light on its right,
    one whose caption has no facing."""
    rng = np.random.default_rng(0)
    half = rng.integers(0, 256, (128, 64, 3), dtype=np.uint8)
    pictures = {"sym.png": np.concatenate([half, half[:, ::-1]], axis=1),
                "any.png": np.repeat(np.linspace(0, 255, 128, dtype=np.uint8)[None, :, None], 128, 0).repeat(3, 2),
                "plain.png": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)}
    for name, pixels in pictures.items():
        Image.fromarray(pixels).save(tmp_path / name)
    entries = [{"image": "sym.png", "caption": ["a left-facing dog above a cat", "a dog"]},
               {"image": "plain.png", "caption": "a dog to the left of a cat"},
               {"image": "any.png", "caption": "a cat facing right beside a dog"}]
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(entries))
    return path


def test_only_captions_with_a_side_of_orientation_are_paired_with_their_flip(tmp_path):
    paths, captions, flips = oa.oriented_pairs(str(_world(tmp_path)), limit=10)
    assert [p.name for p in paths] == ["sym.png", "any.png"]
    assert captions == ["a left-facing dog above a cat", "a cat facing right beside a dog"]
    assert flips == ["a right-facing dog above a cat", "a cat facing left beside a dog"]
    assert oa.oriented_pairs(str(_world(tmp_path)), limit=1)[1] == captions[:1]


def test_a_mirror_symmetric_image_is_its_own_mirror_and_never_wins(tmp_path):
    ann = _world(tmp_path)
    out = tmp_path / "out.json"
    assert oa.main(["--annotations", str(ann), "--pretrained", str(BACKBONE), "--images", "1",
                    "--json", str(out), "--threads", "1"]) == 0
    got = json.loads(out.read_text())
    # The mirror is taken across the width: a left-right symmetric image is unchanged, so it cannot beat its mirror.
    assert got["images"] == 1 and got["image_cosine"] == pytest.approx(1.0, abs=1e-4)
    assert got["image_vs_mirror"] == 0.0 and got["text_cosine"] < 1.0
    both = oa.orientation_accuracy("edje-tiny-convvit-128", str(BACKBONE), str(ann), 10)
    assert both["images"] == 2 and both["image_cosine"] < 1.0 - 1e-4
    assert {both["caption_vs_flip"], both["image_vs_mirror"]} <= {0.0, 50.0, 100.0}


def test_annotations_without_a_side_of_orientation_are_a_clear_error(tmp_path):
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps([{"image": "a.png", "caption": "a dog left of a cat"}]))
    with pytest.raises(ValueError, match="has a side of orientation"):
        oa.orientation_accuracy("edje-tiny-convvit-128", str(BACKBONE), str(ann), 10)
