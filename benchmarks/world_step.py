"""The quickstart's world step, one way per run: the whole sample world drawn, or only the test images a run reads.

One process per way, so that `farm-bench` can time them side by side (BENCHMARKS.md "The test suite's wall time"):

    farm-bench -n 3 --timeout 400 --vs ".venv/bin/python benchmarks/world_step.py --world open --draw all" -- \
        .venv/bin/python benchmarks/world_step.py --world open --draw test --test-images 40
"""
from __future__ import annotations

import argparse
import tempfile

from edje.sampleworld import draw_images, generate
from edje.sampleworld.registry import KINDS, world_config


def main() -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", choices=sorted(KINDS), default="shapes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draw", choices=("all", "test"), required=True,
                   help="all: every image as `generate` draws them; test: the test split's first --test-images only")
    p.add_argument("--test-images", type=int, default=40)
    args = p.parse_args()
    config = world_config(args.world, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="edje-world-step-") as out:
        if args.draw == "all":
            generate(config, out)
            return
        world = generate(config, out, images=False)
        draw_images(world, world.splits["test"][:args.test_images])


if __name__ == "__main__":
    main()
