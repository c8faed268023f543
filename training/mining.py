"""In-batch hard-negative mining from the backbone's embedding similarities.

The candidates may be gathered across workers: the local batch occupies rows
[offset, offset + B) of the gathered arrays. Positives, rows of the same image and rows
with an identical caption are never chosen as negatives (they are false negatives).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence, Tuple

import torch


@dataclass(frozen=True)
class MinerConfig:
    """k negatives per sample, chosen by top-k similarity or sampled from softmax(sim / temperature)."""

    k: int = 4
    strategy: Literal["topk", "sample"] = "topk"
    temperature: float = 0.05

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.strategy not in ("topk", "sample"):
            raise ValueError(f"strategy must be 'topk' or 'sample', got {self.strategy!r}")


def negative_mask(
    image_ids: Sequence[str], captions: Sequence[str], all_image_ids: Sequence[str], all_captions: Sequence[str]
) -> torch.Tensor:
    """[B, N] True where gathered row j may serve as a negative for local row i."""
    img_code, cap_code = _codes([*all_image_ids, *image_ids]), _codes([*all_captions, *captions])
    local_img = torch.tensor([img_code[x] for x in image_ids])
    local_cap = torch.tensor([cap_code[x] for x in captions])
    all_img = torch.tensor([img_code[x] for x in all_image_ids])
    all_cap = torch.tensor([cap_code[x] for x in all_captions])
    return (local_img[:, None] != all_img[None, :]) & (local_cap[:, None] != all_cap[None, :])


def mine_hard_negatives(
    cfg: MinerConfig,
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    all_image_emb: torch.Tensor,
    all_text_emb: torch.Tensor,
    image_ids: Sequence[str],
    captions: Sequence[str],
    all_image_ids: Sequence[str],
    all_captions: Sequence[str],
    generator: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indices into the gathered rows: (negative images per caption [B, k], negative captions per image [B, k])."""
    b, n = image_emb.shape[0], all_image_emb.shape[0]
    if not (text_emb.shape[0] == len(image_ids) == len(captions) == b):
        raise ValueError("local embeddings, image ids and captions must have the same length")
    if not (all_text_emb.shape[0] == len(all_image_ids) == len(all_captions) == n):
        raise ValueError("gathered embeddings, image ids and captions must have the same length")
    allowed = negative_mask(image_ids, captions, all_image_ids, all_captions).to(image_emb.device)
    short = allowed.sum(dim=1) < cfg.k
    if short.any():
        raise ValueError(f"{int(short.sum())} samples have fewer than k={cfg.k} valid negatives among {n} candidates; "
                         "use a larger batch or smaller k")
    with torch.no_grad():
        t2i = text_emb.float() @ all_image_emb.float().T  # caption -> candidate images
        i2t = image_emb.float() @ all_text_emb.float().T  # image -> candidate captions
        return _pick(cfg, t2i, allowed, generator), _pick(cfg, i2t, allowed, generator)


def _pick(cfg: MinerConfig, sim: torch.Tensor, allowed: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    sim = sim.masked_fill(~allowed, float("-inf"))
    if cfg.strategy == "topk":
        return sim.topk(cfg.k, dim=1).indices
    probs = torch.softmax(sim / cfg.temperature, dim=1)
    # Rows whose softmax mass underflows to a few entries still need k distinct draws.
    probs = torch.where(allowed, probs + 1e-12, torch.zeros_like(probs))
    return torch.multinomial(probs.cpu(), cfg.k, replacement=False, generator=generator).to(sim.device)


def _codes(values: Sequence[str]) -> dict:
    codes: dict = {}
    for v in values:
        codes.setdefault(v, len(codes))
    return codes
