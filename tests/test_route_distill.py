"""Route-input distillation: the route's inputs read from one pass (after the pointer's addition), the relative
squared error to the teacher's, its gradient into the student's adapter, its mirrored form (the change from an image
to its mirror), and the config's checks."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_BERT

from edje.model.relation_roles import MAX_RELATIONS
from edje.schemas.token_table import TableMetadata
from edje.training.batches import TrainBatch
from edje.training.caption_rewrites import VERTICAL, FlipBalance
from edje.training.config import ModelSpec, TrainJobConfig
from edje.training.losses import route_distillation_loss
from edje.training.model_init import build_model
from edje.training.negatives import Negatives
from edje.training.objectives import EDJEObjectives, teacher_scores

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=16,
                     width=32, quantization="fp16", embed_dim=16)
TINY = tuple(sorted(TINY_BERT.items()))
ROUTE = dict(relation_roles=True, role_parse="english", route_layer=1)
POINTER = dict(ROUTE, pointer=True, image_positions="fixed")
CAPTIONS = ["a red circle left of a blue square", "a red circle", "a green star above a yellow heart"]


def _model(adapter: str = "local", **relations):
    """A tiny random EDJE model (local adapter: 16 cell tokens; compressed: 4 queries)."""
    return build_model(ModelSpec(adapter=adapter, num_queries=4, adapter_hidden=64, bert_config=TINY, **relations), META)


def _images(model, n: int, seed: int = 0) -> torch.Tensor:
    """The adapter's output for n random raw token matrices."""
    g = torch.Generator().manual_seed(seed)
    return model.adapter(torch.randn(n, META.num_tokens, META.width, generator=g))


@torch.no_grad()
def _encoder_and_images(**relations):
    """A tiny random model's joint encoder (eval mode) and its adapter's output for the captions' images."""
    torch.manual_seed(0)
    model = _model(**relations).eval()
    return model.encoder, _images(model, len(CAPTIONS))


def _batch(n: int = 2):
    """A batch of n relation captions (the first horizontal, the second vertical) with k = 1 negative per direction,
    each image with a mirrored copy (other random tokens: the teacher tells them apart by position)."""
    caps = [CAPTIONS[0], CAPTIONS[2]][:n]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randn(n, META.num_tokens, META.width, generator=g)
    batch = TrainBatch([f"i{k}" for k in range(n)], caps, tokens, torch.zeros(n, 16), torch.zeros(n, 16),
                       mirror_tokens=torch.randn(n, META.num_tokens, META.width, generator=g),
                       has_mirror=torch.ones(n, dtype=torch.bool))
    others = [(k + 1) % n for k in range(n)]
    return batch, Negatives(tokens[others][:, None].clone(), [[caps[j]] for j in others])


# ---------------------------------------------------------------------------------------- score_and_route
def test_score_and_route_gives_the_scores_and_each_relation_slots_input():
    enc, images = _encoder_and_images(**ROUTE)
    with torch.no_grad():
        logits, inputs, valid = enc.score_and_route(CAPTIONS, images)
        plain = enc.score(CAPTIONS, images)
    assert torch.allclose(logits, plain, atol=1e-6)
    assert inputs.shape == (len(CAPTIONS), MAX_RELATIONS, enc.hidden_size) and valid.shape == (len(CAPTIONS), MAX_RELATIONS)
    assert valid.dtype == torch.bool
    assert valid[:, 0].tolist() == [True, False, True]  # "a red circle": no relation
    assert not valid[:, 1:].any()  # one relation per caption: the second slot is empty
    assert inputs[0, 0].norm() > 0 and inputs[1].abs().max() == 0
    # Nothing kept alive once the pass is read, nor by an ordinary pass.
    assert enc._pass.route_inputs is None and enc._pass.route_valid is None and not enc._pass.want_route


def test_score_and_route_needs_a_route():
    model = _model()
    with pytest.raises(ValueError, match="no route"):
        model.encoder.score_and_route(CAPTIONS[:1], _images(model, 1))


