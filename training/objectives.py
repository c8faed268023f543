"""EDJE training objectives in one module forward (so DDP sees one forward per step).

ITM over the positive and k hard negatives in both directions, MLM on the positive pairs,
text-embedding recovery from the text-only [CLS], distillation of a teacher's ITM logits
on exactly the pairs the student scores, grounding: each grounded caption word of a positive
pair regresses its object's centre from a middle layer (read from the same forward as ITM), and
relation flips: each positive against its own caption with the spatial words reversed, on the same image.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edje.model.edje import EDJEModel
from edje.training.batches import TrainBatch
from edje.training.caption_rewrites import flip_relations
from edje.training.losses import distillation_loss, itm_accuracy, itm_loss, mlm_loss, recovery_loss
from edje.training.masking import PieceGroups
from edje.training.negatives import Negatives


def pair_layout(batch: TrainBatch, neg: Negatives):
    """Texts and raw image tokens of all scored pairs: positives, (caption, negative image), (negative caption, image)."""
    b, k = len(batch), neg.image_tokens.shape[1]
    texts = list(batch.captions) + [c for c in batch.captions for _ in range(k)] + [c for row in neg.captions for c in row]
    return texts, b, k


class EDJEObjectives(nn.Module):
    """Wraps EDJEModel; forward(batch, negatives, teacher_logits) -> dict of losses and ITM accuracy."""

    def __init__(self, model: EDJEModel, objectives: Sequence[str], weights: Dict[str, float],
                 word_groups: Optional[PieceGroups] = None, grounding: Optional[Mapping] = None):
        super().__init__()
        self.model = model
        self.objectives = tuple(objectives)
        self.weights = weights
        # Binding-targeted MLM (training/masking.py): mask one attribute group per caption.
        self.word_groups = word_groups
        if "ground" in self.objectives and grounding is None:
            raise ValueError("the ground objective needs grounding annotations")
        if "flip" in self.objectives and "itm" not in self.objectives:
            raise ValueError("the flip objective compares ITM logits: it needs the itm objective")
        self.grounding = grounding  # (image id, caption) -> [words, 3] of (word index, centre x, centre y)
        self._positions: Dict[Tuple[str, str], Tuple[list, np.ndarray]] = {}  # captions recur every epoch

    def forward(self, batch: TrainBatch, neg: Negatives, teacher_logits: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        texts, b, k = pair_layout(batch, neg)
        adapter, encoder = self.model.adapter, self.model.encoder
        # The adapter runs once per distinct image: positives and the negative images.
        pos = adapter(batch.tokens)
        out: Dict[str, torch.Tensor] = {}
        total = pos.new_zeros(())
        # Pairs are scored only when a loss reads the scores: an MLM-only phase (the curriculum's
        # first) would otherwise pay 1 + 2k forwards per row for a logged accuracy.
        centres = None
        if "itm" in self.objectives or "distill" in self.objectives:
            negi = adapter(neg.image_tokens.reshape(b * k, *neg.image_tokens.shape[2:]))
            pairs = torch.cat([pos, negi, pos.repeat_interleave(k, dim=0)])
            if "ground" in self.objectives:  # the positives lead the pairs: their states come from this forward
                logits, centres = encoder.score_and_ground(texts, pairs)
            else:
                logits = encoder.score(texts, pairs)
            pos_l, negi_l, negt_l = logits[:b], logits[b:b + b * k].view(b, k), logits[b + b * k:].view(b, k)
            out["itm_acc"] = itm_accuracy(pos_l, negi_l, negt_l).detach()
        if "flip" in self.objectives:
            flipped = [flip_relations(c) for c in batch.captions]
            rows = [i for i, f in enumerate(flipped) if f is not None]
            if rows:
                # Each positive against its own caption with the relations reversed, on the same image.
                flip_l = encoder.score([flipped[i] for i in rows], pos[rows])
                pair = torch.stack([pos_l[rows], flip_l], dim=1)
                out["loss_flip"] = F.cross_entropy(pair, torch.zeros(len(rows), dtype=torch.long, device=pair.device))
                out["flip_acc"] = (pair[:, 0] > pair[:, 1]).float().mean().detach()
            else:
                out["loss_flip"] = pos.sum() * 0
            total = total + self.weights.get("flip", 1.0) * out["loss_flip"]
        if "ground" in self.objectives:
            if centres is None:
                centres = encoder.score_and_ground(list(batch.captions), pos)[1]
            out["loss_ground"] = self._ground_loss(batch, centres[:b])
            total = total + self.weights.get("ground", 1.0) * out["loss_ground"]
        if "itm" in self.objectives:
            out["loss_itm"] = itm_loss(pos_l, negi_l, negt_l)
            total = total + self.weights.get("itm", 1.0) * out["loss_itm"]
        if "mlm" in self.objectives:
            policy = self.word_groups.mask_policy if self.word_groups is not None else None
            mlm_logits, labels = encoder.mlm_logits(batch.captions, pos, mask_policy=policy)
            out["loss_mlm"] = mlm_loss(mlm_logits, labels)
            if self.word_groups is not None:
                # The binding read-out: masked group words predicted right (among their group, synonyms as one).
                out["mlm_bind_acc"] = self.word_groups.readout_accuracy(mlm_logits.detach(), labels)
            total = total + self.weights.get("mlm", 1.0) * out["loss_mlm"]
        if "recovery" in self.objectives:
            out["loss_recovery"] = recovery_loss(encoder.text_embedding(batch.captions), batch.text_emb)
            total = total + self.weights.get("recovery", 1.0) * out["loss_recovery"]
        if "distill" in self.objectives:
            if teacher_logits is None:
                raise ValueError("the distill objective needs teacher logits")
            out["loss_distill"] = distillation_loss(logits, teacher_logits, b, k)
            total = total + self.weights.get("distill", 1.0) * out["loss_distill"]
        out["loss"] = total
        return out

    def _ground_loss(self, batch: TrainBatch, centres: torch.Tensor) -> torch.Tensor:
        """Mean squared error (x10, centred coordinates) of grounded words' predicted object centres; 0 without any."""
        rows, cols, targets = [], [], []
        for i, key in enumerate(zip(batch.image_ids, batch.captions)):
            positions, xy = self._grounded_positions(key)
            rows.extend([i] * len(positions))
            cols.extend(positions)
            targets.append(xy)
        if not rows:
            return centres.sum() * 0
        target = torch.from_numpy(np.concatenate(targets)).to(centres.device, centres.dtype) - 0.5
        return F.mse_loss(centres[torch.tensor(rows), torch.tensor(cols)], target) * 10

    def _grounded_positions(self, key: Tuple[str, str]) -> Tuple[list, np.ndarray]:
        """Sequence positions of a caption's grounded words (first wordpiece each) and their object centres."""
        if key not in self._positions:
            rows = self.grounding.get(key)
            if rows is None or not len(rows):
                self._positions[key] = [], np.zeros((0, 2), np.float32)
            else:
                starts = self.model.encoder.word_positions(key[1])
                words = rows[:, 0].astype(int)
                keep = words < len(starts)
                self._positions[key] = [starts[w] for w in words[keep]], rows[keep, 1:]
        return self._positions[key]


@torch.no_grad()
def teacher_scores(teacher: EDJEModel, batch: TrainBatch, neg: Negatives) -> torch.Tensor:
    """The teacher's ITM logits on the same pairs, in the same order, as EDJEObjectives scores them."""
    texts, b, k = pair_layout(batch, neg)
    pos = teacher.adapter(batch.tokens)
    negi = teacher.adapter(neg.image_tokens.reshape(b * k, *neg.image_tokens.shape[2:]))
    return teacher.encoder.score(texts, torch.cat([pos, negi, pos.repeat_interleave(k, dim=0)]))
