"""Reranking of the top k and the binding diagnostics (within-family accuracy) over rankings.

R@1/5/10 itself is model/recall.py (the backbone's training reports it too).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np


def rerank(rankings: np.ndarray, k: int, scores: np.ndarray) -> np.ndarray:
    """Reorder the first k entries of each ranking by `scores` [Q, k] (higher first); the rest keep their order."""
    if scores.shape != (rankings.shape[0], k):
        raise ValueError(f"rerank scores must be [{rankings.shape[0]}, {k}], got {list(scores.shape)}")
    order = np.argsort(-scores, axis=1, kind="stable")
    out = rankings.copy()
    out[:, :k] = np.take_along_axis(rankings[:, :k], order, axis=1)
    return out


def within_group_accuracy(rankings: np.ndarray, correct: Sequence[np.ndarray], group: np.ndarray,
                          k: int) -> Dict:
    """Binding diagnostic: among queries whose answer and at least one other member of its group
    (a sample-world family: the answer's binding twins) are in the first k, the percent where the
    answer is ranked above every twin. ``group`` maps each ranked item to its group id."""
    hits = total = 0
    for q, answers in enumerate(correct):
        found = answer_and_twins(rankings[q, :k], answers, group)
        if found is None or not found[1]:
            continue
        total += 1
        hits += int(found[0] < min(found[1].values()))
    return {"accuracy": round(100.0 * hits / total, 2) if total else None, "queries": total}


def answer_and_twins(top: np.ndarray, answers: np.ndarray, group: np.ndarray) -> Optional[Tuple[int, Dict[int, int]]]:
    """In one query's ranked items `top`: (the first answer's position, {twin item: position}) for the other items of
    that answer's group, or None where no answer is ranked."""
    pos = np.flatnonzero(np.isin(top, answers))
    if not pos.size:
        return None
    twins = np.flatnonzero((group[top] == group[top[pos[0]]]) & ~np.isin(top, answers))
    return int(pos[0]), {int(top[i]): int(i) for i in twins}