def test_the_route_input_is_read_after_the_pointers_addition():
    enc, images = _encoder_and_images(**POINTER)
    with torch.no_grad():
        _, with_pointer, valid = enc.score_and_route(CAPTIONS, images)
        batch = enc._pair_batch(CAPTIONS, images.shape[1], images.device)
        pointer = enc._pointer_states(batch, images)
        enc._pointer_states = lambda b, t: torch.zeros_like(pointer)  # the same pass without the pointer's addition
        _, without, _ = enc.score_and_route(CAPTIONS, images)
    roles = batch.roles.to(pointer.dtype)
    sub, obj = roles[..., 1::3], roles[..., 2::3]

    def mean(w):
        return torch.einsum("btk,bth->bkh", w, pointer) / w.sum(1).clamp_min(1)[..., None]
    # Route layer 1 is the last layer the pointer's addition can reach, so the difference is exactly its share.
    assert (with_pointer - without)[valid].abs().max() > 1e-3
    assert torch.allclose(with_pointer - without, mean(sub) - mean(obj), atol=1e-5)


# ---------------------------------------------------------------------------------------- the loss
def test_route_distillation_loss_is_a_relative_error_over_slots_valid_in_both():
    teacher = torch.tensor([[[3.0, 4.0], [1.0, 0.0]], [[0.0, 2.0], [5.0, 5.0]]])
    both = torch.ones(2, 2, dtype=torch.bool)
    assert route_distillation_loss(teacher.clone(), teacher, both, both).item() == 0.0
    student = teacher.clone()
    student[0, 0] = torch.tensor([0.0, 0.0])  # error 25 / 25 = 1 on one slot of four
    assert route_distillation_loss(student, teacher, both, both).item() == pytest.approx(0.25, rel=1e-5)
    assert route_distillation_loss(10 * student, 10 * teacher, both, both).item() == pytest.approx(0.25, rel=1e-5)
    student[1, 1] = torch.tensor([100.0, -100.0])  # a slot invalid on either side is left out
    teacher_valid = both.clone()
    teacher_valid[1, 1] = False
    assert route_distillation_loss(student, teacher, both, teacher_valid).item() == pytest.approx(1 / 3, rel=1e-5)
    assert route_distillation_loss(student, teacher, teacher_valid, both).item() == pytest.approx(1 / 3, rel=1e-5)
    none = torch.zeros(2, 2, dtype=torch.bool)
    x = student.clone().requires_grad_(True)
    zero = route_distillation_loss(x, teacher, none, both)
    assert zero.item() == 0.0 and zero.requires_grad


@pytest.mark.parametrize("objectives", [("itm", "route_distill"), ("route_distill",)])
def test_route_distillation_trains_the_students_adapter(objectives):
    torch.manual_seed(0)
    teacher = _model(**POINTER).eval().requires_grad_(False)
    student = _model("compressed", **ROUTE)
    batch, neg = _batch()
    t_logits, t_route = teacher_scores(teacher, batch, neg, route=True)
    assert torch.equal(t_logits, teacher_scores(teacher, batch, neg)[0])  # the same teacher pass as plain scoring
    assert t_route.inputs.shape == (len(batch), MAX_RELATIONS, student.encoder.hidden_size)
    assert t_route.valid[:, 0].all() and t_route.mirror_inputs is None
    out = EDJEObjectives(student, objectives, {"route_distill": 1.0})(batch, neg, t_logits, t_route)
    loss = out["loss_route_distill"]
    assert loss.item() > 0
    loss.backward()
    grads = [p.grad for p in student.adapter.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="route inputs"):
        EDJEObjectives(student, objectives, {})(batch, neg, t_logits)


# ---------------------------------------------------------------------------------------- the mirrored form
SQUARE = dict(flip_mode="square", flip_balance=FlipBalance([CAPTIONS[2], "a yellow heart below a green star"], VERTICAL))


