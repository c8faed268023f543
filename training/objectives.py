"""EDJE training objectives in one module forward (so DDP sees one forward per step).

ITM over the positive and k hard negatives in both directions (on the logits alone, or on the ranking rule's fused
score: each logit + w x the first stage's cosine of its pair), MLM on the positive pairs,
text-embedding recovery from the text-only [CLS], distillation of a teacher's ITM logits
on exactly the pairs the student scores, grounding: each grounded caption word of a positive
pair regresses its object's centre from a middle layer (read from the same forward as ITM),
relation flips: each positive against its own caption with the spatial words reversed, on the same image, weighted
so that the spatial words alone carry no shortcut (or, with flip_mode "square", the flip square with the image's
mirrored copy, and weighted vertical flips), and the pointer's
order loss: each relation's subject and object phrase placed on the image grid in the caption's order, and route
distillation: on each positive pair, what the student's route reads (mean subject state - mean object state of each
relation) regresses the teacher's, whose phrases carry their image positions (the pointer's), and mirrored route
distillation: on the flip square's rows, how the student's route input changes from the image to its mirror regresses
how the teacher's does (what a phrase's image position adds, with what the phrase says cancelled out), and word
alignment: each content word of each caption (its wordpieces' mean input embedding) finds its best adapter token in
every image of the batch, and their mean cosine picks the caption's own image and back (FILIP's fine-grained loss), and
noun swaps: each positive against its caption with one noun replaced by a neighbour caption's (training/noun_swaps.py),
on the same image, and orientation flips: each positive against its caption with the way things face reversed and
their places kept (caption_rewrites.flip_orientation), on the same image, weighted so that those words alone carry no
shortcut (a flip square's mirror can be told from its image by where things stand; this negative cannot), and
attribute swaps: each positive against its caption with one size word or count replaced (training/attribute_swaps.py),
on the same image, weighted the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edje.model.content_words import ContentWords
from edje.model.edje import EDJEModel
from edje.training.attribute_swaps import AttributeSwaps
from edje.training.batches import TrainBatch
from edje.training.caption_rewrites import (
    HORIZONTAL,
    ORIENTATION,
    VERTICAL,
    FlipBalance,
    caption_axes,
    flip_axis,
)
from edje.training.losses import (
    distillation_loss,
    flip_square_loss,
    itm_accuracy,
    itm_loss,
    mlm_loss,
    pointer_order_loss,
    recovery_loss,
    relative_squared_error,
    route_distillation_loss,
    weighted_flip_loss,
    word_alignment_loss,
)
from edje.training.masking import PieceGroups
from edje.training.negatives import Negatives
from edje.training.noun_swaps import NounSwaps


@dataclass
class TeacherPass:
    """What the student's objectives read from the teacher's pass beyond its logits: its route inputs [b, R, h] and
    their validity [b, R] on the b positive pairs (route_distill) and on (mirrored image, caption) of the same rows
    (route_mirror), and its adapter's tokens of the positives' images [b, n, h] (cell_recovery)."""

    inputs: Optional[torch.Tensor] = None
    valid: Optional[torch.Tensor] = None
    mirror_inputs: Optional[torch.Tensor] = None
    mirror_valid: Optional[torch.Tensor] = None
    cells: Optional[torch.Tensor] = None


def pair_layout(batch: TrainBatch, neg: Negatives):
    """Texts and raw image tokens of all scored pairs: positives, (caption, negative image), (negative caption, image)."""
    b, k = len(batch), neg.image_tokens.shape[1]
    texts = list(batch.captions) + [c for c in batch.captions for _ in range(k)] + [c for row in neg.captions for c in row]
    return texts, b, k


def first_stage_cosines(batch: TrainBatch, neg: Negatives) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first stage's cosines of the scored pairs: positives [B], (caption, negative image) and (negative caption,
    image) [B, k], from the tables' embeddings."""
    if neg.image_cos is None or neg.text_cos is None:
        raise ValueError("the first stage's cosines of the negatives come from in-batch mining, not the miner service")
    return (batch.text_emb.float() * batch.image_emb.float()).sum(-1), neg.image_cos, neg.text_cos


