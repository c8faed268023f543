"""Answer-versus-twin pairs of a sample world, bucketed by what actually differs between the two scenes.

A twin is named by the swaps that made it, but two swaps can make a relation twin: a colour twin and a
shape twin of two equal-sized objects are the same objects with their places exchanged. So a pair is
bucketed by comparing the scenes themselves (`scene_difference`). Relation pairs are further split by
axis, object count, caption form and whether both objects lie on one side of the image centre (there the
subject's side alone does not decide the relation). Every figure carries a 95 % interval from a bootstrap
over families, since the pairs of one family are not independent.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from edje.sampleworld.phrases import bare
from edje.sampleworld.registry import ALL_TWIN_KINDS, kind_of
from edje.sampleworld.scene import Scene

# Every bucket a pair can fall in, as the worlds declare their twin kinds ("two swaps" last); reports list them so.
KINDS = ALL_TWIN_KINDS


def scene_difference(a: Scene, b: Scene) -> str:
    """The twin kind in which two scenes of one family differ alone (e.g. "colour" when objects at the same cells
    differ in colour only, "relation" when the same objects are placed otherwise), else "two swaps"; each world
    names its own kinds."""
    return kind_of(a).difference(a, b)


def relation_subsets(a: Scene, b: Scene, caption: str) -> Dict[str, str]:
    """Labels of a relation pair: axis of the flip, object count, caption form, same side or not."""
    cols = {o.key()[:3]: o.cell for o in a.objects}
    flipped_cols = any(cols[o.key()[:3]][0] != o.cell[0] for o in b.objects)
    axis = 0 if flipped_cols else 1
    words = {bare(w) for w in caption.split()}
    form = "between" if "between" in words else "pronoun" if words & {"it", "its"} else "preposition"
    return {"axis": "horizontal" if axis == 0 else "vertical", "objects": str(len(a.objects)), "form": form,
            "side": side_of(a, axis)}


def side_of(scene: Scene, axis: int) -> str:
    """"same side" when every object's centre lies on one side of the image centre along `axis` (0: x, 1: y)."""
    centres = [o.center[axis] for o in scene.objects]
    return "same side" if all(c < 0.5 for c in centres) or all(c > 0.5 for c in centres) else "both sides"


def bootstrap_ci(hits: np.ndarray, clusters: np.ndarray, rounds: int = 1000, seed: int = 0) -> List[float]:
    """95 % percentile interval (percent) of the mean of `hits`, resampling whole clusters with replacement."""
    ids, inverse = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inverse, weights=hits.astype(float), minlength=len(ids))
    counts = np.bincount(inverse, minlength=len(ids))
    draw = np.random.default_rng(seed).integers(0, len(ids), size=(rounds, len(ids)))
    means = sums[draw].sum(1) / np.maximum(counts[draw].sum(1), 1)
    return [round(100 * float(np.percentile(means, 2.5)), 1), round(100 * float(np.percentile(means, 97.5)), 1)]


def _summary(hits: np.ndarray, families: np.ndarray) -> Dict:
    return {"accuracy": round(100.0 * float(hits.mean()), 2), "pairs": int(len(hits)),
            "families": int(len(np.unique(families))), "ci95": bootstrap_ci(hits, families)}


def answer_twin_pairs(rankings: np.ndarray, correct: Sequence[np.ndarray], group: np.ndarray, k: int):
    """(query, answer item, twin item, answer ranked above twin) for each twin of the first answer in a query's top k."""
    for q, answers in enumerate(correct):
        top = rankings[q, :k]
        pos = np.flatnonzero(np.isin(top, answers))
        if not pos.size:
            continue
        answer = top[pos[0]]
        for t in np.flatnonzero((group[top] == group[answer]) & ~np.isin(top, answers)):
            yield q, answer, top[t], bool(pos[0] < t)


def pairs_by_scene(rankings: np.ndarray, correct: Sequence[np.ndarray], group: np.ndarray, scenes: Sequence[Scene],
                   k: int, caption_of: Optional[Callable[[int, int], str]] = None) -> Dict[str, Dict]:
    """{"by_kind": per scene difference, accuracy, pairs, families and 95 % interval of answer-above-twin;
    "relation_subsets": the relation pairs split by side, axis, objects and (with `caption_of(query, answer
    item)`, the query's caption) caption form}."""
    rows = []
    for q, answer, twin, hit in answer_twin_pairs(rankings, correct, group, k):
        kind = scene_difference(scenes[answer], scenes[twin])
        labels = relation_subsets(scenes[answer], scenes[twin], caption_of(q, answer) if caption_of else "") if (
            kind == "relation") else {}
        if not caption_of:
            labels.pop("form", None)
        rows.append((kind, hit, group[answer], labels))

    def summary(sel) -> Dict:
        return _summary(np.array([r[1] for r in sel]), np.array([r[2] for r in sel]))
    by_kind = {kind: summary([r for r in rows if r[0] == kind]) for kind in sorted({r[0] for r in rows})}
    rel = [r for r in rows if r[0] == "relation"]
    subsets = {f"{field}: {value}": summary([r for r in rel if r[3].get(field) == value])
               for field in ("side", "axis", "objects", "form")
               for value in sorted(Counter(r[3][field] for r in rel if field in r[3]))}
    return {"by_kind": by_kind, "relation_subsets": subsets}
