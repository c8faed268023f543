"""Mirror pairs for contrastive backbone training: an image mirrored left-right beside its original, with its caption's
horizontal words reversed, so each is the other's hard negative on what a mirror changes (which way a thing faces,
which side it is on).

The caption's rewrite is `caption_rewrites.flip_axis` on the horizontal axis (a rule of English over spatial words:
"left-facing" -> "right-facing", "to the left of" -> "to the right of"; no word list), which is exactly what a
left-right mirror does to a true caption. An image whose caption has no horizontal word is not mirrored: its mirror
would be a second positive of the same caption, not a negative.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch

from edje.training.caption_rewrites import HORIZONTAL, flip_axis


def mirrored_captions(captions: Sequence[str]) -> Tuple[list, np.ndarray]:
    """Each caption as it reads for its image mirrored left-right (unchanged where it has no horizontal word), and
    bool [N]: whether it has one."""
    flipped = [flip_axis(c, HORIZONTAL) for c in captions]
    return [f if f is not None else c for f, c in zip(flipped, captions)], np.array([f is not None for f in flipped])


def mirror_rows(mirrorable: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Batch rows to add again mirrored: ``fraction`` of the batch (rounded), drawn among rows whose caption can be
    mirrored, in ascending order."""
    candidates = np.flatnonzero(mirrorable)
    k = min(len(candidates), int(round(fraction * len(mirrorable))))
    return np.sort(rng.choice(candidates, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)


def mirror_pair_mask(source: torch.Tensor) -> torch.Tensor:
    """[R, R] True where two different rows show one image, once mirrored (``source``: each row's original row)."""
    same = source[:, None] == source[None, :]
    return same & ~torch.eye(len(source), dtype=torch.bool, device=source.device)


def add_mirrors(pixels: torch.Tensor, ids: torch.Tensor, captions: list, again: np.ndarray,
                mirrored_ids: torch.Tensor, mirrored: list) -> Tuple[torch.Tensor, torch.Tensor, list, torch.Tensor]:
    """The batch (uint8 pixels [B, H, W, 3], token ids, caption strings) with rows ``again`` added once more, mirrored
    left-right with their reversed captions (``mirrored_ids``: their token ids, ``mirrored``: their strings, both from
    `mirrored_captions`); and each row's original row [B + k]."""
    rows = torch.from_numpy(again).to(pixels.device)
    source = torch.cat([torch.arange(len(pixels), device=pixels.device), rows])
    return (torch.cat([pixels, pixels[rows].flip(2)]), torch.cat([ids, mirrored_ids]),
            captions + list(mirrored), source)
