"""Platt scaling of the ranking score: fit (a, b) so that sigmoid(a x score + b) is the probability of a match.

Fitted on a validation split's reranked candidates: every (text, image) pair that the first stage
put in a query's top k, labelled 1 when the two belong together and 0 otherwise (both directions).
Platt's smoothed targets (N+ + 1) / (N+ + 2) and 1 / (N- + 2) keep the fit finite when the scores
separate the classes perfectly. The scale is held >= 0: a score that does not rise with relevance
gets a = 0, the base rate for every pair, rather than a probability that falls down the ranking.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np


def _loss_grad_hess(params: np.ndarray, x: np.ndarray, t: np.ndarray):
    z = params[0] * x + params[1]
    p = 0.5 * (1.0 + np.tanh(0.5 * z))  # sigmoid without overflow
    eps = 1e-12
    loss = -np.mean(t * np.log(p + eps) + (1 - t) * np.log(1 - p + eps))
    r = p - t
    grad = np.array([np.mean(r * x), np.mean(r)])
    w = p * (1 - p)
    hess = np.array([[np.mean(w * x * x), np.mean(w * x)], [np.mean(w * x), np.mean(w)]])
    return loss, grad, hess


def fit_platt(scores: np.ndarray, labels: np.ndarray, iterations: int = 100) -> Tuple[float, float]:
    """(a, b) minimising the cross-entropy of sigmoid(a x score + b) against Platt's smoothed labels."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    if len(s) != len(y):
        raise ValueError(f"{len(s)} scores but {len(y)} labels")
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        raise ValueError(f"calibration needs both true pairs and non-matching candidates (got {pos} and {neg})")
    t = np.where(y, (pos + 1) / (pos + 2), 1 / (neg + 2))
    # Newton on the standardised score (well conditioned), mapped back at the end.
    mu, sd = s.mean(), s.std() or 1.0
    x = (s - mu) / sd
    params = np.array([0.0, np.log(t.mean() / (1 - t.mean()))])
    loss = _loss_grad_hess(params, x, t)[0]
    for _ in range(iterations):
        loss, grad, hess = _loss_grad_hess(params, x, t)
        step = np.linalg.solve(hess + 1e-9 * np.eye(2), grad)
        scale = 1.0
        while scale > 1e-6:  # backtracking: Newton's full step can overshoot on near-separable data
            new = params - scale * step
            if _loss_grad_hess(new, x, t)[0] <= loss:
                break
            scale /= 2
        params = new
        if np.abs(scale * step).max() < 1e-10:
            break
    if params[0] < 0:  # the score falls with relevance: no information, only the base rate
        params = np.array([0.0, np.log(t.mean() / (1 - t.mean()))])
    a = params[0] / sd
    return float(a), float(params[1] - a * mu)


def calibration_report(probabilities: np.ndarray, labels: np.ndarray, bins: int = 10) -> Dict[str, float]:
    """Mean probability of true and other pairs, expected calibration error (equal-width bins), log loss."""
    p = np.asarray(probabilities, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    which = np.minimum((p * bins).astype(int), bins - 1)
    ece = sum(abs(p[which == b].mean() - y[which == b].mean()) * (which == b).mean()
              for b in range(bins) if (which == b).any())
    eps = 1e-12
    return {"pairs": int(len(p)), "true_pairs": int(y.sum()),
            "mean_p_true": round(float(p[y].mean()), 4) if y.any() else None,
            "mean_p_other": round(float(p[~y].mean()), 4) if (~y).any() else None,
            "ece": round(float(ece), 4),
            "log_loss": round(float(-np.mean(y * np.log(p + eps) + (~y) * np.log(1 - p + eps))), 4)}
