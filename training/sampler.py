"""Which rows make each training batch: shuffled, with a growing share of near-neighbour clusters.

EDJE learns binding only from negatives that differ in binding. Random batches almost never
hold such pairs (a family's twins are 3 images among thousands); batches made only of them
stall the ITM loss at ln(1 + k) from the first step. So a run starts on shuffled batches and
then fills a growing share of each batch with clusters of near neighbours in the backbone's
image embedding (ELIP's global hard-sample batches): there, in-batch mining finds the twins.

The plan is a pure function of (seed, epoch, the step the epoch starts at), so a resumed run
rebuilds the same batches and skips the ones it had consumed. Rows are drawn per image (one
of its caption rows at random), so an epoch sees each image once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from edje.schemas.cli_options import option
from edje.training.hard_batches import neighbour_clusters


@dataclass(frozen=True)
class CurriculumConfig:
    """Share of each batch drawn as neighbour clusters: 0 until `start`, then linear to `max_fraction` at `end`."""

    max_fraction: float = option(0.0, flag="--cluster-fraction", help="final share of each batch drawn as clusters "
                                 "of near neighbours (ELIP hard batches)")
    start: int = option(0, flag="--cluster-start", help="step at which clusters start")
    end: int = option(0, flag="--cluster-end", help="step at which the cluster share is full")
    cluster_size: int = option(4, help="images per neighbour cluster")

    def fraction(self, step: int) -> float:
        """Cluster share of the batch at optimizer step ``step``."""
        if self.max_fraction <= 0 or step < self.start:
            return 0.0
        if self.end <= self.start:
            return self.max_fraction
        return self.max_fraction * min(1.0, (step - self.start) / (self.end - self.start))


class BatchPlanner:
    """Batches of row indices for one worker's rows, epoch by epoch."""

    def __init__(self, image_ids: Sequence[str], image_emb: np.ndarray, batch_size: int,
                 curriculum: CurriculumConfig, seed: int):
        self.batch_size, self.curriculum, self.seed = batch_size, curriculum, seed
        ids = np.asarray(image_ids)
        uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        self.rows_of = [np.flatnonzero(inverse == i) for i in range(len(uniq))]
        self.num_images = len(uniq)
        self.clusters: List[np.ndarray] = []
        if curriculum.max_fraction > 0:
            emb = np.asarray(image_emb, np.float32)[first]
            self.clusters = neighbour_clusters(emb, curriculum.cluster_size, np.random.default_rng(seed))

    @property
    def batches_per_epoch(self) -> int:
        """Whole batches in an epoch (each image once, the partial last batch dropped)."""
        return self.num_images // self.batch_size

    def epoch(self, epoch: int, first_step: int, num_batches: int | None = None) -> List[np.ndarray]:
        """Row indices of each batch of ``epoch``, which starts at optimizer step ``first_step``."""
        rng = np.random.default_rng([self.seed, epoch])
        n_batches = self.batches_per_epoch if num_batches is None else num_batches
        used = np.zeros(self.num_images, bool)
        random_order = iter(rng.permutation(self.num_images))
        cluster_order = iter(rng.permutation(len(self.clusters)))
        batches = []
        for b in range(n_batches):
            share = self.curriculum.fraction(first_step + b)
            picked: List[int] = []
            want = int(round(share * self.batch_size))
            while len(picked) + self.curriculum.cluster_size <= want:
                c = next(cluster_order, None)
                if c is None:
                    break
                members = [int(i) for i in self.clusters[c] if not used[i]]
                used[members] = True
                picked += members
            while len(picked) < self.batch_size:
                i = next(random_order, None)
                if i is None:
                    break
                if not used[i]:
                    used[i] = True
                    picked.append(int(i))
            if len(picked) < self.batch_size:
                break  # the epoch ran out of images
            images = np.asarray(picked)
            batches.append(np.array([self.rows_of[i][rng.integers(len(self.rows_of[i]))] for i in images]))
        return batches
