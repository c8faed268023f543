"""Orientation negatives for contrastive backbone training: a caption with a side of orientation ("left-facing",
"facing left") gets its `flip_orientation` ("right-facing") as a false caption of its image in the image->text
softmax.

A mirror pair (mirror_pairs.py) can be told apart by where things stand whenever its caption also names sides of
place ("to the left of"); this negative differs from the true caption in the way things face alone. Each is drawn
with its FlipBalance weight, so that a blind model of the sides of orientation is at chance between the two.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from edje.training.caption_rewrites import ORIENTATION, FlipBalance


class OrientationNegatives:
    """Each training caption's orientation flip (pre-tokenised) and the weight it is drawn with."""

    def __init__(self, captions: Sequence[str], tokenizer, device: torch.device):
        balance = FlipBalance(captions, ORIENTATION)
        self.flipped = [balance.flip(c) for c in captions]
        self.weight = np.array([balance.weight(c) for c in captions])
        has = [i for i, f in enumerate(self.flipped) if f is not None]
        self.row = np.full(len(captions), -1)
        self.row[has] = np.arange(len(has))
        self.ids = tokenizer([self.flipped[i] for i in has]).to(device) if has else None

    def draw(self, caption_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Batch rows (by caption index) whose negative is used this step: each with its weight."""
        return np.flatnonzero(rng.random(len(caption_rows)) < self.weight[caption_rows])

    def token_ids(self, caption_rows: np.ndarray) -> torch.Tensor:
        """The flipped captions' token ids, one row each."""
        return self.ids[torch.from_numpy(self.row[caption_rows])]

    def matches(self, caption_rows: np.ndarray, batch_captions: Sequence[str]) -> np.ndarray:
        """bool [batch rows, negatives]: where a flipped caption is a batch row's own caption (a mirror whose caption
        has sides of orientation alone), so that it is a positive there."""
        flipped = [self.flipped[r] for r in caption_rows]
        return np.array([[c == f for f in flipped] for c in batch_captions], dtype=bool).reshape(len(batch_captions),
                                                                                                  len(flipped))
