"""Pretrain EDJE (adapter + joint encoder) on raw token tables with Ray Train: ITM + MLM + recovery.

  python jobs/pretrain.py --tables runs/enc/tables --storage-path runs/train --name edje-c64 \
      --num-workers 2 --adapter compressed --num-queries 64 --export checkpoints/edje-c64
Rerunning the same command resumes from the run's newest checkpoint.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs as a script under `ray job submit`
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from training.config import PRETRAIN_OBJECTIVES  # noqa: E402
from training.launch import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:], __doc__.splitlines()[0], lr=3e-4, objectives=PRETRAIN_OBJECTIVES)
