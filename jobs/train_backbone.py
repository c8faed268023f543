"""Train the project's small open_clip backbone contrastively on a Karpathy-style train split.

The committed checkpoint (checkpoints/edje-tiny-convvit-sw.safetensors): its exact command is in
its .json record and in BENCHMARKS.md. Load it with VisionBackbone.create(BackboneConfig("edje-tiny-convvit", pretrained=<output>)).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch

from edje.schemas.cli_options import add_options, from_args
from edje.training.backbone import BackboneTrainConfig, train_backbone


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(p, BackboneTrainConfig)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are reproducible per count)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = from_args(BackboneTrainConfig, a)
    record = train_backbone(cfg)
    print(f"wrote {a.output} ({record['bytes']} bytes) in {record['wall_s']} s; recall {record['final_recall']}")


if __name__ == "__main__":
    main()
