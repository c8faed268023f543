"""Each EDJE loss falls by at least half when a tiny model overfits one batch; the miner masks false negatives."""
import pytest
import torch

from edje.model.edje import EDJEModel
from edje.training.losses import distillation_loss, itm_accuracy, itm_loss, mlm_loss, recovery_loss
from edje.training.mining import MinerConfig, mine_hard_negatives

CAPTIONS = ["a large red circle left of a small blue square", "a small red circle left of a large blue square",
            "a large blue circle above a small red star", "a green triangle right of a white cross",
            "a small yellow star below a large purple circle", "two black squares and an orange star",
            "a purple cross left of a green circle", "a large white triangle above a small black star"]


def _batch(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(len(CAPTIONS), 65, cfg.adapter.input_dim, generator=g)
    emb = torch.nn.functional.normalize(torch.randn(len(CAPTIONS), 128, generator=g), dim=-1)
    return tokens, emb


def _overfit(model, loss_fn, steps=40, lr=1e-3):
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    first = None
    for _ in range(steps):
        loss = loss_fn()
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first, loss_fn().item()


def _itm_closure(model, tokens, emb):
    ids = [f"img{i}" for i in range(len(CAPTIONS))]
    neg_img, neg_txt = mine_hard_negatives(MinerConfig(k=3), emb, emb, emb, emb, ids, CAPTIONS, ids, CAPTIONS)

    def step():
        img = model.adapter(tokens)
        pos = model.encoder.score(CAPTIONS, img)
        k = neg_img.shape[1]
        rep = [c for c in CAPTIONS for _ in range(k)]
        ni = model.encoder.score(rep, img[neg_img.reshape(-1)]).view(-1, k)
        nt = model.encoder.score([CAPTIONS[j] for j in neg_txt.reshape(-1).tolist()],
                                 img.repeat_interleave(k, dim=0)).view(-1, k)
        return itm_loss(pos, ni, nt), itm_accuracy(pos, ni, nt)
    return step


def test_itm_loss_falls_by_half(tiny_edje_config):
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config)
    tokens, emb = _batch(tiny_edje_config)
    step = _itm_closure(model, tokens, emb)
    first, last = _overfit(model, lambda: step()[0], steps=60)
    assert last <= first / 2, (first, last)
    assert step()[1].item() > 0.9


def test_mlm_loss_falls_by_half(tiny_edje_config):
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config)
    tokens, _ = _batch(tiny_edje_config)
    first, last = _overfit(model, lambda: mlm_loss(*model.encoder.mlm_logits(CAPTIONS, model.adapter(tokens))), lr=3e-3)
    assert last <= first / 2, (first, last)


def test_recovery_loss_falls_by_half(tiny_edje_config):
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config)
    _, emb = _batch(tiny_edje_config)
    first, last = _overfit(model, lambda: recovery_loss(model.encoder.text_embedding(CAPTIONS), emb))
    assert last <= first / 2, (first, last)


def test_distillation_loss_falls_by_half(tiny_edje_config):
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config)
    tokens, _ = _batch(tiny_edje_config)
    teacher = torch.tensor([6.0, -6.0] * 4)  # a confident teacher: the BCE floor is ~0.015
    # 8 pairs laid out as b=2 positives, b*k=2x1 negative images, 2x1 negative texts... plus 2 more
    # positives would not fit the layout; use b=2, k=1 over the first 6 pairs.
    first, last = _overfit(model, lambda: distillation_loss(model.score_backbone_tokens(CAPTIONS, tokens)[:6],
                                                            teacher[:6], b=2, k=1))
    assert last <= first / 2, (first, last)


def test_distillation_weighs_the_three_pair_groups_equally():
    # b=1, k=3: one positive, three negative images, three negative texts. An error on the
    # positive alone must cost a third of the loss, not 1/(2k+1) = 1/7 of it.
    teacher = torch.tensor([8.0] + [-8.0] * 6)
    student = teacher.clone()
    base = distillation_loss(student, teacher, b=1, k=3)
    wrong_pos = student.clone()
    wrong_pos[0] = -8.0
    wrong_neg = student.clone()
    wrong_neg[1] = 8.0
    d_pos = distillation_loss(wrong_pos, teacher, b=1, k=3) - base
    d_neg = distillation_loss(wrong_neg, teacher, b=1, k=3) - base
    assert torch.isclose(d_pos, 3 * d_neg, rtol=1e-3), (d_pos, d_neg)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(-8.0), torch.sigmoid(torch.tensor(8.0)))
    floor = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(8.0), torch.sigmoid(torch.tensor(8.0)))
    assert torch.isclose(d_pos, (bce - floor) / 3, rtol=1e-3)


def test_losses_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="ITM logits"):
        itm_loss(torch.zeros(4), torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="differ"):
        recovery_loss(torch.zeros(2, 8), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="differ"):
        distillation_loss(torch.zeros(3), torch.zeros(4), b=1, k=1)
    with pytest.raises(ValueError, match="b \\+ 2bk"):
        distillation_loss(torch.zeros(4), torch.zeros(4), b=1, k=1)


def test_miner_masks_positives_same_ids_and_identical_captions():
    # rows 0 and 1 are the same image; rows 2 and 3 share a caption; row 4 is the hardest for row 0
    emb = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 1.0, 0],
                                                      [0.9, 0.1, 0], [0, 0, 1.0], [0.5, 0.5, 0]]), dim=-1)
    ids = ["a", "a", "b", "c", "d", "e", "f"]
    caps = ["x", "y", "same", "same", "z", "w", "v"]
    ni, nt = mine_hard_negatives(MinerConfig(k=2), emb, emb, emb, emb, ids, caps, ids, caps)
    assert ni[0].tolist() == [4, 6] and nt[0].tolist() == [4, 6]
    assert 3 not in ni[2].tolist() and 2 not in ni[2].tolist()  # identical caption = a false negative
    for i in range(7):
        for j in ni[i].tolist() + nt[i].tolist():
            assert ids[j] != ids[i] and caps[j] != caps[i]
    # the local batch may be a slice of the gathered rows (another worker's rows are candidates)
    ni2, _ = mine_hard_negatives(MinerConfig(k=2), emb[:2], emb[:2], emb, emb, ids[:2], caps[:2], ids, caps)
    assert ni2[0].tolist() == [4, 6]
    g = torch.Generator().manual_seed(0)
    ns, _ = mine_hard_negatives(MinerConfig(k=3, strategy="sample", temperature=0.1), emb, emb, emb, emb, ids, caps,
                                ids, caps, generator=g)
    for i in range(7):
        picked = ns[i].tolist()
        assert len(set(picked)) == 3 and all(ids[j] != ids[i] and caps[j] != caps[i] for j in picked)
    with pytest.raises(ValueError, match="fewer than k=6 valid negatives"):
        mine_hard_negatives(MinerConfig(k=6), emb, emb, emb, emb, ids, caps, ids, caps)
