"""Distil a backbone's text tower into a pretrained language model's, on captions alone; the image tower stays the teacher's.

The student reads English as its language model learned it, and places captions where the teacher does: tables
encoded with the teacher stay valid, and serving loads the student as any backbone (`--backbone <model>
--backbone-weights <output>`). Its command and figures are in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch

from edje.schemas.cli_options import add_options, from_args
from edje.training.text_distill import TextDistillConfig, distill_text_tower


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(p, TextDistillConfig)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are reproducible per count)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    record = distill_text_tower(from_args(TextDistillConfig, a))
    print(f"wrote {a.output} ({record['bytes']} bytes) in {record['wall_s']} s; recall {record['final_recall']}")


if __name__ == "__main__":
    main()
