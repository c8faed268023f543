"""Linear probes of what a frozen backbone's outputs know about the sample world's scenes.

EDJE can rerank only with what the stored tokens carry, so before training on them we ask:
can a ridge regression read colour and shape off them? Four probes, each fitted on one set of
images and scored on another of the same world:

- ``colour_present`` / ``shape_present``: which colours / shapes are in the image, from the
  pooled image embedding (multi-label; accuracy over every (image, value) pair, against the
  base rate of always answering "absent");
- ``local_colour``: an object's colour from the one token under its centre;
- ``local_shape``: an object's shape from the 3x3 tokens around its centre (concatenated).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import numpy as np

from edje.sampleworld.scene import COLOURS, SHAPES, Scene

ALPHAS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)


@dataclass(frozen=True)
class ProbeResult:
    """Held-out accuracy of one probe and what a constant answer would score."""

    name: str
    accuracy: float
    baseline: float
    alpha: float
    n_train: int
    n_test: int

    def as_dict(self) -> Dict:
        """JSON-ready dict, percentages rounded to 0.1."""
        return {"name": self.name, "accuracy": round(100 * self.accuracy, 1),
                "baseline": round(100 * self.baseline, 1), "alpha": self.alpha,
                "n_train": self.n_train, "n_test": self.n_test}


def _ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Closed-form ridge weights (bias in the last row; the bias is not penalised)."""
    xb = np.hstack([x, np.ones((len(x), 1), x.dtype)])
    reg = alpha * np.eye(xb.shape[1], dtype=np.float64)
    reg[-1, -1] = 0.0
    if xb.shape[0] >= xb.shape[1]:
        return np.linalg.solve(xb.T @ xb + reg, xb.T @ y)
    # Fewer rows than features: the dual form is the cheaper solve.
    k = xb @ xb.T + alpha * np.eye(len(xb))
    return xb.T @ np.linalg.solve(k, y)


def _predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1), x.dtype)]) @ w


def _score(pred: np.ndarray, y: np.ndarray, multilabel: bool, regression: bool = False) -> float:
    if regression:  # R^2, averaged over the outputs
        return float(np.mean(1 - ((pred - y) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)))
    if multilabel:
        return float(((pred > 0.5) == (y > 0.5)).mean())
    return float((pred.argmax(1) == y.argmax(1)).mean())


@dataclass(frozen=True)
class RidgeProbe:
    """A fitted linear probe: the training rows' standardisation and ridge weights (bias in the last row)."""

    mean: np.ndarray
    std: np.ndarray
    weights: np.ndarray
    alpha: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Scores [N, outputs] of raw features [N, F]."""
        return _predict(self.weights, ((x - self.mean) / self.std).astype(np.float64))


def fit_ridge(x_train: np.ndarray, y_train: np.ndarray, score: Callable[[np.ndarray, np.ndarray], float]) -> RidgeProbe:
    """Standardise, choose the ridge strength on the last fifth of the training rows by ``score(pred, y)``, refit on all."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xt = ((x_train - mean) / std).astype(np.float64)
    cut = int(len(xt) * 0.8)
    best = max(ALPHAS, key=lambda a: score(_predict(_ridge(xt[:cut], y_train[:cut], a), xt[cut:]), y_train[cut:]))
    return RidgeProbe(mean, std, _ridge(xt, y_train, best), best)


def fit_probe(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
              multilabel: bool, regression: bool = False) -> ProbeResult:
    """Standardise, choose the ridge strength on a fifth of the training rows, refit, score held out
    (regression: R^2 of continuous targets, against 0 for always answering the mean)."""
    probe = fit_ridge(x_train, y_train, lambda p, y: _score(p, y, multilabel, regression))
    pred, best = probe.predict(x_test), probe.alpha
    if regression:
        return ProbeResult(name, _score(pred, y_test, False, True), 0.0, best, len(x_train), len(x_test))
    if multilabel:
        baseline = float((y_test < 0.5).mean())
    else:
        baseline = float(np.bincount(y_test.argmax(1), minlength=y_test.shape[1]).max() / len(y_test))
    return ProbeResult(name, _score(pred, y_test, multilabel), baseline, best, len(x_train), len(x_test))


