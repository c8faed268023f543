"""ITM trained on the ranking rule's fused score: each pair's logit + w x the first stage's cosine, the cosines taken
from the tables' embeddings of the pairs in-batch mining picked."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_BERT
from torch.nn import functional as F

from edje.schemas.token_table import TableMetadata
from edje.training.batches import TrainBatch
from edje.training.config import ModelSpec, TrainJobConfig
from edje.training.losses import itm_loss
from edje.training.mining import MinerConfig
from edje.training.model_init import build_model
from edje.training.negatives import Negatives, in_batch_negatives
from edje.training.objectives import EDJEObjectives, pair_layout

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=16,
                     width=32, quantization="fp16", embed_dim=16)
CAPTIONS = ["a red circle to the left of a blue square", "the green star above a yellow heart",
            "a hexagon of the moon", "two small dogs facing left"]


def _batch(n: int, seed: int = 1) -> TrainBatch:
    """n rows, each its own image and caption; row j's tokens are all j, so a negative's tokens name its row."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.arange(n, dtype=torch.float32).view(n, 1, 1).expand(n, META.num_tokens, META.width).clone()
    image_emb = F.normalize(torch.randn(n, META.embed_dim, generator=g), dim=-1)
    text_emb = F.normalize(torch.randn(n, META.embed_dim, generator=g), dim=-1)
    return TrainBatch([f"i{j}" for j in range(n)], [f"caption {j}" for j in range(n)], tokens, image_emb, text_emb)


def test_in_batch_negatives_carry_the_first_stages_cosines_of_the_pairs_they_picked():
    batch = _batch(8)
    neg = in_batch_negatives(MinerConfig(k=3, strategy="topk"), batch, batch)
    picked_images = neg.image_tokens[:, :, 0, 0].long()  # [B, k] row numbers
    picked_texts = torch.tensor([[int(c.split()[-1]) for c in row] for row in neg.captions])
    sim = batch.text_emb @ batch.image_emb.T
    assert torch.allclose(neg.image_cos, sim.gather(1, picked_images), atol=1e-6)
    assert torch.allclose(neg.text_cos, (batch.image_emb @ batch.text_emb.T).gather(1, picked_texts), atol=1e-6)
    # top-k mining: the k most similar other images, so the cosines are the row's k largest off the diagonal
    off = sim.masked_fill(torch.eye(8, dtype=torch.bool), float("-inf"))
    assert torch.allclose(neg.image_cos.sort(dim=1, descending=True).values, off.topk(3, dim=1).values, atol=1e-6)


def _model():
    torch.manual_seed(0)
    return build_model(ModelSpec(adapter="local", adapter_hidden=64, bert_config=tuple(sorted(TINY_BERT.items()))),
                       META).eval()  # eval: no dropout, so two forwards score alike


def _pairs(first_stage_right: bool):
    """Four rows of real captions, one negative each way; the first stage orders every pair right, or every one wrong."""
    n = len(CAPTIONS)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randn(n, META.num_tokens, META.width, generator=g)
    batch = TrainBatch([f"i{j}" for j in range(n)], list(CAPTIONS), tokens, torch.zeros(n, 16), torch.zeros(n, 16))
    batch.image_emb[:, 0] = batch.text_emb[:, 0] = 1.0  # a positive's cosine is 1
    others = [(j + 1) % n for j in range(n)]
    cos = torch.zeros(n, 1) if first_stage_right else torch.full((n, 1), 2.0)
    neg = Negatives(tokens[others][:, None].clone(), [[CAPTIONS[j]] for j in others], cos.clone(), cos.clone())
    return batch, neg


def _plain_logits(model, batch, neg):
    texts, b, k = pair_layout(batch, neg)
    pairs = torch.cat([model.adapter(batch.tokens), model.adapter(neg.image_tokens.reshape(b * k, *neg.image_tokens.shape[2:])),
                       model.adapter(batch.tokens).repeat_interleave(k, dim=0)])
    logits = model.encoder.score(texts, pairs)
    return logits[:b], logits[b:b + b * k].view(b, k), logits[b + b * k:].view(b, k)


@pytest.mark.parametrize("first_stage_right", [True, False])
def test_the_itm_loss_is_taken_on_the_logits_plus_w_times_the_first_stages_cosines(first_stage_right):
    model = _model()
    batch, neg = _pairs(first_stage_right)
    w = 3.0
    out = EDJEObjectives(model, ("itm",), {}, first_stage_weight=w)(batch, neg)
    pos_l, negi_l, negt_l = _plain_logits(model, batch, neg)
    pos_cos = torch.ones(len(CAPTIONS))
    expected = itm_loss(pos_l + w * pos_cos, negi_l + w * neg.image_cos, negt_l + w * neg.text_cos)
    assert torch.allclose(out["loss_itm"], expected, atol=1e-5)
    assert not torch.allclose(out["loss_itm"], itm_loss(pos_l, negi_l, negt_l), atol=1e-3)
    # logged beside it: the plain ITM accuracy, the fused one, and the first stage's own on the same pairs
    assert float(out["first_stage_acc"]) == (1.0 if first_stage_right else 0.0)
    assert {"itm_acc", "itm_fused_acc"} <= out.keys()
    # without the weight the loss is the plain one and nothing more is logged
    plain = EDJEObjectives(model, ("itm",), {})(batch, neg)
    assert torch.allclose(plain["loss_itm"], itm_loss(pos_l, negi_l, negt_l), atol=1e-5)
    assert "first_stage_acc" not in plain and "itm_fused_acc" not in plain


def test_pairs_the_first_stage_already_orders_by_a_wide_margin_teach_the_reranker_nothing():
    """The point of the fusion: the ITM gradient goes to the pairs the first stage misorders."""
    def grad_norm(first_stage_right: bool) -> float:
        model = _model()
        batch, neg = _pairs(first_stage_right)
        EDJEObjectives(model, ("itm",), {}, first_stage_weight=50.0)(batch, neg)["loss_itm"].backward()
        return float(sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5)
    assert grad_norm(True) < 1e-6 < grad_norm(False)


def test_the_miner_services_negatives_carry_no_cosines_and_are_refused():
    batch, neg = _pairs(True)
    neg.image_cos = neg.text_cos = None
    with pytest.raises(ValueError, match="in-batch mining"):
        EDJEObjectives(_model(), ("itm",), {}, first_stage_weight=1.0)(batch, neg)


def test_the_config_takes_the_weight_only_where_the_cosines_exist():
    base = dict(tables=["t"], storage_path="s", name="n")
    assert TrainJobConfig(**base).itm_first_stage_weight == 0.0
    assert TrainJobConfig(**base, itm_first_stage_weight=64.0).itm_first_stage_weight == 64.0
    for bad, match in [(dict(itm_first_stage_weight=-1.0), ">= 0"),
                       (dict(itm_first_stage_weight=8.0, objectives=("mlm",)), "needs the itm objective"),
                       (dict(itm_first_stage_weight=8.0, negatives="miner", miner_url="http://127.0.0.1:9"), "in-batch"),
                       (dict(itm_first_stage_weight=8.0, text_augment=0.5), "no text_augment")]:
        with pytest.raises(ValueError, match=match):
            TrainJobConfig(**base, **bad)
