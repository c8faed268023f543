"""Relations from captions alone, in the training path: the flip square's labels, FlipBalance's weights in the loss,
the pointer learning where a phrase's object is from the tokens, and a pointer checkpoint that scores with the
tokenizer, the rule of English and the model (no world's word list)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import TINY_BERT

from edje.model.edje import load_checkpoint, read_checkpoint_config
from edje.schemas.token_table import TableMetadata
from edje.training.batches import TrainBatch
from edje.training.caption_rewrites import HORIZONTAL, VERTICAL, FlipBalance, flip_axis
from edje.training.config import ModelSpec, TrainJobConfig
from edje.training.loop import Position, build_optimizer, save_training_checkpoint
from edje.training.losses import pointer_order_loss
from edje.training.model_init import build_model, with_relations
from edje.training.negatives import Negatives
from edje.training.objectives import EDJEObjectives

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=16,
                     width=32, quantization="fp16", embed_dim=16)
TINY = tuple(sorted(TINY_BERT.items()))
POINTER = dict(relation_roles=True, role_parse="english", route_layer=1, pointer=True, image_positions="fixed")


def _model(**relations):
    return build_model(ModelSpec(adapter="local", adapter_hidden=64, bert_config=TINY, **relations), META)


def _sp(x: float) -> float:
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------------------------------- the flip square
CAPTIONS = ["a red circle left of a blue square",  # horizontal, mirror known: the square
            "a green star to the right of a cat",  # horizontal, no mirror: nothing
            "a red circle above a blue square",  # vertical: caption-side, weight 1/3 (3 above : 1 below)
            "a blue square below a red circle",  # vertical: weight 1
            "a yellow star"]  # no spatial word: nothing
HAS_MIRROR = [True, False, True, True, True]
TRUE_SCORE = [2.0, 2.0, 0.0, 2.0, 2.0]  # logit of each row's true pairs (false pairs: 0)


def _batch() -> tuple[TrainBatch, Negatives]:
    """Image i's tokens are all i + 1, its mirror's -(i + 1): the fake scorer below reads which image it got."""
    b, n, d = len(CAPTIONS), META.num_tokens, META.width
    ident = torch.arange(1, b + 1, dtype=torch.float32)[:, None, None].expand(b, n, d)
    batch = TrainBatch([f"i{k}" for k in range(b)], list(CAPTIONS), ident.clone(), torch.zeros(b, 16),
                       torch.zeros(b, 16), mirror_tokens=-ident.clone(), has_mirror=torch.tensor(HAS_MIRROR))
    others = [(k + 1) % b for k in range(b)]
    return batch, Negatives(ident[others][:, None].clone(), [[CAPTIONS[j]] for j in others])


def _fake_scorer(calls: list, sees_mirror: bool):
    """ITM logits by the truth of each pair: image i (or its mirror) with caption i (or its horizontal flip).
    `sees_mirror=False`: a model that cannot tell an image from its mirror."""
    def score(texts, images):
        calls.append([(t, int(v)) for t, v in zip(texts, images[:, 0, 0].tolist())])
        out = []
        for t, v in zip(texts, images[:, 0, 0].tolist()):
            i = abs(int(v)) - 1
            mirrored = v < 0 and sees_mirror
            true = t == (flip_axis(CAPTIONS[i], HORIZONTAL) if mirrored else CAPTIONS[i])
            out.append(TRUE_SCORE[i] if true else 0.0)
        return torch.tensor(out, requires_grad=True)
    return score


def _square_terms(sees_mirror: bool):
    model = _model()
    model.adapter = torch.nn.Identity()  # the image's identity reaches the scorer as it is
    calls: list = []
    model.encoder.score = _fake_scorer(calls, sees_mirror)
    balance = FlipBalance(["a red circle above a blue square"] * 3 + ["a blue square below a red circle"], VERTICAL)
    objectives = EDJEObjectives(model, ("itm", "flip"), {}, flip_mode="square", flip_balance=balance)
    batch, neg = _batch()
    return objectives(batch, neg), calls


def test_flip_square_labels_and_vertical_weights_on_a_hand_made_batch():
    out, calls = _square_terms(sees_mirror=True)
    square = calls[-1]  # the square's and the vertical flips' pairs, scored in one pass after ITM's
    assert square == [("a red circle right of a blue square", 1), ("a red circle right of a blue square", -1),
                      ("a red circle left of a blue square", -1), ("a red circle below a blue square", 3),
                      ("a blue square above a red circle", 4)]
    # Every comparison of the square right: true pairs at 2, false at 0.
    assert out["loss_flip_square"].item() == pytest.approx(_sp(-2.0))
    # FlipBalance: "above" (3 of 4 captions) weighs 1/3, "below" 1; row 2 ties (CE ln 2), row 3 wins by 2.
    weighted = (math.log(2) / 3 + _sp(-2.0)) / (1 / 3 + 1)
    assert out["loss_flip_vertical"].item() == pytest.approx(weighted)
    assert weighted != pytest.approx((math.log(2) + _sp(-2.0)) / 2)  # the weights change the loss
    assert out["loss_flip"].item() == pytest.approx(_sp(-2.0) + weighted)
    assert float(out["flip_acc"]) == pytest.approx(5 / 6)

    # A model blind to the mirror takes (mirror I, c) for true: the square marks it wrong in three of four directions.
    blind, _ = _square_terms(sees_mirror=False)
    assert blind["loss_flip_square"].item() == pytest.approx((_sp(-2.0) + _sp(2.0) + 2 * math.log(2)) / 4)


def test_caption_side_flips_are_weighted_by_the_training_captions_balance():
    model = _model()
    model.adapter = torch.nn.Identity()
    calls: list = []
    model.encoder.score = _fake_scorer(calls, sees_mirror=True)
    # Horizontal: 4 "left" for 2 "right"; vertical: 3 "above" for 1 "below" (as the square's test).
    balance = FlipBalance(CAPTIONS + CAPTIONS[:1] * 3 + ["a red circle right of a blue square"] + CAPTIONS[2:3] * 2,
                          axis=None)
    out = EDJEObjectives(model, ("itm", "flip"), {}, flip_mode="caption", flip_balance=balance)(*_batch())
    # Row 0 ("left") weighs 2/4, row 1 ("right") 1; row 2 ("above") 1/3, row 3 ("below") 1.
    assert calls[-1] == [("a red circle right of a blue square", 1), ("a green star to the left of a cat", 2),
                         ("a red circle below a blue square", 3), ("a blue square above a red circle", 4)]
    # Rows 0, 1 and 3 win by 2 (softplus(-2)); row 2 ties (ln 2) at weight 1/3.
    weights = [0.5, 1.0, 1 / 3, 1.0]
    expected = (sum(weights) - 1 / 3) * _sp(-2.0) / sum(weights) + (1 / 3) * math.log(2) / sum(weights)
    assert out["loss_flip"].item() == pytest.approx(expected)
    assert float(out["flip_acc"]) == pytest.approx(3 / 4)
    for wrong in (None, FlipBalance(CAPTIONS, VERTICAL)):
        with pytest.raises(ValueError, match="axis None"):
            EDJEObjectives(_model(), ("itm", "flip"), {}, flip_mode="caption", flip_balance=wrong)


def test_flip_square_needs_a_vertical_flip_balance():
    with pytest.raises(ValueError, match="FlipBalance"):
        EDJEObjectives(_model(), ("itm", "flip"), {}, flip_mode="square")
    with pytest.raises(ValueError, match="flip objective"):
        TrainJobConfig(tables=[], storage_path="s", name="n", objectives=("itm",), flip_mode="square")


# ---------------------------------------------------------------------------------------- the pointer
PHRASES = ["red circle", "blue square", "green star", "yellow heart"]
RELATIONS = {"left_of": "to the left of", "right_of": "to the right of", "above": "above", "below": "below"}


def _scenes(rng: np.random.Generator, features: np.ndarray, n: int):
    """Captions "a S <relation> a O" and 4x4 cell tokens with S's and O's features in cells that make it true."""
    caps, tokens = [], np.zeros((n, 16, META.width), np.float32)
    tokens += rng.normal(0, 0.1, tokens.shape).astype(np.float32)
    for b in range(n):
        s, o = rng.choice(len(PHRASES), 2, replace=False)
        rel = list(RELATIONS)[rng.integers(4)]
        while True:
            (rs, cs), (ro, co) = rng.integers(0, 4, 2), rng.integers(0, 4, 2)
            if {"left_of": cs < co, "right_of": cs > co, "above": rs < ro, "below": rs > ro}[rel]:
                break
        tokens[b, 4 * rs + cs] += features[s]
        tokens[b, 4 * ro + co] += features[o]
        caps.append(f"a {PHRASES[s]} {RELATIONS[rel]} a {PHRASES[o]}")
    return caps, torch.from_numpy(tokens)


def test_pointer_learns_where_a_phrase_is_from_the_tokens():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    features = rng.normal(0, 3, (len(PHRASES), META.width)).astype(np.float32)
    model = _model(**POINTER)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def step(caps, tokens):
        xy, valid, orders = model.encoder.pointer_readout(caps, model.adapter(tokens))
        return pointer_order_loss(xy, valid, orders, 10.0)

    held_out = _scenes(np.random.default_rng(1), features, 64)
    with torch.no_grad():
        before, acc_before = step(*held_out)
    for _ in range(40):
        loss, _ = step(*_scenes(rng, features, 32))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after, acc_after = step(*held_out)
    # The phrases' own words name no side (each is subject and object of every relation), so only the cells
    # holding their features can put them in order.
    assert float(before) > 0.6 and float(acc_before) < 0.75
    assert float(after) < 0.5 * float(before) and float(acc_after) >= 0.9


def test_pointer_order_loss_reads_each_relations_axis_and_sign():
    xy = torch.tensor([[[0.2, 0.9], [0.0, 0.0], [0.8, 0.1], [0.0, 0.0]]])  # subject left and below its object
    valid = torch.tensor([[True, False, True, False]])
    left = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    above = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]])
    loss, acc = pointer_order_loss(xy, valid, left, 10.0)
    assert float(loss) == pytest.approx(_sp(-6.0), rel=1e-5) and float(acc) == 1.0
    loss, acc = pointer_order_loss(xy, valid, above, 10.0)
    assert float(loss) == pytest.approx(_sp(8.0), rel=1e-5) and float(acc) == 0.0
    none, acc = pointer_order_loss(xy, torch.zeros_like(valid), left, 10.0)
    assert float(none) == 0.0 and acc is None


# ---------------------------------------------------------------------------------------- the checkpoint
SCORE = """
import importlib.abc, json, sys
class NoWorld(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[:2] == ["edje", "sampleworld"]:
            raise ImportError("scoring must not read any world: " + name)
sys.meta_path.insert(0, NoWorld())
import torch
from edje.model.edje import load_checkpoint
model = load_checkpoint(sys.argv[1])
torch.manual_seed(0)
caps = json.loads(sys.argv[2])
with torch.no_grad():
    print(json.dumps(model.score_backbone_tokens(caps, torch.randn(len(caps), 16, 32)).tolist()))
print(sorted(m for m in sys.modules if "sampleworld" in m))
"""


def test_a_pointer_checkpoint_scores_without_any_world_vocabulary(tmp_path):
    torch.manual_seed(0)
    model = _model(**POINTER)
    job = TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "pointer"))
    objectives = EDJEObjectives(model, job.objectives, {})
    opt = build_optimizer(objectives, job)
    caps, tokens = _scenes(np.random.default_rng(0), np.random.default_rng(1).normal(0, 3, (4, 32)).astype(np.float32), 4)
    batch = TrainBatch([f"i{k}" for k in range(4)], caps, tokens, torch.zeros(4, 16), torch.zeros(4, 16))
    neg = Negatives(tokens[[1, 2, 3, 0]][:, None].clone(), [[caps[j]] for j in (1, 2, 3, 0)])
    for _ in range(2):
        out = objectives(batch, neg)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    assert "loss_pointer" in out and out["loss_pointer"].item() > 0
    path = str(tmp_path / "ck")
    save_training_checkpoint(model, opt, Position(step=2), {}, path, job)
    saved = read_checkpoint_config(path)
    enc = saved["config"]["encoder"]
    assert enc["role_vocabulary"] is None and enc["pointer"] and enc["relation_roles"] and enc["route_layer"] == 1
    assert saved["training"]["objectives"] == ["itm", "pointer"] and saved["training"]["flip_mode"] == "caption"

    texts = ["a dog sitting to the left of a red bicycle", "a red bicycle to the left of a dog sitting",
             "a man left the room"]
    run = subprocess.run([sys.executable, "-c", SCORE, path, json.dumps(texts)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    scores_line, modules_line = run.stdout.strip().splitlines()[-2:]
    assert modules_line == "[]"
    loaded = load_checkpoint(path)
    torch.manual_seed(0)
    with torch.no_grad():
        here = loaded.score_backbone_tokens(texts, torch.randn(3, 16, 32))
    np.testing.assert_allclose(json.loads(scores_line), here.numpy(), rtol=1e-5, atol=1e-6)
    # The pointer is on the scoring path: its map of x_hat changes the scores.
    with torch.no_grad():
        loaded.encoder.pointer.inject.weight.zero_()
        torch.manual_seed(0)
        assert not torch.allclose(loaded.score_backbone_tokens(texts, torch.randn(3, 16, 32)), here)
    # A compressed student takes the encoder without the pointer (its tokens keep no cell grid), roles by the rule.
    student = build_model(ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=64, adapter_heads=4,
                                    relation_roles=True, role_parse="english", route_layer=1), META,
                          init_encoder_from=path)
    assert not student.config.encoder.pointer and student.config.encoder.role_vocabulary is None
    assert torch.equal(student.encoder.route.weight, loaded.encoder.route.weight)


def test_a_warm_start_gains_the_rule_and_a_pointer_that_starts_away_from_zero():
    assert _model(relation_roles=True, route_layer=1).config.encoder.role_vocabulary is None  # a new model: the rule
    vocab = _model(relation_roles=True, route_layer=1, image_positions="fixed", role_parse="vocabulary")
    assert vocab.config.encoder.role_vocabulary  # the diagnostic parse's word list, on request
    grown = with_relations(vocab, ModelSpec(role_parse="english", pointer=True))
    enc = grown.encoder.config
    assert enc.role_vocabulary is None and enc.pointer and enc.relation_roles
    assert grown.encoder.pointer.inject.weight.std().item() > 0.5
    kept = with_relations(grown, ModelSpec(relation_roles=True))  # --relation-roles alone keeps the checkpoint's rule
    assert kept.config.encoder.role_vocabulary is None
    with pytest.raises(ValueError, match="local adapter"):
        build_model(ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=64, adapter_heads=4,
                              bert_config=TINY, **POINTER), META)
