"""Orientation negatives in backbone training (training/orientation_negatives.py): a caption's orientation flip as a
false caption of its image, beside mirror pairs, masked over the image's family, recorded with the run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from edje.model.backbone_registry import open_clip_registry
from edje.sampleworld import generate
from edje.sampleworld.open_world import open_world_config
from edje.training.backbone import (
    BackboneTrainConfig,
    load_training_state,
    run_folder,
    train_backbone,
    with_orientation_negatives,
)
from edje.training.caption_rewrites import flip_axis
from edje.training.orientation_negatives import OrientationNegatives

open_clip = open_clip_registry()  # with the project's configs (edje-tiny-clip, ...) registered

CAPTIONS = ["a left-facing dog", "a right-facing dog", "a left-facing cat to the left of a car", "a red car",
            "a right-facing cat"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(open_world_config(seed=17, n_train=48, n_val=16, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("open"))


def test_each_orientation_flip_is_tokenised_and_drawn_by_its_weight():
    tokenizer = open_clip.get_tokenizer("edje-tiny-convvit")
    neg = OrientationNegatives(CAPTIONS, tokenizer, torch.device("cpu"))
    assert neg.flipped == ["a right-facing dog", "a left-facing dog", "a right-facing cat to the left of a car", None,
                           "a left-facing cat"]
    # "left" keys 2, "right" keys 2: balanced; the caption without one never draws.
    assert neg.weight.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert neg.draw(np.arange(5), np.random.default_rng(0)).tolist() == [0, 1, 2, 4]
    assert torch.equal(neg.token_ids(np.array([4, 0])), tokenizer(["a left-facing cat", "a right-facing dog"]))
    assert neg.matches(np.array([0, 2]), ["a right-facing dog", "a left-facing dog", "x"]).tolist() == [
        [True, False], [False, False], [False, False]]
    skewed = OrientationNegatives(["a left-facing dog"] * 3 + ["a right-facing dog"], tokenizer, torch.device("cpu"))
    assert skewed.weight.tolist() == pytest.approx([1 / 3] * 3 + [1.0])


def test_the_flips_are_columns_false_for_their_image_and_true_for_a_mirror_that_shows_them():
    torch.manual_seed(0)
    clip = open_clip.create_model("edje-tiny-convvit")
    tokenizer = open_clip.get_tokenizer("edje-tiny-convvit")
    neg = OrientationNegatives(CAPTIONS, tokenizer, torch.device("cpu"))
    # Original rows 0..3 show captions 0, 2, 3, 4; row 4 is row 0 mirrored (its caption the mirror's flip).
    rows = np.array([0, 2, 3, 4])
    captions = [CAPTIONS[i] for i in rows] + [flip_axis(CAPTIONS[0], "horizontal")]
    source = torch.tensor([0, 1, 2, 3, 0])
    img = F.normalize(torch.randn(5, 128), dim=-1)
    by_image, target = torch.zeros(5, 5), torch.eye(5)
    groups = torch.tensor([7, 8, 8, 8])  # rows 1-3 one family: its other images may show row 1's flip
    txt = F.normalize(clip.encode_text(tokenizer(captions)), dim=-1)
    logits, t, margin = with_orientation_negatives(clip, img, txt, by_image, target, neg, rows, captions, source,
                                                   np.random.default_rng(0), groups)
    assert margin.item() == 0  # no text margin asked
    assert logits.shape == t.shape == (5, 8)  # three flips drawn: rows 0, 1 and 3 (row 2's caption has none)
    extra, extra_t = logits[:, 5:], t[:, 5:]
    # Row 0's flip "a right-facing dog" is its mirror's own caption: a target there, a negative for row 0.
    assert extra_t[:, 0].tolist() == [0, 0, 0, 0, 1] and torch.isfinite(extra[0, 0])
    # Row 1's flip is false for row 1 itself (a negative) and hidden from its family's other images.
    assert torch.isfinite(extra[1, 1]) and torch.isinf(extra[2, 1]) and torch.isinf(extra[3, 1])
    assert torch.isfinite(extra[0, 1]) and extra_t[:, 1].sum() == 0
    clip_logits = clip.logit_scale.exp() * img @ F.normalize(clip.encode_text(tokenizer(["a right-facing dog"])), dim=-1).T
    torch.testing.assert_close(extra[:, :1], clip_logits)
    # Without groups nothing is hidden; with no flip drawn nothing is added.
    logits, _, margin = with_orientation_negatives(clip, img, txt, by_image, target, neg, rows, captions, source,
                                                   np.random.default_rng(0), None, text_margin=-1.0)
    assert torch.isfinite(logits).all()
    # The text margin: each drawn caption's cosine to its flip above the margin, on average, in logit units.
    flips = F.normalize(clip.encode_text(tokenizer([neg.flipped[r] for r in rows[[0, 1, 3]]])), dim=-1)
    cos = (txt[[0, 1, 3]] * flips).sum(-1)
    torch.testing.assert_close(margin, clip.logit_scale.exp() * (cos + 1.0).mean())
    margin.backward()
    assert clip.token_embedding.weight.grad.abs().sum() > 0 and clip.logit_scale.grad is None  # the scale is left alone
    unchanged = with_orientation_negatives(clip, img, txt, by_image, target, neg, np.array([3, 3]), captions[:2],
                                           source[:2], np.random.default_rng(0), None)
    assert unchanged[0] is by_image and unchanged[1] is target and unchanged[2].item() == 0


def test_training_with_orientation_negatives_runs_is_recorded_and_resumes_older_checkpoints(world, tmp_path):
    torch.set_num_threads(1)
    train = str(world.root / "flickr30k_train.json")
    common = dict(eval_annotations=None, model="edje-tiny-convvit", epochs=1, batch_size=16, mirror_fraction=0.5,
                  world=str(world.root / "world.json"))
    oriented = BackboneTrainConfig(train, str(tmp_path / "o.safetensors"), orientation_negatives=True,
                                   orientation_text_margin=0.5, **common)
    train_backbone(oriented, log=lambda s: None)
    plain = BackboneTrainConfig(train, str(tmp_path / "p.safetensors"), storage_path=str(tmp_path / "runs"), **common)
    train_backbone(plain, log=lambda s: None)
    a, b = load_file(oriented.output), load_file(plain.output)
    assert not all(torch.equal(a[k], b[k]) for k in a), "the orientation negatives changed nothing"
    recorded = json.loads((tmp_path / "o.json").read_text())["config"]
    assert recorded["orientation_negatives"] is True and recorded["orientation_text_margin"] == 0.5
    with pytest.raises(ValueError, match="set orientation_negatives"):
        BackboneTrainConfig(train, "o", orientation_text_margin=0.5)
    # A checkpoint written before the option existed resumes as a run with its default, and only so.
    folder = run_folder(plain)
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    del state["config"]["orientation_negatives"]
    torch.save(state, folder / "checkpoint.pt")
    assert load_training_state(folder, plain)["step"] == state["step"]
    with pytest.raises(ValueError, match="orientation_negatives: False there, True now"):
        load_training_state(folder, BackboneTrainConfig(train, plain.output, storage_path=plain.storage_path,
                                                        orientation_negatives=True, **common))


def test_the_rerankers_orientation_objective_scores_each_flip_on_the_same_image_and_trains_the_encoder():
    from test_word_align import _batch, _model

    from edje.training.caption_rewrites import ORIENTATION, VERTICAL, FlipBalance, flip_orientation
    from edje.training.objectives import EDJEObjectives

    torch.manual_seed(0)
    model = _model().eval()
    captions = ["a left-facing dog to the left of a cat", "a right-facing dog", "a red circle to the left of a star"]
    batch, neg = _batch(captions)
    balance = FlipBalance(captions + ["a right-facing dog to the left of a cat"], ORIENTATION)
    objectives = EDJEObjectives(model, ("itm", "orientation"), {"orientation": 2.0}, orientation_balance=balance)
    out = objectives(batch, neg)
    assert torch.isfinite(out["loss_orientation"]) and 0 <= out["orientation_acc"] <= 1
    assert out["loss"].item() == pytest.approx(out["loss_itm"].item() + 2 * out["loss_orientation"].item(), rel=1e-5)
    # The loss is the balance-weighted two-way cross-entropy of each caption against its flip on the same image
    # (the third caption has no side of orientation; its side of place is not flipped).
    pos = model.adapter(batch.tokens)
    true_l = model.encoder.score(captions[:2], pos[:2])
    flip_l = model.encoder.score([flip_orientation(c) for c in captions[:2]], pos[:2])
    w = torch.tensor([balance.weight(c) for c in captions[:2]])
    assert w.tolist() == [1.0, 0.5]  # one "left" key and two "right" ones: the more frequent side weighs less
    expected = (w * F.softplus(flip_l - true_l)).sum() / w.sum()
    assert out["loss_orientation"].item() == pytest.approx(expected.item(), rel=1e-4)
    out["loss_orientation"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    with pytest.raises(ValueError, match="ORIENTATION"):
        EDJEObjectives(model, ("itm", "orientation"), {}, orientation_balance=FlipBalance(captions, VERTICAL))
    with pytest.raises(ValueError, match="itm"):
        EDJEObjectives(model, ("mlm", "orientation"), {}, orientation_balance=balance)
