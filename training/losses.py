"""EDJE losses: ITM over hard negatives (both directions), MLM, text-embedding recovery, distillation (of the ITM
logits and of the route's inputs), the flip square, the pointer's order, word-to-image-token alignment."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from edje.model.content_words import best_cosines, mean_over_words


def itm_loss(pos_logits: torch.Tensor, neg_image_logits: torch.Tensor, neg_text_logits: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy of the positive against its k negative images and, separately, k negative texts."""
    b = pos_logits.shape[0]
    if pos_logits.shape != (b,) or neg_image_logits.shape[0] != b or neg_text_logits.shape[0] != b:
        raise ValueError(f"ITM logits must be [B], [B, k], [B, k]; got {list(pos_logits.shape)}, "
                         f"{list(neg_image_logits.shape)}, {list(neg_text_logits.shape)}")
    target = torch.zeros(b, dtype=torch.long, device=pos_logits.device)
    t2i = F.cross_entropy(torch.cat([pos_logits[:, None], neg_image_logits], dim=1), target)
    i2t = F.cross_entropy(torch.cat([pos_logits[:, None], neg_text_logits], dim=1), target)
    return (t2i + i2t) / 2


def itm_accuracy(pos_logits: torch.Tensor, neg_image_logits: torch.Tensor, neg_text_logits: torch.Tensor) -> torch.Tensor:
    """Share of (sample, direction) where the positive outscores every negative."""
    win_i = pos_logits > neg_image_logits.max(dim=1).values
    win_t = pos_logits > neg_text_logits.max(dim=1).values
    return torch.cat([win_i, win_t]).float().mean()


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over masked caption positions (labels -100 elsewhere)."""
    if not (labels != -100).any():
        return logits.sum() * 0.0  # no token was masked in this batch; keep the graph
    return F.cross_entropy(logits, labels, ignore_index=-100)


def recovery_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Text-embedding recovery: mean (1 - cos) between predicted and backbone text embeddings."""
    if predicted.shape != target.shape:
        raise ValueError(f"predicted {list(predicted.shape)} and target {list(target.shape)} embeddings differ")
    return (1 - F.cosine_similarity(predicted, target.to(predicted.dtype), dim=-1)).mean()


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, b: int, k: int) -> torch.Tensor:
    """Local-to-compressed distillation: BCE(sigmoid(student), sigmoid(teacher)), the three pair groups
    (b positives, b*k negative images, b*k negative texts) averaged equally, as in the official code:
    one mean over all b + 2bk pairs would give the positives a weight of 1 / (2k + 1)."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student {list(student_logits.shape)} and teacher {list(teacher_logits.shape)} logits differ")
    if student_logits.shape != (b + 2 * b * k,):
        raise ValueError(f"distillation expects b + 2bk = {b + 2 * b * k} logits, got {list(student_logits.shape)}")
    bce = F.binary_cross_entropy_with_logits(student_logits, torch.sigmoid(teacher_logits.detach()), reduction="none")
    return (bce[:b].mean() + bce[b:b + b * k].mean() + bce[b + b * k:].mean()) / 3


def route_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, student_valid: torch.Tensor,
                            teacher_valid: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean over relation slots valid in both of ||student - teacher||^2 / (||teacher||^2 + eps) of route inputs
    [B, R, h] (relative, so scale-free); 0, with a graph, when no slot is valid in both."""
    if student.shape != teacher.shape:
        raise ValueError(f"student {list(student.shape)} and teacher {list(teacher.shape)} route inputs differ")
    use = student_valid.bool() & teacher_valid.bool()
    if not bool(use.any()):
        return student.sum() * 0.0
    return relative_squared_error(student[use], teacher[use], eps)


def relative_squared_error(predicted: torch.Tensor, target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean over vectors [..., h] of ||predicted - target||^2 / (||target||^2 + eps), the target detached."""
    if predicted.shape != target.shape:
        raise ValueError(f"predicted {list(predicted.shape)} and target {list(target.shape)} differ")
    target = target.detach().to(predicted.dtype)
    return ((predicted - target).pow(2).sum(-1) / (target.pow(2).sum(-1) + eps)).mean()


def flip_square_loss(caption_image: torch.Tensor, flipped_image: torch.Tensor, flipped_mirror: torch.Tensor,
                     caption_mirror: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The flip square's four two-way comparisons, each of ITM logits [R] of (caption c or its flip fc, image I or
    its mirror M): image I picks c over fc, M picks fc over c, c picks I over M, fc picks M over I. Returns (mean
    cross-entropy, [4R] whether each true pair outscored its false one)."""
    true = torch.cat([caption_image, flipped_mirror, caption_image, flipped_mirror])
    false = torch.cat([flipped_image, caption_mirror, caption_mirror, flipped_image])
    return F.softplus(false - true).mean(), true > false


def weighted_flip_loss(true: torch.Tensor, flipped: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Caption-side flips: the weighted mean over rows of the two-way cross-entropy of (image, caption) [R] against
    (image, flipped caption) [R]."""
    return (weights * F.softplus(flipped - true)).sum() / weights.sum().clamp_min(1e-12)


def pointer_order_loss(xy: torch.Tensor, valid: torch.Tensor, orders: torch.Tensor,
                       k: float) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The pointer's order loss from the caption alone: softplus(k * ORDER . (x_hat_subject - x_hat_object)) over
    the relations whose two phrases have readable pieces. xy [B, 2R, 2] and valid [B, 2R] hold the R subjects then
    the R objects, orders [B, R, 2] each relation's ORDER (model/relation_roles.py; 0 where none). Returns (loss,
    share of relations the pointer already puts in the caption's order), (0, None) when none."""
    r = orders.shape[1]
    signed = (orders.to(xy.dtype) * (xy[:, :r] - xy[:, r:])).sum(-1)
    use = valid[:, :r] & valid[:, r:] & (orders.abs().sum(-1) > 0)
    if not bool(use.any()):
        return xy.sum() * 0.0, None
    return F.softplus(k * signed[use]).mean(), (signed[use] < 0).float().mean()


def word_alignment_loss(word_vecs: torch.Tensor, word_valid: torch.Tensor, image_tokens: torch.Tensor,
                        same_image: torch.Tensor, tau: float) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Symmetric cross-entropy of S / tau with S[i, j] = mean over caption i's valid words w (word_vecs [B, W, h],
    word_valid [B, W]) of max over image j's tokens t (image_tokens [B, n, h]) of cos(e_w, v_jt), rows of one image
    (same_image [B, B]) no negatives of each other; returns (loss, share of captions whose own image has the top S),
    (0, None) when no caption has a word."""
    # Captions without a word are neither rows nor (text side) candidates; every image stays a candidate.
    keep = word_valid.any(1)
    if not bool(keep.any()):
        return word_vecs.sum() * 0.0 + image_tokens.sum() * 0.0, None
    sim = mean_over_words(best_cosines(word_vecs, image_tokens), word_valid)  # [B, B]
    b = sim.shape[0]
    own = torch.eye(b, dtype=torch.bool, device=sim.device)
    # Another row's image that is this row's own image is no negative: it leaves the softmax in both directions.
    logits = (sim / tau).masked_fill(same_image.to(sim.device) & ~own, float("-inf"))
    rows = keep.nonzero().squeeze(1)
    t2i = F.cross_entropy(logits[rows], rows)
    i2t = F.cross_entropy(logits[rows][:, rows].T, torch.arange(len(rows), device=sim.device))
    acc = (logits[rows].argmax(1) == rows).float().mean()
    return (t2i + i2t) / 2, acc.detach()
