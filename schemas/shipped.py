"""What the repository ships for its embedded default: one table from backbone name to trained weights.

Jobs look defaults up here, so a new or retrained small backbone is one line to change. Paths are
relative to the repository root; `edje.schemas.weights.find_weights` makes them absolute for the machine at hand.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BACKBONE = "edje-tiny-convvit"  # the project's small backbone (conv stem + ViT), trained on the sample world
# The rerankers shipped for that backbone, both with relations learned from image-caption pairs alone (no scene
# graph, no word list): the compressed default (16 stored tokens a image) and the local one it was distilled from
# (64 tokens), which stays selectable with --checkpoint. Two earlier pairs stay for comparison and for tests: the
# scene-graph relation pair (edje-c16-rel, edje-local-rel: grounding and the world's word parse) and the pair
# without relations (edje-c16-bind, edje-local-bind).
DEFAULT_RERANKER = "checkpoints/edje-c16-caprel"
LOCAL_RERANKER = "checkpoints/edje-local-caprel"
SHIPPED_BACKBONE_WEIGHTS: Dict[str, str] = {
    "edje-tiny-convvit": "checkpoints/edje-tiny-convvit-sw.safetensors",
    "edje-tiny-clip": "checkpoints/edje-tiny-clip-sw.safetensors",  # the previous default: no shape (BENCHMARKS.md)
    # The open-vocabulary world's backbone (551 emoji nouns; BENCHMARKS.md "The open-vocabulary world").
    "edje-tiny-convvit-128": "checkpoints/edje-open-convvit-128.safetensors",
}
# The backbone each sample world kind's shipped weights were trained on (the stand-in for a user's pretrained ViT).
WORLD_BACKBONES: Dict[str, str] = {"shapes": DEFAULT_BACKBONE, "open": "edje-tiny-convvit-128"}
