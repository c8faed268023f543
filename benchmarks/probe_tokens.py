"""Probe what a frozen backbone's tokens and pooled embedding know: colour and shape, global and local.

Fits ridge probes on the train images of a sample world and scores them on its test images
(evaluation/probes.py says which probes). Example, on a world seed that no training run used:

  python benchmarks/probe_tokens.py --seed 7 --backbone edje-tiny-convvit \
      --pretrained checkpoints/edje-tiny-convvit-sw.safetensors --train-images 3000
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

import numpy as np
import torch

from edje.evaluation.probes import run_probes
from edje.model.backbone import VisionBackbone
from edje.model.image_decode import load_image_files
from edje.model.recall import embedding_recall
from edje.sampleworld import WorldConfig, generate, load_world
from edje.schemas.config import BackboneConfig

# What a backbone must give for EDJE to rerank with it.
THRESHOLDS = {"colour_present": 98.0, "local_colour": 98.0, "shape_present": 95.0, "local_shape": 90.0}


@torch.no_grad()
def encode_split(backbone: VisionBackbone, world, split: str, limit: int, batch: int = 256) -> tuple:
    """(tokens [N, n, d], pooled [N, e], scenes) of the first ``limit`` images of ``split``."""
    records = [r for r in world.images if r.split == split][:limit]
    pixels = load_image_files([world.image_path(r.image_id) for r in records])
    toks, embs = [], []
    for i in range(0, len(pixels), batch):
        t, e = backbone.encode(torch.from_numpy(pixels[i:i + batch]))
        toks.append(t.float().numpy())
        embs.append(e.numpy())
    return np.concatenate(toks), np.concatenate(embs), [r.scene for r in records]


def probe_backbone(cfg: BackboneConfig, world_dir: str | Path, train_images: int, test_images: int) -> dict:
    """Encode a world's train and test images with the backbone and run every probe."""
    backbone = VisionBackbone.create(cfg)
    world = load_world(world_dir)
    start = time.time()
    test = encode_split(backbone, world, "test", test_images)
    results = run_probes(encode_split(backbone, world, "train", train_images), test)
    zero_shot = test_split_recall(backbone, world, test[1])
    rows = [r.as_dict() for r in results]
    for r in rows:
        r["threshold"] = THRESHOLDS[r["name"]]
        r["passes"] = r["accuracy"] >= r["threshold"]
    return {"backbone": cfg.name, "pretrained": cfg.pretrained, "feature_layer": cfg.feature_layer,
            "world": str(world_dir), "seconds": round(time.time() - start, 1), "probes": rows, "zero_shot": zero_shot}


@torch.no_grad()
def test_split_recall(backbone: VisionBackbone, world, image_emb: np.ndarray, batch: int = 256) -> dict:
    """Zero-shot T2I / I2T R@1/5/10 (all captions of each image) on the test images `image_emb` was encoded from:
    the first stage's recall, which a backbone recipe must not lower."""
    records = [r for r in world.images if r.split == "test"][:len(image_emb)]
    captions = [c for r in records for c in r.captions]
    owner = np.repeat(np.arange(len(records)), [len(r.captions) for r in records])
    text = np.concatenate([backbone.encode_text(captions[i:i + batch]).float().numpy()
                           for i in range(0, len(captions), batch)])
    return embedding_recall(text, image_emb, owner)


def main(argv=None) -> int:
    """CLI: print a probe table (and JSON with --json); exit 1 when a threshold is missed and --check is given."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", help="a generated world folder; default: generate --seed into a temp folder")
    p.add_argument("--seed", type=int, default=7, help="world seed when --world is not given")
    p.add_argument("--backbone", default="edje-tiny-convvit")
    p.add_argument("--pretrained", default=None, help="checkpoint path or tag (default: none, random weights)")
    p.add_argument("--feature-layer", choices=("final", "penultimate"), default="final")
    p.add_argument("--train-images", type=int, default=3000)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--json", help="write the result here")
    p.add_argument("--check", action="store_true", help="exit 1 when a probe misses its threshold")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        world = a.world
        if world is None:
            world = generate(WorldConfig(seed=a.seed, n_train=a.train_images, n_val=0, n_test=a.test_images),
                             Path(tmp) / "world").root
        cfg = BackboneConfig(a.backbone, pretrained=a.pretrained, feature_layer=a.feature_layer)
        result = probe_backbone(cfg, world, a.train_images, a.test_images)
    result["world_seed"] = None if a.world else a.seed
    print(f"{'probe':16s} {'acc %':>7s} {'base %':>7s} {'goal %':>7s}")
    for r in result["probes"]:
        print(f"{r['name']:16s} {r['accuracy']:7.1f} {r['baseline']:7.1f} {r['threshold']:7.1f}"
              f"  {'pass' if r['passes'] else 'FAIL'}")
    for direction, rec in result["zero_shot"].items():
        print(f"zero-shot {direction} R@1/5/10 on the test split: " + " / ".join(f"{rec[f'r{k}']:.1f}" for k in (1, 5, 10)))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if a.check and not all(r["passes"] for r in result["probes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
