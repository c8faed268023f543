"""The one ranking rule shared by evaluation and serving: ITM logit, optionally fused with the first stage.

BLIP-style fusion ranks by ``ITM logit + w x first-stage cosine``. The weight belongs to the
checkpoint (chosen on a validation split, recorded in its config.json under "ranking"), so that
an evaluation describes exactly the ranking that the served model returns.

The ranking score is not a probability (a fused score is ~ 32 x cosine: sigmoid of it is 1.0 for
every good candidate). Platt scaling, fitted on a validation split and recorded beside the weight,
maps it to one: ``relevance = sigmoid(a x score + b)``, the probability that a first-stage
candidate is a true match (evaluation/calibration.py fits a, b). Checkpoints without it keep
``sigmoid(score)``.

A rule may also switch its weight on the first stage's confidence in a text query: where the query's best
candidate's cosine is below a threshold, the cosine is added with a lower weight. A first stage is least sure of the
wordings its text tower reads least well, and there its cosine misleads the fused score more than it helps. An image
query (image-to-text ranking) fuses with the one weight: its confidence says nothing of a wording.

A rule may also name query towers: text towers over the tables' image space (students of `edje distill-text-tower`,
which keep the backbone's image tower bit for bit) whose unit embeddings of a query, each times its weight, join the
backbone's own before renormalising. The first stage then searches with that vector, and the fused cosine is its
cosine, so the towers belong to the rule: its weights were fitted on that cosine.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import asdict, dataclass
from typing import Hashable, Optional, Sequence, Tuple

import fsspec
import numpy as np

RANKING_KEY = "ranking"


@dataclass(frozen=True)
class QueryTower:
    """A text tower joining the backbone's in embedding a query: open_clip model `name`, its weights, its weight."""

    name: str
    pretrained: Optional[str] = None
    weight: float = 1.0
    weights_sha256: Optional[str] = None

    def __post_init__(self) -> None:
        if not (np.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"query tower {self.name}: weight must be a finite number > 0, got {self.weight}")

    def backbone_config(self, checkpoint: Optional[str] = None):
        """The tower as a BackboneConfig, its weight file found as every job finds one (beside `checkpoint` first)."""
        from edje.schemas.config import BackboneConfig
        from edje.schemas.weights import find_weights

        return BackboneConfig(self.name, find_weights(self.pretrained, checkpoint=checkpoint),
                              weights_sha256=self.weights_sha256)

    @classmethod
    def parse(cls, spec: str, weight: float = 1.0) -> "QueryTower":
        """A tower from `NAME` or `NAME=WEIGHTS` (a command line's form)."""
        name, _, pretrained = spec.partition("=")
        if not name:
            raise ValueError(f"a query tower is NAME or NAME=WEIGHTS, got {spec!r}")
        return cls(name, pretrained or None, weight)