class EDJEObjectives(nn.Module):
    """Wraps EDJEModel; forward(batch, negatives, teacher_logits, teacher_pass) -> dict of losses and ITM accuracy."""

    def __init__(self, model: EDJEModel, objectives: Sequence[str], weights: Dict[str, float],
                 word_groups: Optional[PieceGroups | ContentWords] = None, grounding: Optional[Mapping] = None,
                 flip_mode: str = "caption", flip_balance: Optional[FlipBalance] = None,
                 pointer_k: float = 10.0, align_temperature: float = 0.05, noun_swaps: Optional[NounSwaps] = None,
                 orientation_balance: Optional[FlipBalance] = None, attribute_swaps: Optional[AttributeSwaps] = None,
                 first_stage_weight: float = 0.0, seed: int = 0):
        super().__init__()
        self.model = model
        self.objectives = tuple(objectives)
        self.weights = weights
        # Targeted MLM: one attribute group per caption (training/masking.py) or one content word
        # (model/content_words.py).
        self.word_groups = word_groups
        if "ground" in self.objectives and grounding is None:
            raise ValueError("the ground objective needs grounding annotations")
        if "flip" in self.objectives and "itm" not in self.objectives:
            raise ValueError("the flip objective compares ITM logits: it needs the itm objective")
        if flip_mode == "square" and not (isinstance(flip_balance, FlipBalance) and flip_balance.axis == VERTICAL):
            raise ValueError("the flip square weighs vertical flips by a FlipBalance of the training captions' "
                             "vertical axis")
        if "flip" in self.objectives and flip_mode == "caption" and not (isinstance(flip_balance, FlipBalance)
                                                                         and flip_balance.axis is None):
            # Unweighted, a world that words one side of an axis more often than the other lets a blind model
            # tell a caption from its flip by the spatial words alone.
            raise ValueError("caption-side flips are weighted by a FlipBalance of the training captions with axis None")
        if "pointer" in self.objectives and not model.encoder.config.pointer:
            raise ValueError("the pointer objective trains the model's pointer: build it with pointer=True")
        for name in ("route_distill", "route_mirror"):
            if name in self.objectives and not model.encoder.config.route_layer:
                raise ValueError(f"the {name} objective trains the route's inputs: build the model with route_layer")
        if "cell_recovery" in self.objectives and getattr(model.adapter, "cell_decoder", None) is None:
            raise ValueError("the cell_recovery objective trains the adapter's cell decoder: build a compressed adapter "
                             "with recover_cells")
        if "route_mirror" in self.objectives and not ("flip" in self.objectives and flip_mode == "square"):
            raise ValueError("the route_mirror objective reads the flip square's mirrored images: add the flip "
                             "objective with flip_mode 'square'")
        if "noun_swap" in self.objectives and not ("itm" in self.objectives and isinstance(noun_swaps, NounSwaps)):
            raise ValueError("the noun_swap objective compares ITM logits: it needs the itm objective and the "
                             "training captions' NounSwaps")
        self.flip_mode, self.flip_balance, self.pointer_k = flip_mode, flip_balance, pointer_k
        if "orientation" in self.objectives and not ("itm" in self.objectives and isinstance(orientation_balance, FlipBalance)
                                                     and orientation_balance.axis == ORIENTATION):
            raise ValueError("the orientation objective compares ITM logits: it needs the itm objective and a "
                             "FlipBalance of the training captions on ORIENTATION")
        if "attribute_swap" in self.objectives and not ("itm" in self.objectives
                                                        and isinstance(attribute_swaps, AttributeSwaps)):
            raise ValueError("the attribute_swap objective compares ITM logits: it needs the itm objective and the "
                             "training captions' AttributeSwaps")
        self.noun_swaps, self._swap_rng = noun_swaps, np.random.default_rng(seed)
        self.attribute_swaps = attribute_swaps
        self.orientation_balance = orientation_balance
        self.align_temperature = align_temperature
        self.first_stage_weight = first_stage_weight
        self.grounding = grounding  # (image id, caption) -> [words, 3] of (word index, centre x, centre y)
        self._positions: Dict[Tuple[str, str], Tuple[list, np.ndarray]] = {}  # captions recur every epoch

    def forward(self, batch: TrainBatch, neg: Negatives, teacher_logits: Optional[torch.Tensor] = None,
                teacher_pass: Optional[TeacherPass] = None) -> Dict[str, torch.Tensor]:
        """The weighted losses of the objectives; `teacher_pass` holds what route_distill, route_mirror and
        cell_recovery read from the teacher's pass."""
        texts, b, k = pair_layout(batch, neg)
        adapter, encoder = self.model.adapter, self.model.encoder
        # The adapter runs once per distinct image: positives and the negative images.
        pos = adapter(batch.tokens)
        out: Dict[str, torch.Tensor] = {}
        total = pos.new_zeros(())
        # Pairs are scored only when a loss reads the scores: an MLM-only phase (the curriculum's
        # first) would otherwise pay 1 + 2k forwards per row for a logged accuracy.
        centres = route = None
        wants_route = "route_distill" in self.objectives or "route_mirror" in self.objectives
        if wants_route and (teacher_pass is None or teacher_pass.inputs is None):
            raise ValueError("the route_distill and route_mirror objectives need the teacher's route inputs")
        if "cell_recovery" in self.objectives and (teacher_pass is None or teacher_pass.cells is None):
            raise ValueError("the cell_recovery objective needs the teacher adapter's tokens")
        if "route_mirror" in self.objectives and teacher_pass.mirror_inputs is None:
            raise ValueError("the route_mirror objective needs the teacher's route inputs on the mirrored images")
        if "itm" in self.objectives or "distill" in self.objectives:
            negi = adapter(neg.image_tokens.reshape(b * k, *neg.image_tokens.shape[2:]))
            pairs = torch.cat([pos, negi, pos.repeat_interleave(k, dim=0)])
            if "ground" in self.objectives:  # the positives lead the pairs: their states come from this forward
                logits, centres = encoder.score_and_ground(texts, pairs)
            elif wants_route:  # likewise the positives' route inputs
                logits, inputs, valid = encoder.score_and_route(texts, pairs)
                route = inputs[:b], valid[:b]
            else:
                logits = encoder.score(texts, pairs)
            pos_l, negi_l, negt_l = logits[:b], logits[b:b + b * k].view(b, k), logits[b + b * k:].view(b, k)
            out["itm_acc"] = itm_accuracy(pos_l, negi_l, negt_l).detach()
            # The ITM loss's logits: the pairs' own, or with first_stage_weight x the first stage's cosine of each
            # pair added (the ranking rule's fusion), logged with the first stage's own accuracy on those pairs.
            itm_logits = (pos_l, negi_l, negt_l)
            if self.first_stage_weight:
                cosines = first_stage_cosines(batch, neg)
                itm_logits = tuple(x + self.first_stage_weight * c for x, c in zip(itm_logits, cosines))
                out["itm_fused_acc"] = itm_accuracy(*itm_logits).detach()
                out["first_stage_acc"] = itm_accuracy(*cosines).detach()
        if "flip" in self.objectives:
            out.update(self._flip_square(batch, pos, pos_l, route, teacher_pass) if self.flip_mode == "square" else
                       self._flip_caption(batch, pos, pos_l))
            total = total + self.weights.get("flip", 1.0) * out["loss_flip"]
            if "route_mirror" in self.objectives:
                total = total + self.weights.get("route_mirror", 1.0) * out["loss_route_mirror"]
        if "noun_swap" in self.objectives:
            out.update(self._noun_swap(batch, neg, pos, pos_l))
            total = total + self.weights.get("noun_swap", 1.0) * out["loss_noun_swap"]
        if "attribute_swap" in self.objectives:
            out.update(self._attribute_swap(batch, pos, pos_l))
            total = total + self.weights.get("attribute_swap", 1.0) * out["loss_attribute_swap"]
        if "orientation" in self.objectives:
            out.update(self._orientation(batch, pos, pos_l))
            total = total + self.weights.get("orientation", 1.0) * out["loss_orientation"]
        if "pointer" in self.objectives:
            xy, valid, orders = encoder.pointer_readout(list(batch.captions), pos)
            out["loss_pointer"], in_order = pointer_order_loss(xy, valid, orders, self.pointer_k)
            if in_order is not None:
                out["pointer_order_acc"] = in_order.detach()
            total = total + self.weights.get("pointer", 1.0) * out["loss_pointer"]
        if "ground" in self.objectives:
            if centres is None:
                centres = encoder.score_and_ground(list(batch.captions), pos)[1]
            out["loss_ground"] = self._ground_loss(batch, centres[:b])
            total = total + self.weights.get("ground", 1.0) * out["loss_ground"]
        if "itm" in self.objectives:
            out["loss_itm"] = itm_loss(*itm_logits)
            total = total + self.weights.get("itm", 1.0) * out["loss_itm"]
        if "mlm" in self.objectives:
            policy = self.word_groups.mask_policy if self.word_groups is not None else None
            mlm_logits, labels = encoder.mlm_logits(batch.captions, pos, mask_policy=policy)
            out["loss_mlm"] = mlm_loss(mlm_logits, labels)
            if self.word_groups is not None:
                # The binding read-out: masked group words predicted right (among their group, synonyms as one),
                # or masked content words predicted exactly.
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
        if "route_distill" in self.objectives:
            if route is None:
                route = encoder.score_and_route(list(batch.captions), pos)[1:]
            out["loss_route_distill"] = route_distillation_loss(route[0], teacher_pass.inputs, route[1],
                                                                teacher_pass.valid)
            total = total + self.weights.get("route_distill", 1.0) * out["loss_route_distill"]
        if "cell_recovery" in self.objectives:
            # The teacher's cells permute when the image is mirrored: rebuilding them needs tokens that keep where.
            out["loss_cell_recovery"] = relative_squared_error(adapter.recover_cells(pos), teacher_pass.cells)
            total = total + self.weights.get("cell_recovery", 1.0) * out["loss_cell_recovery"]
        if "word_align" in self.objectives:
            # Every content word, whatever the MLM policy masks.
            word_vecs, word_valid = encoder.content_word_vectors(batch.captions, pos.shape[1], pos.device)
            out["loss_word_align"], acc = word_alignment_loss(word_vecs, word_valid, pos, same_image(batch.image_ids),
                                                              self.align_temperature)
            if acc is not None:
                out["word_align_acc"] = acc
            total = total + self.weights.get("word_align", 1.0) * out["loss_word_align"]
        out["loss"] = total
        return out

    def _flip_caption(self, batch: TrainBatch, pos: torch.Tensor, pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each positive against its own caption with the relations reversed (one axis), on the same image, weighted
        by the balance of the training captions' spatial words."""
        return caption_side_flips(self.model, self.flip_balance, "flip", batch.captions, pos, pos_l)

    def _orientation(self, batch: TrainBatch, pos: torch.Tensor, pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each positive against its caption with the way things face reversed (their places kept), on the same
        image, weighted by the balance of the training captions' sides of orientation."""
        return caption_side_flips(self.model, self.orientation_balance, "orientation", batch.captions, pos, pos_l)

    def _noun_swap(self, batch: TrainBatch, neg: Negatives, pos: torch.Tensor,
                   pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each positive against its caption with one noun swapped, donors first from its hard negatives'
        captions, on the same image."""
        swapped = [self.noun_swaps.swap(c, neg.captions[i], self._swap_rng) for i, c in enumerate(batch.captions)]
        return caption_negatives_loss(self.model, "noun_swap", swapped, [1.0] * len(swapped), pos, pos_l)

    def _attribute_swap(self, batch: TrainBatch, pos: torch.Tensor, pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each positive against its caption with one size word or count replaced, on the same image, weighted so
        that the new word alone carries no shortcut."""
        swapped = [self.attribute_swaps.swap(c, self._swap_rng) for c in batch.captions]
        return caption_negatives_loss(self.model, "attribute_swap", [s and s[0] for s in swapped],
                                      [s[1] if s else 0.0 for s in swapped], pos, pos_l)

    def _flip_square(self, batch: TrainBatch, pos: torch.Tensor, pos_l: torch.Tensor,
                     route: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                     teacher_pass: Optional[TeacherPass] = None) -> Dict[str, torch.Tensor]:
        """The flip square on horizontal captions whose image has a mirrored copy, and weighted caption-side flips
        on vertical ones; every extra pair scored in one pass. With route_mirror, the same pass gives the route
        inputs of (mirror I, c), and `route` holds the positives' (inputs, valid)."""
        caps = list(batch.captions)
        has_mirror = batch.has_mirror.tolist() if batch.has_mirror is not None else [False] * len(caps)
        square = [i for i, c in enumerate(caps) if has_mirror[i] and HORIZONTAL in caption_axes(c)]
        weight = [self.flip_balance.weight(c) for c in caps]
        vertical = [i for i in range(len(caps)) if weight[i] > 0]
        mirrored_route = "route_mirror" in self.objectives
        out: Dict[str, torch.Tensor] = {"loss_route_mirror": pos.sum() * 0} if mirrored_route else {}
        if not square and not vertical:
            return {**out, "loss_flip": pos.sum() * 0}
        mirror = self.model.adapter(batch.mirror_tokens[square]) if square else pos[:0]
        flipped = [flip_axis(caps[i], HORIZONTAL) for i in square]
        texts = flipped + flipped + [caps[i] for i in square] + [flip_axis(caps[i], VERTICAL) for i in vertical]
        images = torch.cat([pos[square], mirror, mirror, pos[vertical]])
        r = len(square)
        if mirrored_route and square:
            logits, inputs, valid = self.model.encoder.score_and_route(texts, images)
            rows = torch.tensor(square, device=pos.device)
            out["loss_route_mirror"] = route_distillation_loss(
                route[0][rows] - inputs[2 * r:3 * r], teacher_pass.inputs[rows] - teacher_pass.mirror_inputs[rows],
                route[1][rows] & valid[2 * r:3 * r], teacher_pass.valid[rows] & teacher_pass.mirror_valid[rows])
        else:
            logits = self.model.encoder.score(texts, images)
        wins, loss = [], pos.new_zeros(())
        if square:  # scored above: (I, flip c), (mirror I, flip c), (mirror I, c); (I, c) is the positive
            out["loss_flip_square"], won = flip_square_loss(pos_l[square], logits[:r], logits[r:2 * r],
                                                            logits[2 * r:3 * r])
            loss, wins = loss + out["loss_flip_square"], [won]
        if vertical:
            w = torch.tensor([weight[i] for i in vertical], dtype=logits.dtype, device=logits.device)
            out["loss_flip_vertical"] = weighted_flip_loss(pos_l[vertical], logits[3 * r:], w)
            loss, wins = loss + out["loss_flip_vertical"], wins + [pos_l[vertical] > logits[3 * r:]]
        out["loss_flip"] = loss
        out["flip_acc"] = torch.cat(wins).float().mean().detach()
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


def same_image(image_ids: Sequence[str]) -> torch.Tensor:
    """[B, B] bool: rows i and j show the same image."""
    _, inverse = np.unique(np.asarray(image_ids), return_inverse=True)
    inverse = torch.from_numpy(inverse.reshape(-1))
    return inverse[:, None] == inverse[None, :]


@torch.no_grad()
def teacher_scores(teacher: EDJEModel, batch: TrainBatch, neg: Negatives, route: bool = False,
                   mirror: bool = False, cells: bool = False) -> Tuple[torch.Tensor, Optional[TeacherPass]]:
    """(The teacher's ITM logits on the same pairs, in the same order, as EDJEObjectives scores them, its route
    inputs on the positive pairs from the same pass when `route`, else None); `mirror` adds the route inputs of
    (mirrored image, caption) for every row (zeros where a row has no mirror); `cells` the teacher adapter's tokens of
    the positives' images (with or without `route`)."""
    texts, b, k = pair_layout(batch, neg)
    pos = teacher.adapter(batch.tokens)
    negi = teacher.adapter(neg.image_tokens.reshape(b * k, *neg.image_tokens.shape[2:]))
    pairs = torch.cat([pos, negi, pos.repeat_interleave(k, dim=0)])
    extra = TeacherPass(cells=pos) if cells else None
    if not route:
        return teacher.encoder.score(texts, pairs), extra
    logits, inputs, valid = teacher.encoder.score_and_route(texts, pairs)
    out = TeacherPass(inputs[:b], valid[:b], cells=pos if cells else None)
    if mirror:
        if batch.mirror_tokens is None:
            raise ValueError("the teacher's mirrored route inputs need the batch's mirrored images")
        _, out.mirror_inputs, out.mirror_valid = teacher.encoder.score_and_route(
            list(batch.captions), teacher.adapter(batch.mirror_tokens))
    return logits, out


def caption_side_flips(model: EDJEModel, balance: FlipBalance, name: str, captions: Sequence[str], pos: torch.Tensor,
                       pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
    """loss_<name> and <name>_acc: each positive (logit `pos_l`) against its caption's flip by `balance` on the same
    image (adapter tokens `pos`), weighted by the balance; a zero loss when no caption has a weighted flip."""
    weight = [balance.weight(c) for c in captions]
    flips = [balance.flip(c) if w > 0 else None for c, w in zip(captions, weight)]
    return caption_negatives_loss(model, name, flips, weight, pos, pos_l)


def caption_negatives_loss(model: EDJEModel, name: str, negatives: Sequence[Optional[str]], weights: Sequence[float],
                           pos: torch.Tensor, pos_l: torch.Tensor) -> Dict[str, torch.Tensor]:
    """loss_<name> and <name>_acc: each positive (logit `pos_l`) against its caption-side negative on the same image
    (adapter tokens `pos`), weighted; rows with no negative or a zero weight sit out, and none left gives a zero
    loss."""
    rows = [i for i, (text, w) in enumerate(zip(negatives, weights)) if text is not None and w > 0]
    if not rows:
        return {f"loss_{name}": pos.sum() * 0}
    neg_l = model.encoder.score([negatives[i] for i in rows], pos[rows])
    w = torch.tensor([weights[i] for i in rows], dtype=neg_l.dtype, device=neg_l.device)
    return {f"loss_{name}": weighted_flip_loss(pos_l[rows], neg_l, w),
            f"{name}_acc": (pos_l[rows] > neg_l).float().mean().detach()}
