"""Mirror pairs in backbone training (training/mirror_pairs.py): an image mirrored left-right beside its original,
its caption's horizontal words reversed, each the other's hard negative."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edje.model.image_decode import load_image_files
from edje.sampleworld import generate
from edje.sampleworld.open_world import open_world_config
from edje.schemas.annotations import load_annotations
from edje.training.backbone import BackboneTrainConfig, train_backbone
from edje.training.mirror_pairs import add_mirrors, mirror_pair_mask, mirror_rows, mirrored_captions


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(open_world_config(seed=17, n_train=48, n_val=16, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("open"))


def test_a_caption_is_mirrored_by_its_horizontal_words_alone():
    flipped, ok = mirrored_captions(["a left-facing dog to the left of a red bicycle", "two apples above a car",
                                     "a man left the room", "a rightmost taxi"])
    assert flipped == ["a right-facing dog to the right of a red bicycle", "two apples above a car",
                       "a man left the room", "a leftmost taxi"]
    assert ok.tolist() == [True, False, False, True]


def test_rows_are_drawn_among_mirrorable_captions_only():
    rng = np.random.default_rng(0)
    mirrorable = np.array([True, False, True, True, False, True, True, True])
    rows = mirror_rows(mirrorable, 0.5, rng)
    assert len(rows) == 4 and mirrorable[rows].all() and (np.diff(rows) > 0).all()
    assert mirror_rows(np.array([False, True, False, False]), 1.0, rng).tolist() == [1]
    assert mirror_rows(mirrorable, 0.0, rng).size == 0


def test_the_batch_gains_mirrored_images_with_reversed_captions(world):
    ann = load_annotations(str(world.root / "flickr30k_train.json"))
    flipped, ok = mirrored_captions(ann.captions)
    rows = np.flatnonzero(ok)[:3]
    assert len(rows) == 3, "the open world's captions name sides and facing"
    pixels = torch.from_numpy(load_image_files([ann.image_paths[ann.caption_image[r]] for r in rows[:3]], 64))
    captions = [ann.captions[r] for r in rows[:3]]
    ids = torch.arange(3)[:, None]
    out, out_ids, out_captions, source = add_mirrors(pixels, ids, captions, np.array([0, 2]),
                                                     torch.tensor([[10], [12]]), [flipped[rows[0]], flipped[rows[2]]])
    assert out.shape == (5, 64, 64, 3) and out.dtype == torch.uint8
    assert torch.equal(out[3], pixels[0].flip(1)) and torch.equal(out[4], pixels[2].flip(1))  # left-right
    assert out_ids[:, 0].tolist() == [0, 1, 2, 10, 12]
    assert out_captions[3:] == [flipped[rows[0]], flipped[rows[2]]] and out_captions[3] != captions[0]
    assert source.tolist() == [0, 1, 2, 0, 2]
    pairs = mirror_pair_mask(source)
    assert sorted(map(tuple, pairs.nonzero().tolist())) == [(0, 3), (2, 4), (3, 0), (4, 2)]


def test_training_with_mirror_pairs_runs_and_is_recorded(world, tmp_path):
    torch.set_num_threads(1)
    common = dict(eval_annotations=None, model="edje-tiny-convvit", epochs=1, batch_size=16,
                  world=str(world.root / "world.json"))
    train = str(world.root / "flickr30k_train.json")
    lines = []
    mirrored = BackboneTrainConfig(train, str(tmp_path / "m.safetensors"), mirror_fraction=0.5, **common)
    train_backbone(mirrored, log=lines.append)
    plain = BackboneTrainConfig(train, str(tmp_path / "p.safetensors"), **common)
    train_backbone(plain, log=lambda s: None)
    a, b = load_file(mirrored.output), load_file(plain.output)
    assert not all(torch.equal(a[k], b[k]) for k in a), "the mirrored rows changed nothing"
    assert json.loads((tmp_path / "m.json").read_text())["config"]["mirror_fraction"] == 0.5
    with pytest.raises(ValueError, match="mirror_fraction must be in"):
        BackboneTrainConfig(train, "o", mirror_fraction=1.5)
    with pytest.raises(ValueError, match="mirror pairs and the shape- or colour-only captions"):
        BackboneTrainConfig(train, "o", mirror_fraction=0.5, shape_caption_rate=0.3)
