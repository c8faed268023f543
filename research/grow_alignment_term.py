"""Add the word-alignment term to a checkpoint at scale G, with no training: what a word-aligned encoder's score
would rank before any step teaches the scale.

  python -m edje.research.grow_alignment_term SRC DST 20
"""
from __future__ import annotations

import argparse

from edje.model.edje import load_checkpoint, read_checkpoint_config, save_checkpoint
from edje.training.config import ModelSpec
from edje.training.model_init import with_relations


def grow(src: str, dst: str, scale: float) -> None:
    """Write dst = src with the encoder's word-alignment term at `scale` (every other weight and key kept)."""
    model = with_relations(load_checkpoint(src), ModelSpec(word_alignment=scale))
    extra = {k: v for k, v in read_checkpoint_config(src).items() if k not in ("config", "adapter_hash")}
    save_checkpoint(model, dst, extra=extra)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("scale", type=float)
    a = p.parse_args(argv)
    grow(a.src, a.dst, a.scale)
    print(f"wrote {a.dst}")


if __name__ == "__main__":
    main()