def test_mirrored_route_distillation_regresses_the_change_from_image_to_mirror():
    torch.manual_seed(0)
    teacher = _model(**POINTER).eval().requires_grad_(False)
    batch, neg = _batch()
    t_logits, t_route = teacher_scores(teacher, batch, neg, route=True, mirror=True)
    # The teacher's own pass on the mirrored images, caption by caption, in the batch's order.
    with torch.no_grad():
        _, inputs, valid = teacher.encoder.score_and_route(list(batch.captions), teacher.adapter(batch.mirror_tokens))
    assert torch.equal(t_route.mirror_inputs, inputs) and torch.equal(t_route.mirror_valid, valid)
    assert (t_route.inputs - t_route.mirror_inputs)[t_route.valid].abs().max() > 1e-3  # positions move with the image
    objectives = ("itm", "flip", "distill", "route_mirror")
    # A student that is the teacher has nothing to learn; only the horizontal row (the square's) is read.
    copy = EDJEObjectives(_model(**POINTER).eval(), objectives, {}, **SQUARE)
    copy.model.load_state_dict(teacher.state_dict())
    assert copy(batch, neg, t_logits, t_route)["loss_route_mirror"].item() == pytest.approx(0.0, abs=1e-10)
    # A compressed student: the relative error of its own change against the teacher's, on row 0, with a gradient
    # into its adapter.
    student = _model("compressed", **ROUTE).eval()  # no dropout: the two passes below are the same as the loss's
    out = EDJEObjectives(student, objectives, {}, **SQUARE)(batch, neg, t_logits, t_route)
    with torch.no_grad():
        s_pos = student.encoder.score_and_route(list(batch.captions[:1]), student.adapter(batch.tokens[:1]))[1]
        s_mir = student.encoder.score_and_route(list(batch.captions[:1]), student.adapter(batch.mirror_tokens[:1]))[1]
    expected = route_distillation_loss(s_pos - s_mir, t_route.inputs[:1] - t_route.mirror_inputs[:1],
                                       t_route.valid[:1], t_route.valid[:1])
    assert out["loss_route_mirror"].item() == pytest.approx(expected.item(), rel=1e-4) and expected.item() > 0
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.adapter.parameters())
    with pytest.raises(ValueError, match="mirrored images"):
        EDJEObjectives(student, objectives, {}, **SQUARE)(batch, neg, *teacher_scores(teacher, batch, neg, route=True))


def test_mirrored_route_distillation_needs_the_flip_square():
    with pytest.raises(ValueError, match="flip_mode 'square'"):
        EDJEObjectives(_model("compressed", **ROUTE), ("itm", "flip", "route_mirror"), {},
                       flip_balance=FlipBalance(CAPTIONS, axis=None))
    with pytest.raises(ValueError, match="flip_mode 'square'"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "flip", "route_mirror"),
                       teacher_checkpoint="teacher", model=ModelSpec(**ROUTE))
    with pytest.raises(ValueError, match="route_mirror objective needs teacher_checkpoint"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "flip", "route_mirror"),
                       flip_mode="square", model=ModelSpec(**ROUTE))


# ---------------------------------------------------------------------------------------- the config
def test_route_distill_needs_a_teacher_and_a_route():
    with pytest.raises(ValueError, match="route_distill objective needs teacher_checkpoint"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "route_distill"),
                       model=ModelSpec(**ROUTE))
    with pytest.raises(ValueError, match="route_layer"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "route_distill"),
                       teacher_checkpoint="teacher")
    job = TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "route_distill"),
                         teacher_checkpoint="teacher", model=ModelSpec(**ROUTE), loss_weights=(("route_distill", 0.5),))
    assert job.weight("route_distill") == 0.5
    with pytest.raises(ValueError, match="route_layer"):
        EDJEObjectives(_model("compressed"), ("itm", "route_distill"), {})