@dataclass(frozen=True)
class RankingConfig:
    """How a checkpoint's scores become a ranking; ``chosen_on`` says where w was selected."""

    first_stage_weight: float = 0.0
    chosen_on: Optional[str] = None
    # Platt scaling of the score: relevance = sigmoid(scale x score + bias); None = not calibrated.
    calibration_scale: Optional[float] = None
    calibration_bias: Optional[float] = None
    calibrated_on: Optional[str] = None
    # The confidence switch: a text query whose best candidate's first-stage cosine is below the threshold fuses
    # with the low weight; None = one weight for every query.
    low_confidence_weight: Optional[float] = None
    confidence_threshold: Optional[float] = None
    # Text towers whose query embeddings join the backbone's (the first stage's query, and so the fused cosine).
    query_towers: Tuple[QueryTower, ...] = ()

    def __post_init__(self) -> None:
        # config.json holds them as a list of objects
        object.__setattr__(self, "query_towers", tuple(t if isinstance(t, QueryTower) else QueryTower(**t)
                                                       for t in self.query_towers))
        for name in ("first_stage_weight", "low_confidence_weight"):
            w = getattr(self, name)
            if w is not None and not (np.isfinite(w) and w >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {w}")
        if (self.low_confidence_weight is None) != (self.confidence_threshold is None):
            raise ValueError("low_confidence_weight and confidence_threshold go together")
        if self.switched and not np.isfinite(self.confidence_threshold):
            raise ValueError(f"confidence_threshold must be finite, got {self.confidence_threshold}")
        if (self.calibration_scale is None) != (self.calibration_bias is None):
            raise ValueError("calibration_scale and calibration_bias go together")
        if self.calibrated and not (np.isfinite(self.calibration_scale) and np.isfinite(self.calibration_bias)
                                    and self.calibration_scale >= 0):
            raise ValueError(f"calibration must be finite with scale >= 0, got "
                             f"({self.calibration_scale}, {self.calibration_bias})")

    @property
    def switched(self) -> bool:
        """Whether the weight follows the first stage's confidence in each query."""
        return self.confidence_threshold is not None

    @property
    def fuses(self) -> bool:
        """Whether any query's score adds the first-stage cosine (else the ITM logit alone)."""
        return bool(self.first_stage_weight or (self.switched and self.low_confidence_weight))

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

    def formula(self) -> str:
        """The ranking score in words ("ITM logit + 64 x first-stage cosine")."""
        if self.switched:
            score = (f"ITM logit + w x first-stage cosine, w = {self.first_stage_weight:g}, or "
                     f"{self.low_confidence_weight:g} for a text query whose best candidate's cosine is below "
                     f"{self.confidence_threshold:.4g}")
        else:
            score = "ITM logit" + (f" + {self.first_stage_weight:g} x first-stage cosine" if self.first_stage_weight else "")
        if not self.query_towers:
            return score
        return score + "; queries embedded by the backbone's text tower + " + " + ".join(
            f"{t.weight:g} x {t.name}" + (f" ({t.pretrained})" if t.pretrained else "") for t in self.query_towers)

    def describe(self) -> str:
        """The rule in words (GET /v1/info, reports)."""
        score = self.formula()
        if self.calibrated:
            b = self.calibration_bias
            return f"score = {score}; relevance = sigmoid({self.calibration_scale:.4g} x score {'-' if b < 0 else '+'} {abs(b):.4g})"
        return f"score = {score}; relevance = sigmoid(score) (not calibrated)"

    def for_image_queries(self) -> "RankingConfig":
        """The rule an image query ranks texts by: the one weight (the switch reads a text query's confidence)."""
        return dataclasses.replace(self, low_confidence_weight=None, confidence_threshold=None)

    def with_calibration(self, scale: float, bias: float, where: str) -> "RankingConfig":
        """This rule with a fitted Platt scaling."""
        return dataclasses.replace(self, calibration_scale=float(scale), calibration_bias=float(bias), calibrated_on=where)

    def fuse(self, itm_logits, similarity, queries: Optional[Sequence[Hashable]] = None):
        """Ranking scores: ITM logits plus w x first-stage similarity (numpy arrays or torch tensors). The rows of
        2-D arrays are queries; a 1-D array is one query's candidates, unless `queries` names each pair's query."""
        if not self.fuses:
            return itm_logits
        sim = np.asarray(similarity, dtype=np.float32)
        term = (self.first_stage_weight if not self.switched else self.query_weights(sim, queries)) * sim
        # torch is looked up, not imported: a tensor means it is loaded, and the ingress (numpy only) starts without it.
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(itm_logits, torch.Tensor):
            return itm_logits + torch.as_tensor(term, dtype=itm_logits.dtype, device=itm_logits.device)
        return itm_logits + term.astype(np.float32)

    def query_weights(self, similarity: np.ndarray, queries: Optional[Sequence[Hashable]] = None) -> np.ndarray:
        """Each pair's fusion weight under the switch (laid out as `fuse` reads `similarity`): the low weight
        where its query's best candidate's cosine is below the threshold."""
        sim = np.asarray(similarity, dtype=np.float32)
        if sim.size == 0:
            return np.zeros_like(sim)
        if queries is not None:
            if len(queries) != sim.size:
                raise ValueError(f"{sim.size} pairs but {len(queries)} query keys")
            keys = {}
            which = np.array([keys.setdefault(q, len(keys)) for q in queries])
            best = np.full(len(keys), -np.inf, np.float32)
            np.maximum.at(best, which, sim.ravel())
            best = best[which].reshape(sim.shape)
        else:
            best = sim.max(axis=-1, keepdims=True) if sim.ndim > 1 else sim.max()
        return np.where(best >= self.confidence_threshold, self.first_stage_weight,
                        self.low_confidence_weight).astype(np.float32)


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
