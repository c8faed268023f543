"""Probe what a frozen backbone's tokens and pooled embedding know: colour and shape, global and local.

Fits ridge probes on the train images of a sample world and scores them on its test images
(evaluation/probes.py says which probes). Example, on a world seed that no training run used:

  python benchmarks/probe_tokens.py --seed 7 --backbone edje-tiny-convvit \
      --pretrained checkpoints/edje-tiny-convvit-sw.safetensors --train-images 3000
"""
from __future__ import annotations

import sys
from pathlib import Path

from probe_cli import probe_parser, probe_world, run_probe_cli

from edje.evaluation.probes import run_probes
from edje.sampleworld import WorldConfig
from edje.schemas.config import BackboneConfig

# What a backbone must give for EDJE to rerank with it.
THRESHOLDS = {"colour_present": 98.0, "local_colour": 98.0, "shape_present": 95.0, "local_shape": 90.0}


def probe_backbone(cfg: BackboneConfig, world_dir: str | Path, train_images: int, test_images: int) -> dict:
    """Encode a world's train and test images with the backbone and run every probe."""
    def probes(train: tuple, test: tuple) -> dict:
        rows = [r.as_dict() for r in run_probes(train, test)]
        for r in rows:
            r["threshold"] = THRESHOLDS[r["name"]]
            r["passes"] = r["accuracy"] >= r["threshold"]
        return {"probes": rows}

    return probe_world(cfg, world_dir, train_images, test_images, probes)


def print_probes(result: dict) -> None:
    """Each probe's accuracy beside its baseline and its goal."""
    print(f"{'probe':16s} {'acc %':>7s} {'base %':>7s} {'goal %':>7s}")
    for r in result["probes"]:
        print(f"{r['name']:16s} {r['accuracy']:7.1f} {r['baseline']:7.1f} {r['threshold']:7.1f}"
              f"  {'pass' if r['passes'] else 'FAIL'}")


def main(argv=None) -> int:
    """CLI: print a probe table (and JSON with --json); exit 1 when a threshold is missed and --check is given."""
    p = probe_parser(__doc__.splitlines()[0], "world", 7, "world seed when --world is not given", "edje-tiny-convvit")
    p.add_argument("--check", action="store_true", help="exit 1 when a probe misses its threshold")
    a = p.parse_args(argv)
    result = run_probe_cli(a, WorldConfig, probe_backbone, print_probes)
    return 1 if a.check and not all(r["passes"] for r in result["probes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
