"""Pretrain EDJE (adapter + joint encoder) on raw token tables with Ray Train: ITM + MLM + recovery.

  python jobs/pretrain.py --tables runs/enc/tables --storage-path runs/train --name edje-c64 \
      --num-workers 2 --adapter compressed --num-queries 64 --export checkpoints/edje-c64
Rerunning the same command resumes from the run's newest checkpoint.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.training.config import PRETRAIN_OBJECTIVES
from edje.training.launch import main as launch


def main(argv=None) -> None:
    """Run the job on ``argv`` (default: the command line)."""
    launch(sys.argv[1:] if argv is None else list(argv), __doc__.splitlines()[0], lr=3e-4, objectives=PRETRAIN_OBJECTIVES)


if __name__ == "__main__":
    main()
