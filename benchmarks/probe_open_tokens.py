"""Probe what a frozen backbone's tokens and pooled embedding know about an open world: noun, size, count, facing, place.

Fits ridge probes on the train images of an open world and scores them on its test images
(evaluation/open_probes.py says which probes), then the first stage's zero-shot recall on those test images.
Select on validation world seeds, never on the seeds a final report uses. Example:

  python benchmarks/probe_open_tokens.py --seed 301 --backbone edje-tiny-convvit-128 \
      --pretrained runs/open/bb/A.safetensors --train-images 3000 --test-images 1000
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from probe_cli import probe_parser, probe_world, run_probe_cli

from edje.evaluation.open_probes import run_open_probes
from edje.sampleworld.open_world import open_world_config
from edje.schemas.config import BackboneConfig


def world_vocabulary(world_dir: str | Path) -> tuple:
    """(nouns, {noun: neighbour group}) of an open world, from its world.json (ValueError for a shapes world)."""
    vocab = json.loads((Path(world_dir) / "world.json").read_text())["vocabulary"]
    if vocab.get("kind") != "open":
        raise ValueError(f"{world_dir} is not an open world (generate it with --world open); "
                         "benchmarks/probe_tokens.py probes shapes worlds")
    return [g["noun"] for g in vocab["glyphs"]], {g["noun"]: g["group"] for g in vocab["glyphs"]}


def probe_open_backbone(cfg: BackboneConfig, world_dir: str | Path, train_images: int, test_images: int) -> dict:
    """Encode an open world's train and test images with the backbone and run every open-world probe."""
    nouns, groups = world_vocabulary(world_dir)  # before the backbone loads: a shapes world fails at once

    def probes(train: tuple, test: tuple) -> dict:
        found, coverage = run_open_probes(train, test, nouns, groups)
        return {"probes": [p.as_dict() for p in found], "coverage": coverage}

    return probe_world(cfg, world_dir, train_images, test_images, probes)


def print_probes(result: dict) -> None:
    """Each probe's accuracy beside its baseline and its test rows, then the vocabulary's coverage."""
    print(f"{'probe':22s} {'acc %':>7s} {'base %':>7s} {'rows':>6s}")
    for r in result["probes"]:
        print(f"{r['name']:22s} {r['accuracy']:7.1f} {r['baseline']:7.1f} {r['n_test']:6d}")
    print("coverage: " + ", ".join(f"{k} {v}" for k, v in result["coverage"].items()))


def main(argv=None) -> int:
    """CLI: print the probe table and the zero-shot recall (and write JSON with --json)."""
    p = probe_parser(__doc__.splitlines()[0], "open world", 301,
                     "open world seed when --world is not given (a validation seed)", "edje-tiny-convvit-128")
    run_probe_cli(p.parse_args(argv), open_world_config, probe_open_backbone, print_probes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
