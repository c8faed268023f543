"""A query's first-stage embedding with and without a query tower (model/ranking.py QueryTower), side by side.

The shipped open backbone's own text tower alone against it joined by the distilled MiniLM tower the open rule names,
on one process, calls interleaved in rounds: one query at a time (a served search embeds one text) and batches of 256
(evaluation). Prints milliseconds per call and the ratio; beside them, what one query's reranking of its top 10 costs
is the serving benchmark's figure (BENCHMARKS.md).

    .venv/bin/python benchmarks/bench_query_towers.py --threads 2
"""
from __future__ import annotations

import argparse
import json
import platform

import torch
from bench_serving import captions, print_table, round_robin

from edje.model.backbone import VisionBackbone
from edje.model.ranking import read_ranking
from edje.schemas.config import BackboneConfig

CHECKPOINT = "checkpoints/edje-open-c16"


def main() -> None:
    """Time both embeddings; print the table and a JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--checkpoint", default=CHECKPOINT, help="a checkpoint whose rule names query towers")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    config = json.load(open(f"{args.checkpoint}/config.json"))["config"]["backbone"]
    towers = read_ranking(args.checkpoint).query_towers
    if not towers:
        p.error(f"{args.checkpoint}'s rule names no query tower")
    backbone = BackboneConfig(config["name"], config["pretrained"], weights_sha256=config["weights_sha256"])
    alone = VisionBackbone.create(backbone)
    joined = VisionBackbone.create(backbone).join_query_towers(towers, args.checkpoint)
    one, batch = captions(1, seed=1), captions(256, seed=2)
    single = round_robin({"alone": lambda: alone.encode_text(one), "joined": lambda: joined.encode_text(one)},
                         args.rounds)
    many = round_robin({"alone": lambda: alone.encode_text(batch), "joined": lambda: joined.encode_text(batch)},
                       max(3, args.rounds // 5))
    rows = [[what, f"{t['alone'] * 1e3:.2f}", f"{t['joined'] * 1e3:.2f}", f"{t['joined'] / t['alone']:.1f}x"]
            for what, t in (("one query", single), ("256 queries", many))]
    print_table(f"query embedding, {config['name']} alone and with {', '.join(t.name for t in towers)} "
                f"({args.threads} threads, {platform.processor() or platform.machine()})", rows,
                ["call", "alone ms", "joined ms", "ratio"])
    print(json.dumps({"single_ms": {k: round(v * 1e3, 3) for k, v in single.items()},
                      "batch256_ms": {k: round(v * 1e3, 3) for k, v in many.items()}}))


if __name__ == "__main__":
    main()
