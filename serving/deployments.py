"""Serve deployments of the plain FirstStage and Miner classes; the first stage's shell adds its metrics.

The cores (serving/first_stage.py, serving/miner.py) load no Ray Serve; what only a replica does, exporting
metrics (serving/serve_metrics.py) and answering the readiness probe, lives here.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

from ray import serve

from edje.serving.first_stage import FirstStage, ImageQueryHits
from edje.serving.miner import Miner
from edje.serving.serve_metrics import FirstStageMetrics


class MeasuredFirstStage(FirstStage):
    """FirstStage whose searches are timed and whose index rows are a gauge."""

    def __init__(self, *args, **kwargs):
        self.metrics = FirstStageMetrics()  # before FirstStage.__init__, whose first sync_live sets the gauge
        super().__init__(*args, **kwargs)
        self.metrics.corpus_rows.set(len(self.index))

    def sync_live(self) -> int:
        """FirstStage.sync_live, then the gauge when images were added."""
        added = super().sync_live()
        if added:
            self.metrics.corpus_rows.set(len(self.index))
        return added

    def search_text(self, query: str, k: int) -> ImageQueryHits:
        """FirstStage.search_text (which FirstStage.search calls), timed."""
        with _timed(self.metrics, "text"):
            return super().search_text(query, k)

    def search_image(self, image_id: str, query: Optional[str], image_weight: float, k: int) -> ImageQueryHits:
        """FirstStage.search_image, timed."""
        with _timed(self.metrics, "image"):
            return super().search_image(image_id, query, image_weight, k)

    def search_vector(self, vector, k: int) -> List[Tuple[str, float]]:
        """FirstStage.search_vector, timed."""
        with _timed(self.metrics, "vector"):
            return super().search_vector(vector, k)

    def ready(self) -> int:
        """Images in the index (GET /readyz calls it: an answer means the replica serves)."""
        return self.size()


@contextmanager
def _timed(metrics: FirstStageMetrics, kind: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.search_seconds.observe(time.perf_counter() - start, tags={"kind": kind})


FirstStageDeployment = serve.deployment(MeasuredFirstStage, name="FirstStage")
MinerDeployment = serve.deployment(Miner, name="Miner")
