"""What the quickstart runs on each kind of sample world unless told otherwise: one record per world, by name.

Paths are relative to the repository. A world's reranker and backbone weights need not be shipped yet: the quickstart
then stops before Ray starts, naming the missing file (jobs/quickstart.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from edje.schemas.shipped import DEFAULT_RERANKER, SHIPPED_BACKBONE_WEIGHTS, WORLD_BACKBONES


@dataclass(frozen=True)
class WorldPreset:
    """One world's defaults: its kind, its reranker and backbone weights, and the world that reranker was trained on
    (whose train split counts as seen)."""

    kind: str  # a registered world kind (sampleworld/registry.py)
    checkpoint: str
    # The weights of the checkpoint's backbone (its config.json names the backbone) where the repository keeps them.
    backbone_weights: str
    train_world_seed: int
    train_world_n_train: int
    train_world_n_val: int
    # Share of two-object families with both objects on one side of the image centre; None: the kind's own default.
    same_side_rate: Optional[float] = None
    # Text queries per test image written from a held-out (test-only) caption template, added to its first captions
    # so that the report can give figures over them (EvalConfig.held_out_template_queries); worlds that record no
    # caption templates have none.
    held_out_template_queries: int = 0


WORLD_PRESETS: Dict[str, WorldPreset] = {
    # The shipped rerankers were trained on world 100 (BENCHMARKS.md); the quickstart's test worlds draw a quarter of
    # their two-object families on one side, where the report's same-side subset lives.
    "shapes": WorldPreset(kind="shapes", checkpoint=DEFAULT_RERANKER,
                          backbone_weights=SHIPPED_BACKBONE_WEIGHTS[WORLD_BACKBONES["shapes"]], train_world_seed=100,
                          train_world_n_train=12000, train_world_n_val=500, same_side_rate=0.25),
    # Trained on world 300 (`sampleworld generate --world open --seed 300 --n-train 12000 --n-val 1000 --n-test 0`).
    "open": WorldPreset(kind="open", checkpoint="checkpoints/edje-open-c16",
                        backbone_weights=SHIPPED_BACKBONE_WEIGHTS[WORLD_BACKBONES["open"]], train_world_seed=300,
                        train_world_n_train=12000, train_world_n_val=1000, held_out_template_queries=1),
}
DEFAULT_WORLD = "shapes"


def preset(name: str) -> WorldPreset:
    """The preset of world `name`; ValueError naming the known ones."""
    try:
        return WORLD_PRESETS[name]
    except KeyError:
        raise ValueError(f"world must be one of {sorted(WORLD_PRESETS)}, got {name!r}") from None


def per_world(field: str) -> str:
    """Each world's value of a preset field, for --help: "shapes 100, open 300" (a None: the kind's default)."""
    def shown(p: WorldPreset) -> str:
        value = getattr(p, field)
        return f"as `sampleworld generate --world {p.kind}` draws" if value is None else str(value)

    return ", ".join(f"{name} {shown(p)}" for name, p in WORLD_PRESETS.items())
