"""Probe what a frozen backbone's tokens and pooled embedding know about an open world: noun, size, count, facing, place.

Fits ridge probes on the train images of an open world and scores them on its test images
(evaluation/open_probes.py says which probes), then the first stage's zero-shot recall on those test images.
Select on validation world seeds, never on the seeds a final report uses. Example:

  python benchmarks/probe_open_tokens.py --seed 301 --backbone edje-tiny-convvit-128 \
      --pretrained runs/open/bb/A.safetensors --train-images 3000 --test-images 1000
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch
from probe_tokens import encode_split, test_split_recall

from edje.evaluation.open_probes import run_open_probes
from edje.model.backbone import VisionBackbone
from edje.sampleworld import generate, load_world
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
    nouns, groups = world_vocabulary(world_dir)
    backbone = VisionBackbone.create(cfg)
    world = load_world(world_dir)
    start = time.time()
    test = encode_split(backbone, world, "test", test_images)
    probes, coverage = run_open_probes(encode_split(backbone, world, "train", train_images), test, nouns, groups)
    return {"backbone": cfg.name, "pretrained": cfg.pretrained, "feature_layer": cfg.feature_layer,
            "tokens": list(backbone.token_shape), "world": str(world_dir), "seconds": round(time.time() - start, 1),
            "probes": [p.as_dict() for p in probes], "coverage": coverage,
            "zero_shot": test_split_recall(backbone, world, test[1])}


def main(argv=None) -> int:
    """CLI: print the probe table and the zero-shot recall (and write JSON with --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", help="a generated open world folder; default: generate --seed into a temp folder")
    p.add_argument("--seed", type=int, default=301, help="open world seed when --world is not given (a validation seed)")
    p.add_argument("--backbone", default="edje-tiny-convvit-128")
    p.add_argument("--pretrained", default=None, help="checkpoint path or tag (default: none, random weights)")
    p.add_argument("--feature-layer", choices=("final", "penultimate"), default="final")
    p.add_argument("--train-images", type=int, default=3000)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--json", help="write the result here")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        world = a.world
        if world is None:
            world = generate(open_world_config(seed=a.seed, n_train=a.train_images, n_val=0, n_test=a.test_images),
                             Path(tmp) / "world").root
        cfg = BackboneConfig(a.backbone, pretrained=a.pretrained, feature_layer=a.feature_layer)
        result = probe_open_backbone(cfg, world, a.train_images, a.test_images)
    result["world_seed"] = None if a.world else a.seed
    print(f"{'probe':22s} {'acc %':>7s} {'base %':>7s} {'rows':>6s}")
    for r in result["probes"]:
        print(f"{r['name']:22s} {r['accuracy']:7.1f} {r['baseline']:7.1f} {r['n_test']:6d}")
    print("coverage: " + ", ".join(f"{k} {v}" for k, v in result["coverage"].items()))
    for direction, rec in result["zero_shot"].items():
        print(f"zero-shot {direction} R@1/5/10 on the test split: " + " / ".join(f"{rec[f'r{k}']:.1f}" for k in (1, 5, 10)))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
