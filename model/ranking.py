"""The one ranking rule shared by evaluation and serving: ITM logit, optionally fused with the first stage.

BLIP-style fusion ranks by ``ITM logit + w x first-stage cosine``. The weight belongs to the
checkpoint (chosen on a validation split, recorded in its config.json under "ranking"), so that
an evaluation describes exactly the ranking that the served model returns.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional

import fsspec
import numpy as np
import torch

RANKING_KEY = "ranking"


@dataclass(frozen=True)
class RankingConfig:
    """How a checkpoint's scores become a ranking; ``chosen_on`` says where w was selected."""

    first_stage_weight: float = 0.0
    chosen_on: Optional[str] = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.first_stage_weight) or self.first_stage_weight < 0:
            raise ValueError(f"first_stage_weight must be a finite number >= 0, got {self.first_stage_weight}")

    def fuse(self, itm_logits, similarity):
        """Ranking scores: ITM logits plus w x first-stage similarity (numpy arrays or torch tensors)."""
        if self.first_stage_weight == 0:
            return itm_logits
        if isinstance(itm_logits, torch.Tensor):
            return itm_logits + self.first_stage_weight * torch.as_tensor(similarity, dtype=itm_logits.dtype,
                                                                          device=itm_logits.device)
        return itm_logits + self.first_stage_weight * np.asarray(similarity, dtype=np.float32)


def read_ranking(checkpoint: str) -> RankingConfig:
    """The checkpoint's ranking rule (plain ITM when it records none)."""
    fs, root = fsspec.core.url_to_fs(checkpoint)
    with fs.open(f"{root}/config.json") as f:
        meta = json.load(f)
    return RankingConfig(**meta.get(RANKING_KEY, {}))


def write_ranking(checkpoint: str, ranking: RankingConfig) -> None:
    """Record the ranking rule in the checkpoint's config.json (the weights are untouched)."""
    fs, root = fsspec.core.url_to_fs(checkpoint)
    with fs.open(f"{root}/config.json") as f:
        meta = json.load(f)
    meta[RANKING_KEY] = asdict(ranking)
    with fs.open(f"{root}/config.json", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