def presence_labels(scenes: Sequence[Scene], attribute: str) -> np.ndarray:
    """[N, V] 0/1: which values of ``attribute`` ("shape" or "colour") each scene holds."""
    values = SHAPES if attribute == "shape" else tuple(COLOURS)
    y = np.zeros((len(scenes), len(values)), np.float64)
    for i, s in enumerate(scenes):
        for o in s.objects:
            y[i, values.index(getattr(o, attribute))] = 1.0
    return y


def token_grid(tokens: np.ndarray) -> np.ndarray:
    """[N, g*g, d] tokens in row-major grid order as [N, g, g, d]."""
    n, t, d = tokens.shape
    g = int(round(np.sqrt(t)))
    if g * g != t:
        raise ValueError(f"{t} tokens do not form a square grid")
    return tokens.reshape(n, g, g, d)


def centre_cell(center: Sequence[float], g: int) -> tuple:
    """(column, row) of the grid token under a centre given as fractions of the image side."""
    return min(g - 1, int(center[0] * g)), min(g - 1, int(center[1] * g))


def window_at(grid: np.ndarray, cx: int, cy: int, window: int) -> np.ndarray:
    """The ``window`` x ``window`` tokens of one image's [g, g, d] grid around (cx, cy), edge-clamped, concatenated."""
    g, half = grid.shape[0], window // 2
    rows = np.clip(np.arange(cy - half, cy + half + 1), 0, g - 1)
    cols = np.clip(np.arange(cx - half, cx + half + 1), 0, g - 1)
    return grid[np.ix_(rows, cols)].reshape(-1)


def local_features(tokens: np.ndarray, scenes: Sequence[Scene], attribute: str, window: int) -> tuple:
    """Per object: the ``window`` x ``window`` tokens around its centre (edge-clamped, concatenated),
    and its one-hot ``attribute``. ``tokens`` is [N, g*g, d] in row-major grid order."""
    values = SHAPES if attribute == "shape" else tuple(COLOURS)
    grid = token_grid(tokens)
    feats: List[np.ndarray] = []
    labels: List[int] = []
    for i, s in enumerate(scenes):
        for o in s.objects:
            feats.append(window_at(grid[i], *centre_cell(o.center, grid.shape[1]), window))
            labels.append(values.index(getattr(o, attribute)))
    return np.stack(feats), np.eye(len(values))[labels]


def grid_tokens(tokens: np.ndarray) -> np.ndarray:
    """Drop prefix tokens (class / register) so the rest form a square patch grid."""
    t = tokens.shape[1]
    g = int(np.floor(np.sqrt(t)))
    return tokens[:, t - g * g:]


def run_probes(train: tuple, test: tuple) -> List[ProbeResult]:
    """All four probes; ``train``/``test`` are (tokens [N, n, d], pooled [N, e], scenes)."""
    (tok_tr, emb_tr, sc_tr), (tok_te, emb_te, sc_te) = train, test
    tok_tr, tok_te = grid_tokens(tok_tr), grid_tokens(tok_te)
    out = []
    for attr in ("colour", "shape"):
        out.append(fit_probe(f"{attr}_present", emb_tr, presence_labels(sc_tr, attr), emb_te,
                             presence_labels(sc_te, attr), multilabel=True))
    for attr, window in (("colour", 1), ("shape", 3)):
        xtr, ytr = local_features(tok_tr, sc_tr, attr, window)
        xte, yte = local_features(tok_te, sc_te, attr, window)
        out.append(fit_probe(f"local_{attr}", xtr, ytr, xte, yte, multilabel=False))
    return out
