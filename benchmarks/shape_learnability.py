"""Can an image tower learn shape at all? Direct supervision of "which shapes / colours are present".

Tells architecture from objective: a tower that cannot learn shape even from direct labels will
not learn it contrastively. Trains the open_clip image tower (random init) with a linear
multi-label head on a sample world's train images and prints held-out accuracy every 100 steps:

  python benchmarks/shape_learnability.py --world runs/world --model edje-tiny-convvit --steps 400
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edje.evaluation.probes import presence_labels
from edje.model.backbone_registry import open_clip_registry
from edje.model.image_decode import load_image_files
from edje.schemas.annotations import load_annotations
from edje.training.backbone import image_size, preprocess, world_records

open_clip = open_clip_registry()  # with the project's configs registered


def pooled_features(visual: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The tower's pooled features before its projection (timm trunks) or its output (native towers)."""
    if hasattr(visual, "trunk"):
        return visual.trunk.forward_head(visual.trunk.forward_features(x), pre_logits=True)
    return visual(x)


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", required=True, help="a generated sample world folder")
    p.add_argument("--model", default="edje-tiny-convvit")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--held-out", type=int, default=1000, help="last N train images, never trained on")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    clip = open_clip.create_model(a.model)
    ann = load_annotations(Path(a.world) / "flickr30k_train.json")
    _, scenes = world_records(str(Path(a.world) / "world.json"), ann.image_ids)
    x = preprocess(clip, load_image_files(ann.image_paths, image_size(clip)))
    y = torch.tensor(np.hstack([presence_labels(scenes, "shape"), presence_labels(scenes, "colour")]), dtype=torch.float32)
    visual = clip.visual
    with torch.no_grad():
        width = pooled_features(visual.eval(), x[:2]).shape[1]
    visual.train()
    head = torch.nn.Linear(width, y.shape[1])
    opt = torch.optim.AdamW(list(visual.parameters()) + list(head.parameters()), lr=a.lr)
    n_train = len(x) - a.held_out
    rng, start = np.random.default_rng(0), time.time()
    for step in range(1, a.steps + 1):
        idx = torch.from_numpy(rng.choice(n_train, a.batch_size, replace=False))
        loss = F.binary_cross_entropy_with_logits(head(pooled_features(visual, x[idx])), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            visual.eval()
            with torch.no_grad():
                right = (head(pooled_features(visual, x[n_train:])) > 0) == (y[n_train:] > 0.5)
            visual.train()
            print(f"step {step} loss {loss.item():.3f} shape {100 * right[:, :6].float().mean():.1f} % "
                  f"colour {100 * right[:, 6:].float().mean():.1f} % ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
