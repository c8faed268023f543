"""Contrastive batches built from clusters of near neighbours (ELIP's global hard-sample batches).

With random batches, the sample world's contrastive task is solved by colours, sizes and
layout: shape never separates an image from its in-batch negatives, so the backbone never
learns it. A batch made of clusters of images that the *current* model finds similar (the
same colours, say) can only be solved with what the model does not see yet. Part of each
batch stays random so the easy structure is kept.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from edje.storage.embedding_index import EmbeddingIndex


def neighbour_clusters(emb: np.ndarray, cluster_size: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Greedy disjoint clusters: a random seed and its nearest not-yet-used neighbours (cosine)."""
    if cluster_size < 2:
        raise ValueError(f"cluster_size must be >= 2, got {cluster_size}")
    n = len(emb)
    depth = min(n, 4 * cluster_size)
    _, nbrs = EmbeddingIndex.exact(emb).search(emb, depth)
    used = np.zeros(n, bool)
    clusters = []
    for seed in rng.permutation(n):
        if used[seed]:
            continue
        members = [seed] + [j for j in nbrs[seed] if j >= 0 and j != seed and not used[j]][:cluster_size - 1]
        if len(members) < cluster_size:
            continue  # its neighbourhood is taken; the seed stays for the random part
        used[members] = True
        clusters.append(np.asarray(members))
    return clusters


def mixed_batches(n: int, batch_size: int, fraction: float, clusters: Sequence[np.ndarray],
                  rng: np.random.Generator) -> List[np.ndarray]:
    """One epoch of batches: ``fraction`` of each from whole clusters, the rest random rows.

    Every row appears at most once per epoch; rows left over at the end are dropped like a
    loader's last partial batch would be."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    size = len(clusters[0]) if len(clusters) else 1
    per_batch = int(round(fraction * batch_size / size)) if len(clusters) else 0
    order = rng.permutation(len(clusters))
    n_batches = n // batch_size
    if per_batch:
        n_batches = min(n_batches, len(clusters) // per_batch)
    taken = np.zeros(n, bool)
    cluster_rows = []
    for b in range(n_batches):
        rows = np.concatenate([clusters[c] for c in order[b * per_batch:(b + 1) * per_batch]]) if per_batch else \
            np.zeros(0, np.int64)
        taken[rows] = True
        cluster_rows.append(rows)
    free = rng.permutation(np.flatnonzero(~taken))
    batches, cursor = [], 0
    for rows in cluster_rows:
        need = batch_size - len(rows)
        batches.append(rng.permutation(np.concatenate([rows, free[cursor:cursor + need]])))
        cursor += need
    return batches


def same_words_mask(captions: Sequence[str]) -> np.ndarray:
    """[B, B] True where two different rows' captions hold the same bag of words.

    Such captions differ only in how their words bind (a family's twins): as contrastive
    negatives for a model that reads words as a bag they are indistinguishable, and they stall
    the loss, so they are left out of each other's softmax."""
    keys = [" ".join(sorted(c.lower().replace(",", " ").replace(";", " ").split())) for c in captions]
    codes = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ids = np.array([codes[k] for k in keys])
    same = ids[:, None] == ids[None, :]
    np.fill_diagonal(same, False)
    return same
