"""Retrieval recall: rankings from similarity matrices, reranking of the top k, R@1/5/10."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

KS = (1, 5, 10)


def top_rankings(scores: np.ndarray, depth: int) -> np.ndarray:
    """Indices of the `depth` best columns per row, best first ([Q, depth])."""
    depth = min(depth, scores.shape[1])
    part = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def rerank(rankings: np.ndarray, k: int, scores: np.ndarray) -> np.ndarray:
    """Reorder the first k entries of each ranking by `scores` [Q, k] (higher first); the rest keep their order."""
    if scores.shape != (rankings.shape[0], k):
        raise ValueError(f"rerank scores must be [{rankings.shape[0]}, {k}], got {list(scores.shape)}")
    order = np.argsort(-scores, axis=1, kind="stable")
    out = rankings.copy()
    out[:, :k] = np.take_along_axis(rankings[:, :k], order, axis=1)
    return out


def recall(rankings: np.ndarray, correct: Sequence[np.ndarray], ks: Sequence[int] = KS) -> Dict[str, float]:
    """Percent of queries with a correct item among the first k ranked, for each k."""
    if len(correct) != rankings.shape[0]:
        raise ValueError(f"{rankings.shape[0]} rankings but {len(correct)} answer sets")
    hit_rank = np.full(rankings.shape[0], np.inf)
    for q, answers in enumerate(correct):
        pos = np.flatnonzero(np.isin(rankings[q], answers))
        if pos.size:
            hit_rank[q] = pos[0]
    return {f"r{k}": round(float(100.0 * np.mean(hit_rank < k)), 2) for k in ks}


def t2i_answers(caption_image: np.ndarray) -> List[np.ndarray]:
    """Text-to-image answer sets: each caption's one image."""
    return [np.array([i]) for i in caption_image]


def i2t_answers(caption_image: np.ndarray, num_images: int) -> List[np.ndarray]:
    """Image-to-text answer sets: all captions of each image."""
    return [np.flatnonzero(caption_image == i) for i in range(num_images)]


def embedding_recall(text_emb: np.ndarray, image_emb: np.ndarray, caption_image: np.ndarray) -> Dict[str, Dict[str, float]]:
    """Zero-shot R@1/5/10 in both directions from normalised embeddings."""
    sim = text_emb @ image_emb.T
    depth = max(KS)
    return {
        "t2i": recall(top_rankings(sim, depth), t2i_answers(caption_image)),
        "i2t": recall(top_rankings(sim.T, depth), i2t_answers(caption_image, image_emb.shape[0])),
    }


def within_group_accuracy(rankings: np.ndarray, correct: Sequence[np.ndarray], group: np.ndarray,
                          k: int) -> Dict:
    """Binding diagnostic: among queries whose answer and at least one other member of its group
    (a sample-world family: the answer's binding twins) are in the first k, the percent where the
    answer is ranked above every twin. ``group`` maps each ranked item to its group id."""
    hits = total = 0
    for q, answers in enumerate(correct):
        top = rankings[q, :k]
        pos = np.flatnonzero(np.isin(top, answers))
        if not pos.size:
            continue
        fam = group[top[pos[0]]]
        twins = np.flatnonzero((group[top] == fam) & ~np.isin(top, answers))
        if not twins.size:
            continue
        total += 1
        hits += int(pos[0] < twins[0])
    return {"accuracy": round(100.0 * hits / total, 2) if total else None, "queries": total}


def within_group_pairs_by_kind(rankings: np.ndarray, correct: Sequence[np.ndarray], group: np.ndarray,
                               kinds: Sequence[frozenset], k: int) -> Dict[str, Dict]:
    """Binding per twin kind: for each (answer, twin of its group) pair in a query's first k, whether the
    answer is ranked above the twin, bucketed by what tells them apart: the symmetric difference of the
    two items' swap kinds (``kinds[item]``, e.g. {"colour"}), named "colour", "shape", ... for one swap and
    "two swaps" otherwise. Returns {kind: {"accuracy": percent, "pairs": n}}."""
    hits: Dict[str, int] = {}
    total: Dict[str, int] = {}
    for q, answers in enumerate(correct):
        top = rankings[q, :k]
        pos = np.flatnonzero(np.isin(top, answers))
        if not pos.size:
            continue
        answer = top[pos[0]]
        for t in np.flatnonzero((group[top] == group[answer]) & ~np.isin(top, answers)):
            diff = kinds[answer] ^ kinds[top[t]]
            name = next(iter(diff)) if len(diff) == 1 else "two swaps"
            total[name] = total.get(name, 0) + 1
            hits[name] = hits.get(name, 0) + int(pos[0] < t)
    return {name: {"accuracy": round(100.0 * hits[name] / total[name], 2), "pairs": total[name]}
            for name in sorted(total)}
