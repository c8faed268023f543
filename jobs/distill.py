"""Distil a local-adapter EDJE teacher into a compressed student: ITM + BCE(sigmoid(student), sigmoid(teacher)).

The student scores the same (caption, image) pairs as the teacher, positives and mined
negatives; its joint encoder starts from the teacher's (unless --init or --init-encoder-from
says otherwise) and its compression adapter is new.
  python jobs/distill.py --teacher checkpoints/edje-local --tables runs/enc/tables \
      --storage-path runs/train --name edje-c64-distilled --num-queries 64 --export checkpoints/edje-c64-distilled
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.training.launch import main as launch


def _student(cfg, args):
    if not cfg.teacher_checkpoint:
        raise SystemExit("distill.py needs --teacher <EDJE checkpoint>")
    if not cfg.init_checkpoint and not cfg.init_encoder_from:
        cfg = replace(cfg, init_encoder_from=cfg.teacher_checkpoint)
    return cfg


def main(argv=None) -> None:
    """Run the job on ``argv`` (default: the command line)."""
    launch(sys.argv[1:] if argv is None else list(argv), __doc__.splitlines()[0], lr=3e-4, objectives=("itm", "distill"), adjust=_student)


if __name__ == "__main__":
    main()
