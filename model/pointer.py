"""The pointer: where a caption's phrase is in the image, from the phrase's own words and the image cells alone.

Each relation's subject and object phrase (model/relation_roles.py `mention_roles`, a rule of English) gets a query
from the mean of its own input word embeddings: never the relation word, never a position or role vector, and
never a [MASK]ed piece. The query attends over the image tokens, which a local adapter keeps on the backbone's
square grid (row-major, row 0 at the top, as model/adapters.py `grid_position` lays them out), and the phrase's
place is the attention-weighted mean of the cell centres, x_hat in [0, 1]^2. The grid is the token layout, not
anything the data says. A caption's relation then gives x_hat an order to learn (training/losses.py
`pointer_order_loss`), and `inject` hands x_hat to the phrase's states where the route compares them.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def cell_centres(num_cells: int) -> torch.Tensor:
    """[num_cells, 2] (x, y) centre of each row-major cell of a square grid, in [0, 1]."""
    side = math.isqrt(num_cells)
    if side * side != num_cells:
        raise ValueError(f"the pointer needs a square grid of image tokens, got {num_cells}")
    j = torch.arange(num_cells)
    return torch.stack([(j % side + 0.5) / side, (j // side + 0.5) / side], dim=1)


class Pointer(nn.Module):
    """Phrase queries over image cells -> expected cell centre x_hat; `inject` maps x_hat into the encoder's width."""

    def __init__(self, hidden: int, num_cells: int, dim: int = 64, inject_std: float = 1.0):
        super().__init__()
        self.dim = dim
        self.query = nn.Linear(hidden, dim)
        self.key = nn.Linear(hidden, dim)
        self.inject = nn.Linear(2, hidden, bias=False)
        nn.init.normal_(self.inject.weight, std=inject_std)
        # Rebuilt from the config, never stored: the grid is the layout of the image tokens.
        self.register_buffer("cells", cell_centres(num_cells), persistent=False)

    def forward(self, words: torch.Tensor, phrases: torch.Tensor, image_tokens: torch.Tensor):
        """words [B, T, h] input word embeddings, phrases [B, P, T] 0/1 weights of each phrase's pieces, image_tokens
        [B, m, h] -> (x_hat [B, P, 2], valid [B, P]: the phrase has a piece to read)."""
        count = phrases.sum(-1)
        mean = torch.einsum("bpt,bth->bph", phrases.to(words.dtype), words) / count.clamp_min(1)[..., None]
        # Both sides normalised without parameters: word embeddings and adapter outputs start at norms of a few
        # tenths, which left the attention uniform (x_hat equal for every phrase) and the order loss without a slope.
        q = self.query(F.layer_norm(mean, mean.shape[-1:]))
        k = self.key(F.layer_norm(image_tokens, image_tokens.shape[-1:]))
        attention = (torch.einsum("bpd,bmd->bpm", q, k) / math.sqrt(self.dim)).softmax(-1)
        return attention @ self.cells.to(attention.dtype), count > 0
