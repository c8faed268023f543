"""Retrieval recall: rankings from similarity matrices and R@1/5/10, in both directions.

Below training and evaluation alike: the backbone's training reports its zero-shot recall with the
same arithmetic that evaluation reports the reranker's with.
"""
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
