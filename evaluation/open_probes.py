"""Linear probes of what a frozen backbone's outputs know about an open world's things (the shapes world's are
in probes.py, with the same ridge probes, fitted on one set of images and scored on another of the same world).

A reranker can tell "a dog" from "a wolf", "two" from "three" or "left of" from "right of" only with what the
stored tokens carry. Eight probes:

- ``noun_present``: from the pooled embedding, a score per noun of the world; right when the top-scoring noun
  is in the image (baseline: always naming the noun most often present in training);
- ``noun_present_in_group``: the same scores, per present noun with neighbours (dog: wolf, fox, ...): right when
  it outscores every neighbour absent from the image (baseline: chance among them);
- ``local_noun`` / ``local_noun_in_group``: a thing's noun from the 3x3 tokens around its centre, top-1 over
  every noun / over its neighbour group (baseline: the most frequent noun / chance in the group);
- ``local_size``, ``local_count``, ``local_facing`` (directional glyphs only): from the same 3x3 tokens;
- ``position``: the named thing is found where it stands: the noun probe, fitted with empty windows as
  negatives and slid over every grid token of the image, scores the thing's noun highest within one token of
  its centre (baseline: a guess of a uniformly random token).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from edje.evaluation.probes import ProbeResult, RidgeProbe, centre_cell, fit_probe, fit_ridge, grid_tokens, token_grid, window_at

WINDOW = 3
OPEN_PROBES = ("noun_present", "noun_present_in_group", "local_noun", "local_noun_in_group", "local_size",
               "local_count", "local_facing", "position")
SIZES = ("small", "large")
COUNTS = (1, 2, 3)
FACINGS = ("left", "right")


def _top1(pred: np.ndarray, y: np.ndarray) -> float:
    """Share of rows whose top-scoring output is a positive one."""
    return float(y[np.arange(len(y)), pred.argmax(1)].mean())


def balanced(y: np.ndarray) -> np.ndarray:
    """Targets with each output's column divided by its count of positives.

    Ridge on raw one-hot targets favours frequent nouns (a noun seen 20 times outscores one seen twice on the
    rare noun's own images); scaled so, each noun's weights are its mean feature direction, whatever its count."""
    return y / np.maximum(y.sum(0), 1.0)


def noun_presence(scenes: Sequence, nouns: Sequence[str]) -> np.ndarray:
    """[N, V] 0/1: which of the world's nouns each scene holds."""
    index = {n: i for i, n in enumerate(nouns)}
    y = np.zeros((len(scenes), len(nouns)), np.float64)
    for i, s in enumerate(scenes):
        for o in s.objects:
            y[i, index[o.noun]] = 1.0
    return y


def _group_members(nouns: Sequence[str], groups: Mapping[str, str]) -> Dict[str, np.ndarray]:
    """Each noun's group as indices into ``nouns`` (the noun itself included)."""
    by_group: Dict[str, List[int]] = {}
    for i, n in enumerate(nouns):
        by_group.setdefault(groups[n], []).append(i)
    return {n: np.array(by_group[groups[n]]) for n in nouns}


def _in_group(scores: np.ndarray, truth: Sequence[int], allowed: Sequence[np.ndarray]) -> Tuple[float, float, int]:
    """(accuracy, chance, rows) of picking ``truth`` by top score among ``allowed`` (rows with one choice skipped)."""
    hits, chance = [], []
    for row, (t, cands) in enumerate(zip(truth, allowed)):
        if len(cands) > 1:
            hits.append(cands[scores[row, cands].argmax()] == t)
            chance.append(1.0 / len(cands))
    return (float(np.mean(hits)), float(np.mean(chance)), len(hits)) if hits else (float("nan"), float("nan"), 0)


def object_windows(grid: np.ndarray, scenes: Sequence) -> Tuple[np.ndarray, List[Tuple[int, object]]]:
    """The 3x3 tokens around each thing's centre [objects, 9 * d], and (image index, object) of each row."""
    rows = [(i, o) for i, s in enumerate(scenes) for o in s.objects]
    feats = np.stack([window_at(grid[i], *centre_cell(o.center, grid.shape[1]), WINDOW) for i, o in rows])
    return feats, rows


def _empty_windows(grid: np.ndarray, scenes: Sequence, rng: np.random.Generator) -> np.ndarray:
    """Per image, the window of one token two or more tokens away from every thing's centre (none if no such token)."""
    g, out = grid.shape[1], []
    for i, s in enumerate(scenes):
        centres = np.array([centre_cell(o.center, g) for o in s.objects])
        cells = [(x, y) for y in range(g) for x in range(g) if np.abs(centres - (x, y)).max(1).min() >= 2]
        if cells:
            out.append(window_at(grid[i], *cells[int(rng.integers(len(cells)))], WINDOW))
    return np.stack(out) if out else np.zeros((0, WINDOW * WINDOW * grid.shape[-1]), grid.dtype)


def _attribute_probe(name: str, values: Sequence, xtr: np.ndarray, rows_tr: list, xte: np.ndarray, rows_te: list,
                     attribute: str) -> ProbeResult:
    """A categorical attribute of a thing from its window (things without a value, e.g. no facing, left out)."""
    keep_tr = [k for k, (_, o) in enumerate(rows_tr) if getattr(o, attribute) in values]
    keep_te = [k for k, (_, o) in enumerate(rows_te) if getattr(o, attribute) in values]
    if not keep_tr or not keep_te:
        raise ValueError(f"{name}: no thing with a {attribute} among the probe's train or test images; probe more images")
    onehot = lambda rows, keep: np.eye(len(values))[[values.index(getattr(rows[k][1], attribute)) for k in keep]]
    return fit_probe(name, xtr[keep_tr], onehot(rows_tr, keep_tr), xte[keep_te], onehot(rows_te, keep_te), multilabel=False)


def _localise(probe: RidgeProbe, grid: np.ndarray, noun_index: Dict[str, int], scenes: Sequence) -> Tuple[float, float]:
    """(accuracy, baseline) of the ``position`` probe on test images (see the module docstring)."""
    g = grid.shape[1]
    cells = np.array([(x, y) for y in range(g) for x in range(g)])
    hits, chance = [], []
    for i, scene in enumerate(scenes):
        windows = np.stack([window_at(grid[i], x, y, WINDOW) for x, y in cells])
        named = sorted({o.noun for o in scene.objects})
        # Only the image's own nouns' columns: the probe has one per noun of the world.
        scores = RidgeProbe(probe.mean, probe.std, probe.weights[:, [noun_index[n] for n in named]], probe.alpha).predict(windows)
        for o in scene.objects:
            # Right when within one token of any thing with that noun (a scene may show a noun twice).
            centres = np.array([centre_cell(p.center, g) for p in scene.objects if p.noun == o.noun])
            near = np.abs(cells[:, None, :] - centres[None]).max(-1).min(1) <= 1
            hits.append(bool(near[scores[:, named.index(o.noun)].argmax()]))
            chance.append(float(near.mean()))
    return float(np.mean(hits)), float(np.mean(chance))


def run_open_probes(train: tuple, test: tuple, nouns: Sequence[str], groups: Mapping[str, str],
                    seed: int = 0) -> Tuple[List[ProbeResult], Dict]:
    """Every probe of OPEN_PROBES, in that order; ``train``/``test`` are (tokens [N, n, d], pooled [N, e], scenes),
    ``nouns`` the world's nouns and ``groups`` each noun's neighbour group. Also returns coverage figures."""
    (tok_tr, emb_tr, sc_tr), (tok_te, emb_te, sc_te) = train, test
    grid_tr, grid_te = token_grid(grid_tokens(tok_tr)), token_grid(grid_tokens(tok_te))
    index = {n: i for i, n in enumerate(nouns)}
    members = _group_members(nouns, groups)
    out: List[ProbeResult] = []

    y_tr, y_te = noun_presence(sc_tr, nouns), noun_presence(sc_te, nouns)
    pooled = fit_ridge(emb_tr, balanced(y_tr), _top1)
    scores = pooled.predict(emb_te)
    out.append(ProbeResult("noun_present", _top1(scores, y_te), float(y_te[:, y_tr.sum(0).argmax()].mean()),
                           pooled.alpha, len(emb_tr), len(emb_te)))
    pairs = [(i, index[o.noun]) for i, s in enumerate(sc_te) for o in s.objects]
    allowed = [np.array([j for j in members[nouns[t]] if j == t or y_te[i, j] == 0]) for i, t in pairs]
    acc, chance, n = _in_group(scores[[i for i, _ in pairs]], [t for _, t in pairs], allowed)
    out.append(ProbeResult("noun_present_in_group", acc, chance, pooled.alpha, len(emb_tr), n))

    xtr, rows_tr = object_windows(grid_tr, sc_tr)
    xte, rows_te = object_windows(grid_te, sc_te)
    lab_tr = np.array([index[o.noun] for _, o in rows_tr])
    lab_te = np.array([index[o.noun] for _, o in rows_te])
    eye = np.eye(len(nouns))
    local = fit_ridge(xtr, balanced(eye[lab_tr]), _top1)
    scores = local.predict(xte)
    out.append(ProbeResult("local_noun", _top1(scores, eye[lab_te]), float(np.mean(lab_te == np.bincount(lab_tr).argmax())),
                           local.alpha, len(xtr), len(xte)))
    acc, chance, n = _in_group(scores, lab_te, [members[nouns[t]] for t in lab_te])
    out.append(ProbeResult("local_noun_in_group", acc, chance, local.alpha, len(xtr), n))

    out.append(_attribute_probe("local_size", SIZES, xtr, rows_tr, xte, rows_te, "size"))
    out.append(_attribute_probe("local_count", COUNTS, xtr, rows_tr, xte, rows_te, "count"))
    out.append(_attribute_probe("local_facing", FACINGS, xtr, rows_tr, xte, rows_te, "facing"))

    empty = _empty_windows(grid_tr, sc_tr, np.random.default_rng(seed))
    # Empty windows interleaved with the things' rows, so the ridge strength is chosen on both kinds.
    order = np.random.default_rng(seed).permutation(len(xtr) + len(empty))
    x_loc = np.concatenate([xtr, empty])[order]
    y_loc = balanced(np.concatenate([eye[lab_tr], np.zeros((len(empty), len(nouns)))])[order])
    finder = fit_ridge(x_loc, y_loc, lambda p, y: _top1(p[y.any(1)], y[y.any(1)]))
    acc, chance = _localise(finder, grid_te, index, sc_te)
    out.append(ProbeResult("position", acc, chance, finder.alpha, len(x_loc), len(rows_te)))

    seen = set(lab_tr.tolist())
    coverage = {"nouns": len(nouns), "nouns_in_probe_train": len(seen), "nouns_in_probe_test": len(set(lab_te.tolist())),
                "test_things_with_noun_seen_in_train": round(100 * float(np.mean([t in seen for t in lab_te])), 1)}
    return out, coverage
