"""The one ranking rule shared by evaluation and serving: ITM logit, optionally fused with the first stage.

BLIP-style fusion ranks by ``ITM logit + w x first-stage cosine``. The weight belongs to the
checkpoint (chosen on a validation split, recorded in its config.json under "ranking"), so that
an evaluation describes exactly the ranking that the served model returns.

The ranking score is not a probability (a fused score is ~ 32 x cosine: sigmoid of it is 1.0 for
every good candidate). Platt scaling, fitted on a validation split and recorded beside the weight,
maps it to one: ``relevance = sigmoid(a x score + b)``, the probability that a first-stage
candidate is a true match (evaluation/calibration.py fits a, b). Checkpoints without it keep
``sigmoid(score)``.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import fsspec
import numpy as np

RANKING_KEY = "ranking"


@dataclass(frozen=True)
class RankingConfig:
    """How a checkpoint's scores become a ranking; ``chosen_on`` says where w was selected."""

    first_stage_weight: float = 0.0
    chosen_on: Optional[str] = None
    # Platt scaling of the score: relevance = sigmoid(scale x score + bias); None = not calibrated.
    calibration_scale: Optional[float] = None
    calibration_bias: Optional[float] = None
    calibrated_on: Optional[str] = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.first_stage_weight) or self.first_stage_weight < 0:
            raise ValueError(f"first_stage_weight must be a finite number >= 0, got {self.first_stage_weight}")
        if (self.calibration_scale is None) != (self.calibration_bias is None):
            raise ValueError("calibration_scale and calibration_bias go together")
        if self.calibrated and not (np.isfinite(self.calibration_scale) and np.isfinite(self.calibration_bias)
                                    and self.calibration_scale >= 0):
            raise ValueError(f"calibration must be finite with scale >= 0, got "
                             f"({self.calibration_scale}, {self.calibration_bias})")

    @property
    def calibrated(self) -> bool:
        """Whether relevance is a fitted probability (else sigmoid of the raw score)."""
        return self.calibration_scale is not None

    def probability(self, scores) -> np.ndarray:
        """Relevance of ranking scores: sigmoid(scale x score + bias), or sigmoid(score) when not calibrated."""
        x = np.asarray(scores, dtype=np.float64)
        if self.calibrated:
            x = self.calibration_scale * x + self.calibration_bias
        # exp of -|x| only: no overflow for any score.
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def describe(self) -> str:
        """The rule in words (GET /v1/info, reports)."""
        score = "ITM logit" + (f" + {self.first_stage_weight:g} x first-stage cosine" if self.first_stage_weight else "")
        if self.calibrated:
            b = self.calibration_bias
            return f"score = {score}; relevance = sigmoid({self.calibration_scale:.4g} x score {'-' if b < 0 else '+'} {abs(b):.4g})"
        return f"score = {score}; relevance = sigmoid(score) (not calibrated)"

    def with_calibration(self, scale: float, bias: float, where: str) -> "RankingConfig":
        """This rule with a fitted Platt scaling."""
        return dataclasses.replace(self, calibration_scale=float(scale), calibration_bias=float(bias), calibrated_on=where)

    def fuse(self, itm_logits, similarity):
        """Ranking scores: ITM logits plus w x first-stage similarity (numpy arrays or torch tensors)."""
        if self.first_stage_weight == 0:
            return itm_logits
        # torch is looked up, not imported: a tensor means it is loaded, and the ingress (numpy only) starts without it.
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(itm_logits, torch.Tensor):
            return itm_logits + self.first_stage_weight * torch.as_tensor(similarity, dtype=itm_logits.dtype,
                                                                          device=itm_logits.device)
        return itm_logits + self.first_stage_weight * np.asarray(similarity, dtype=np.float32)


def read_ranking(checkpoint: str) -> RankingConfig:
    """The checkpoint's ranking rule (plain ITM, uncalibrated, when it records none)."""
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
