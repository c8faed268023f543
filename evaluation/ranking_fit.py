"""Fitting a checkpoint's ranking rule on a validation split (model/ranking.py): the fusion weight, and optionally
the confidence switch, chosen by text->image + image->text R@1 over the reranked candidates.

The switch gives a text query whose best candidate's first-stage cosine is below a threshold a lower weight; the
weight above it stays the one fitted for every query. A validation split written in its training captions' own
phrasing rarely shows the first stage unsure; `rewrite_captions` rewrites a share of its captions by EDA's random swap
or deletion or AEDA's punctuation (model/text_augment.py: no word list, nothing of any test template), so that the fit
meets wordings the text tower reads less well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from edje.model.ranking import RankingConfig
from edje.model.text_augment import OPERATIONS, augment_batch
from edje.schemas.annotations import Annotations

FUSION_WEIGHTS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# Thresholds tried: quantiles of the split's per-query confidence, so the grid follows the backbone's cosine scale.
THRESHOLD_QUANTILES = np.linspace(0.05, 0.95, 19)


@dataclass(frozen=True)
class FusionSplit:
    """One direction's reranked candidates, all [queries, k]: ITM logits, first-stage cosines (best first) and
    whether each candidate is an answer; `text_queries` False for image->text."""

    itm: np.ndarray
    sim: np.ndarray
    labels: np.ndarray
    text_queries: bool = True

    def rule(self, ranking: RankingConfig) -> RankingConfig:
        """The rule these queries rank by (an image query's has no switch)."""
        return ranking if self.text_queries else ranking.for_image_queries()


def candidate_labels(candidates: np.ndarray, answers: Sequence[np.ndarray]) -> np.ndarray:
    """bool [Q, k]: whether each query's candidate is one of its answers."""
    return np.stack([np.isin(row, ans) for row, ans in zip(candidates, answers)])


def top1_recall(split: FusionSplit, rule: RankingConfig) -> float:
    """R@1 (percent) of the split's queries when each ranks its candidates by `rule`."""
    fused = split.rule(rule).fuse(split.itm, split.sim)
    first = np.argmax(fused, axis=1)  # the first of tied maxima, as the stable reranking puts it first
    return 100.0 * float(split.labels[np.arange(len(first)), first].mean())


def fit_first_stage_weight(splits: Sequence[FusionSplit], where: str,
                           switch: bool = False) -> Tuple[RankingConfig, Dict[str, float]]:
    """The weight with the best summed R@1 over `splits` (ties: the smaller); with `switch`, then the lower weight
    and threshold (on a text query's best cosine) that raise it most, if any do (ties: the smaller threshold and
    weight). Returns the rule and the one-weight sweep."""
    def total(rule: RankingConfig) -> float:
        return sum(top1_recall(s, rule) for s in splits)

    sweep = {w: total(RankingConfig(w)) for w in FUSION_WEIGHTS}
    w = max(FUSION_WEIGHTS, key=lambda v: (sweep[v], -v))
    rule, best = RankingConfig(w, chosen_on=where), sweep[w]
    texts = [s for s in splits if s.text_queries and s.sim.size]
    if switch and texts:
        confidence = np.concatenate([s.sim.max(axis=1) for s in texts])
        for t in np.unique(np.round(np.quantile(confidence, THRESHOLD_QUANTILES), 4)):
            for lo in FUSION_WEIGHTS:
                if lo == w:  # one weight: the sweep's
                    continue
                candidate = RankingConfig(w, chosen_on=where, low_confidence_weight=lo,
                                          confidence_threshold=float(t))
                r1 = total(candidate)
                if r1 > best:
                    rule, best = candidate, r1
    return rule, {str(v): round(r1, 2) for v, r1 in sweep.items()}


def rewrite_captions(ann: Annotations, share: float, seed: int = 0,
                     ops: Sequence[str] = OPERATIONS) -> Tuple[Annotations, List[int]]:
    """`ann` with `share` of its captions rewritten by a random one of `ops` (model/text_augment.py; the images and
    their order kept), and the rows rewritten."""
    captions, rows = augment_batch(ann.captions, share, np.random.default_rng(seed), ops=ops)
    return Annotations(ann.path, ann.image_ids, ann.image_paths, list(captions), ann.caption_image), rows
