"""What the backbone probe benchmarks share: their options, the world they probe (generated when none is given), the
encoding of its splits, the first stage's zero-shot recall, the printed recall and the JSON."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import numpy as np
import torch

from edje.model.backbone import VisionBackbone
from edje.model.image_decode import load_image_files
from edje.model.recall import embedding_recall
from edje.sampleworld import generate, load_world
from edje.schemas.config import BackboneConfig

# (train, test) -> the probe-specific entries of the result; each split is (tokens, pooled, scenes).
Probes = Callable[[tuple, tuple], dict]


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


def probe_world(cfg: BackboneConfig, world_dir: str | Path, train_images: int, test_images: int,
                probes: Probes) -> dict:
    """Encode a world's train and test images with the backbone, run `probes` on them and add the zero-shot recall."""
    backbone = VisionBackbone.create(cfg)
    world = load_world(world_dir)
    start = time.time()
    test = encode_split(backbone, world, "test", test_images)
    found = probes(encode_split(backbone, world, "train", train_images), test)
    zero_shot = test_split_recall(backbone, world, test[1])
    return {"backbone": cfg.name, "pretrained": cfg.pretrained, "feature_layer": cfg.feature_layer,
            "tokens": list(backbone.token_shape), "world": str(world_dir), "seconds": round(time.time() - start, 1),
            **found, "zero_shot": zero_shot}


def probe_parser(description: str, world: str, seed: int, seed_help: str, backbone: str) -> argparse.ArgumentParser:
    """The options every probe benchmark takes; `world` names the kind of world folder --world expects."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--world", help=f"a generated {world} folder; default: generate --seed into a temp folder")
    p.add_argument("--seed", type=int, default=seed, help=seed_help)
    p.add_argument("--backbone", default=backbone)
    p.add_argument("--pretrained", default=None, help="checkpoint path or tag (default: none, random weights)")
    p.add_argument("--feature-layer", choices=("final", "penultimate"), default="final")
    p.add_argument("--train-images", type=int, default=3000)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--json", help="write the result here")
    p.add_argument("--threads", type=int, default=2)
    return p


def run_probe_cli(a: argparse.Namespace, world_config: Callable, probe: Callable[..., dict],
                  print_probes: Callable[[dict], None]) -> dict:
    """Probe the backbone of options `a` on --world, or on a world `world_config` makes for --seed; print the table
    (`print_probes`) and the zero-shot recall, write --json; returns the result."""
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        world = a.world
        if world is None:
            world = generate(world_config(seed=a.seed, n_train=a.train_images, n_val=0, n_test=a.test_images),
                             Path(tmp) / "world").root
        cfg = BackboneConfig(a.backbone, pretrained=a.pretrained, feature_layer=a.feature_layer)
        result = probe(cfg, world, a.train_images, a.test_images)
    result["world_seed"] = None if a.world else a.seed
    print_probes(result)
    for direction, rec in result["zero_shot"].items():
        print(f"zero-shot {direction} R@1/5/10 on the test split: " + " / ".join(f"{rec[f'r{k}']:.1f}" for k in (1, 5, 10)))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return result
