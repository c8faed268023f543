"""The backbone recipe's caption levers (training/backbone.py): shape-only and colour-only captions,
their positives, the shape-rate schedule, and a short real training run that uses all of them."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from edje.model.backbone_registry import open_clip_registry
from edje.sampleworld import WorldConfig, generate
from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, colour_caption, shape_caption
from edje.training.backbone import BackboneTrainConfig, attribute_set_ids, caption_rates, partial_captions, train_backbone, world_records

open_clip = open_clip_registry()  # with the project's configs (edje-tiny-clip, ...) registered


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(WorldConfig(seed=5, n_train=64, n_val=16, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("world"))


def _words(table):
    return {w for ws in table.values() for w in ws}


def test_colour_captions_name_every_colour_and_nothing_else(world):
    _, scenes = world_records(str(world.root / "world.json"), [r.image_id for r in world.images if r.split == "train"])
    rng = np.random.default_rng(0)
    for sc in scenes:
        text = colour_caption(sc, rng)
        words = re.findall(r"[a-z]+", text)
        named = {c for c, ws in COLOUR_WORDS.items() if any(w in words for w in ws)}
        assert named == {o.colour for o in sc.objects}, text
        assert not any(w in text for w in _words(SHAPE_WORDS)), text
        assert words.count("something") == len(named)
        assert not set(re.findall(r"[a-z]+", shape_caption(sc, rng))) & _words(COLOUR_WORDS)


def test_schedule_moves_the_shape_rate_linearly_and_refuses_rates_over_one():
    cfg = BackboneTrainConfig("t.json", "o", epochs=5, shape_caption_rate=0.8, shape_caption_rate_end=0.4,
                              colour_caption_rate=0.15)
    assert [round(caption_rates(cfg, e)[0], 3) for e in range(5)] == [0.8, 0.7, 0.6, 0.5, 0.4]
    assert caption_rates(cfg, 3)[1] == 0.15
    assert caption_rates(BackboneTrainConfig("t.json", "o", shape_caption_rate=0.3), 7) == (0.3, 0.0)
    with pytest.raises(ValueError, match="sum to <= 1"):
        caption_rates(BackboneTrainConfig("t.json", "o", shape_caption_rate=0.9, colour_caption_rate=0.2), 0)


def test_partial_captions_replace_the_drawn_rows_only(world):
    ids_ = [r.image_id for r in world.images if r.split == "train"]
    _, scenes = world_records(str(world.root / "world.json"), ids_)
    tok = open_clip.get_tokenizer("edje-tiny-convvit")
    full = tok(["a caption"] * len(scenes))
    idx = np.arange(len(scenes))
    ids, shape_rows, colour_rows = partial_captions(full, idx, (0.5, 0.3), scenes, tok, np.random.default_rng(1))
    assert not (shape_rows & colour_rows).any()
    assert 0 < shape_rows.sum() < len(idx) and 0 < colour_rows.sum() < len(idx)
    changed = (ids != full).any(dim=1)
    assert torch.equal(changed, shape_rows | colour_rows)
    colour_sets = attribute_set_ids(scenes, "colour", "cpu")
    same = [j for j in range(len(scenes)) if {o.colour for o in scenes[j].objects} == {o.colour for o in scenes[0].objects}]
    assert (colour_sets[same] == colour_sets[0]).all() and (colour_sets == colour_sets[0]).sum() == len(same)


def test_training_with_shape_and_colour_captions_under_a_schedule(world, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "bb.safetensors"
    cfg = BackboneTrainConfig(str(world.root / "flickr30k_train.json"), str(out), model="edje-tiny-convvit",
                              epochs=2, batch_size=32, eval_every=2, world=str(world.root / "world.json"),
                              shape_caption_rate=0.6, shape_caption_rate_end=0.2, colour_caption_rate=0.3,
                              eval_annotations=str(world.root / "flickr30k_val.json"))
    record = train_backbone(cfg, log=lambda s: None)
    assert [h["caption_rates"] for h in record["history"]] == [[0.6, 0.3], [0.2, 0.3]]
    assert all(np.isfinite(h["loss"]) for h in record["history"]) and record["final_recall"]
    saved = json.loads(out.with_suffix(".json").read_text())["config"]
    assert (saved["shape_caption_rate_end"], saved["colour_caption_rate"]) == (0.2, 0.3)
    with pytest.raises(ValueError, match="need the world's scenes"):
        train_backbone(BackboneTrainConfig(str(world.root / "flickr30k_train.json"), str(out), epochs=1,
                                           colour_caption_rate=0.2), log=lambda s: None)
