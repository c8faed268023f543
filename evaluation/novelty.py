"""Which test images a model saw in training: meanings that repeat a training scene of a reference world.

A world seed no run used is not unseen scene by scene: two scenes mean the same when their `Scene.signature()`
is equal (same objects, attributes and cells; background and jitter aside), and 138 of seed 9494's 1,000 test
images have exactly the meaning of a training image of world 100, the shipped checkpoints' training world. The
novel images are the others; recall and within-family accuracy over the queries whose answer is novel measure what
the model does on meanings it never saw. The reference world's scenes are sampled without rendering a pixel
(`sampleworld.world.sample_records`), or read from a generated world's world.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

import numpy as np

from edje.sampleworld.records import DEFAULT_KIND
from edje.sampleworld.registry import world_config
from edje.sampleworld.scene import Scene
from edje.sampleworld.world import WORLD_JSON, WorldConfig, load_world, sample_records

# The training world of the shipped checkpoints (BENCHMARKS.md): its train split is what they saw.
SHIPPED_TRAIN_WORLD = WorldConfig(seed=100, n_train=12000, n_val=500, n_test=0)


@dataclass(frozen=True)
class ReferenceWorld:
    """A training world to compare test scenes with: a generated world (folder or world.json), or a config whose
    scenes are sampled (nothing rendered); only the images of `splits` count as seen."""

    path: Optional[str] = None
    config: Optional[WorldConfig] = None
    splits: Tuple[str, ...] = ("train",)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.config is None):
            raise ValueError("a reference world is a generated world's path or a world config, exactly one")

    def signatures(self) -> FrozenSet[tuple]:
        """The meanings of every scene in the reference world's `splits`."""
        if self.config is not None:
            records = sample_records(self.config)
        else:
            path = Path(self.path)
            records = load_world(path.parent if path.name == WORLD_JSON else path).images
        return frozenset(r.scene.signature() for r in records if r.split in self.splits)

    def describe(self) -> str:
        """One line naming the world and the split that counts as seen."""
        split = "/".join(self.splits)
        if self.path is not None:
            return f"the {split} split of the world at {self.path}"
        return f"the {split} split of world {self.config.seed} (`{generate_command(self.config)}`)"


def generate_command(config: WorldConfig) -> str:
    """The `sampleworld generate` command that writes `config`'s world (without --out)."""
    world = f" --world {config.kind}" if config.kind != DEFAULT_KIND else ""
    cmd = (f"python -m edje.sampleworld generate{world} --seed {config.seed} --n-train {config.n_train} "
           f"--n-val {config.n_val} --n-test {config.n_test}")
    if config.same_side_rate:
        cmd += f" --same-side-rate {config.same_side_rate:g}"
    if config.held_out:
        cmd += f" --held-out {' '.join(config.held_out)} --held-out-mode {config.held_out_mode}"
    return cmd


def parse_reference(spec: str, n_train: int = SHIPPED_TRAIN_WORLD.n_train, n_val: int = SHIPPED_TRAIN_WORLD.n_val,
                    held_out: Sequence[str] = (), kind: str = DEFAULT_KIND) -> ReferenceWorld:
    """`spec` a world seed (its scenes sampled at these sizes with the defaults of world kind `kind`, as
    `sampleworld generate --world KIND` draws them; `held_out` withheld, as in an exclude world) or a generated
    world's folder or world.json."""
    try:
        seed = int(spec)
    except ValueError:
        if not Path(spec).exists():
            raise ValueError(f"reference world {spec!r} is neither a seed nor an existing world folder / "
                             "world.json") from None
        return ReferenceWorld(path=str(spec))
    return ReferenceWorld(config=world_config(kind, seed=seed, n_train=n_train, n_val=n_val, n_test=0,
                                              held_out=tuple(held_out), held_out_mode="exclude"))


def world_kind_beside(annotations: str) -> str:
    """The kind of the sample world whose world.json lies beside `annotations` (the default kind when none does):
    a reference world given by its seed is drawn as that kind, since scenes of two kinds never mean the same."""
    path = Path(annotations).parent / WORLD_JSON
    if not path.is_file():
        return DEFAULT_KIND
    return json.loads(path.read_text(encoding="utf-8")).get("config", {}).get("kind", DEFAULT_KIND)


def novel_images(scenes: Sequence[Scene], seen: FrozenSet[tuple]) -> np.ndarray:
    """bool per image: its meaning is in no scene of `seen`."""
    return np.array([s.signature() not in seen for s in scenes], dtype=bool)


def query_subset(direction: str, novel: np.ndarray, caption_image: np.ndarray) -> np.ndarray:
    """Indices of the queries whose answer image is novel: captions of novel images (t2i), novel images (i2t)."""
    if direction == "t2i":
        return np.flatnonzero(novel[caption_image])
    if direction == "i2t":
        return np.flatnonzero(novel)
    raise ValueError(f"direction must be t2i or i2t, not {direction!r}")


def counts(novel: np.ndarray) -> Dict[str, float]:
    """How many images are novel and how many repeat a training meaning."""
    n, fresh = int(novel.size), int(novel.sum())
    return {"images": n, "novel_images": fresh, "repeated_images": n - fresh,
            "repeated_pct": round(100.0 * (n - fresh) / n, 2) if n else 0.0}
