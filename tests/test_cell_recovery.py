"""Cell recovery: a compressed student's training head rebuilds its local teacher's cell tokens from the compressed
ones, so its tokens must keep what is where; the teacher's cells come from the same teacher pass as its logits."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_BERT

from edje.schemas.config import AdapterConfig
from edje.schemas.token_table import TableMetadata
from edje.training.batches import TrainBatch
from edje.training.config import ModelSpec, TrainJobConfig
from edje.training.losses import relative_squared_error
from edje.training.model_init import build_model
from edje.training.negatives import Negatives
from edje.training.objectives import EDJEObjectives, teacher_scores

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=16,
                     width=32, quantization="fp16", embed_dim=16)
TINY = tuple(sorted(TINY_BERT.items()))


def _model(adapter: str, **spec):
    return build_model(ModelSpec(adapter=adapter, num_queries=4, adapter_hidden=64, bert_config=TINY, **spec), META)


def _batch(n: int = 3):
    g = torch.Generator().manual_seed(1)
    caps = ["a red circle left of a blue square", "a green star", "two yellow hearts"][:n]
    tokens = torch.randn(n, META.num_tokens, META.width, generator=g)
    batch = TrainBatch([f"i{k}" for k in range(n)], caps, tokens, torch.zeros(n, 16), torch.zeros(n, 16))
    others = [(k + 1) % n for k in range(n)]
    return batch, Negatives(tokens[others][:, None].clone(), [[caps[j]] for j in others])


def test_relative_squared_error():
    target = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    assert relative_squared_error(target.clone(), target).item() == 0.0
    # Row errors 25/25 and 1/4: mean 0.625, whatever the scale.
    predicted = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    assert relative_squared_error(predicted, target).item() == pytest.approx(0.625, rel=1e-5)
    assert relative_squared_error(3 * predicted, 3 * target).item() == pytest.approx(0.625, rel=1e-5)
    with pytest.raises(ValueError, match="differ"):
        relative_squared_error(predicted[:1], target)


def test_the_student_rebuilds_the_teachers_cells_from_the_same_teacher_pass():
    torch.manual_seed(0)
    teacher = _model("local").eval().requires_grad_(False)
    student = _model("compressed", adapter_recover_cells=META.num_tokens).eval()
    batch, neg = _batch()
    logits, extra = teacher_scores(teacher, batch, neg, cells=True)
    assert torch.equal(logits, teacher_scores(teacher, batch, neg)[0]) and extra.inputs is None
    with torch.no_grad():
        assert torch.equal(extra.cells, teacher.adapter(batch.tokens))
    out = EDJEObjectives(student, ("itm", "distill", "cell_recovery"), {})(batch, neg, logits, extra)
    with torch.no_grad():
        expected = relative_squared_error(student.adapter.recover_cells(student.adapter(batch.tokens)), extra.cells)
    assert out["loss_cell_recovery"].item() == pytest.approx(expected.item(), rel=1e-5) and expected.item() > 0
    out["loss_cell_recovery"].backward()
    adapter = student.adapter
    for part in (adapter.query, adapter.key.weight, adapter.cell_decoder.query, adapter.cell_decoder.out.weight):
        assert part.grad is not None and part.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="adapter's tokens"):
        EDJEObjectives(student, ("itm", "cell_recovery"), {})(batch, neg, logits, None)


def test_cell_recovery_needs_a_decoder_and_a_teacher():
    with pytest.raises(ValueError, match="cell decoder"):
        EDJEObjectives(_model("compressed"), ("itm", "cell_recovery"), {})
    with pytest.raises(ValueError, match="recover_cells"):
        AdapterConfig(kind="local", input_dim=32, output_dim=16, recover_cells=16)
    with pytest.raises(ValueError, match="cell_recovery objective needs teacher_checkpoint"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "cell_recovery"))
    with pytest.raises(ValueError, match="no cell decoder"):
        _model("compressed").adapter.recover_cells(torch.zeros(1, 4, 128))
