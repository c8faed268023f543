"""Distillation scores the same pairs, in the same order, for teacher and student."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from edje.training.batches import TrainBatch
from edje.training.negatives import Negatives
from edje.training.objectives import pair_layout, teacher_scores


class PairIndexEncoder(nn.Module):
    """A planted teacher encoder: the logit of (text, image) is 100 x caption number + image number,
    read from the caption ("caption 3") and from the image tokens (every value = the image number)."""

    def score(self, texts, images):
        return torch.tensor([100.0 * int(t.split()[-1]) + float(im[0, 0]) for t, im in zip(texts, images)])


def test_teacher_logits_line_up_with_the_students_pairs():
    b, k, n, d = 3, 2, 4, 8
    batch = TrainBatch([f"img{i}" for i in range(b)], [f"caption {i}" for i in range(b)],
                       torch.arange(b, dtype=torch.float32).view(b, 1, 1).expand(b, n, d).clone(),
                       torch.zeros(b, 4), torch.zeros(b, 4))
    # Row i's negative images are images 10+i and 20+i; its negative captions are captions 7 and 8.
    neg_img = torch.tensor([[10.0 + i, 20.0 + i] for i in range(b)]).view(b, k, 1, 1).expand(b, k, n, d).clone()
    neg = Negatives(neg_img, [["caption 7", "caption 8"] for _ in range(b)])
    teacher = SimpleNamespace(adapter=nn.Identity(), encoder=PairIndexEncoder())
    logits, route = teacher_scores(teacher, batch, neg)
    assert route is None
    texts, b2, k2 = pair_layout(batch, neg)
    assert (b2, k2) == (b, k) and len(texts) == len(logits) == b + 2 * b * k
    expected = ([100 * i + i for i in range(b)]  # positives
                + [100 * i + j for i in range(b) for j in (10 + i, 20 + i)]  # (caption i, negative image)
                + [100 * c + i for i in range(b) for c in (7, 8)])  # (negative caption, image i)
    assert logits.tolist() == expected
