"""Fine-tune an EDJE checkpoint with ITM only (lr 2e-5) on raw token tables with Ray Train.

  python jobs/finetune.py --init checkpoints/edje-c64 --tables runs/enc/tables --storage-path runs/train \
      --name edje-c64-ft --export runs/edje-c64-ft
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.training.launch import main as launch


def _require_init(cfg, args):
    if not cfg.init_checkpoint:
        raise SystemExit("finetune.py needs --init <EDJE checkpoint>")
    return cfg


def main(argv=None) -> None:
    """Run the job on ``argv`` (default: the command line)."""
    launch(sys.argv[1:] if argv is None else list(argv), __doc__.splitlines()[0], lr=2e-5, objectives=("itm",), adjust=_require_init)


if __name__ == "__main__":
    main()
