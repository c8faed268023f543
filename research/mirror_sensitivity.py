"""How much a model's image tokens and route inputs change when the image is mirrored: the probe behind the
compressed student's relation deadlock.

For the first horizontal-relation captions of a training table whose images have mirrored copies (`--augment
hflip` tables), each checkpoint's adapter runs on the image and on its mirror, and its joint encoder reads the
route's inputs (mean subject-phrase minus mean object-phrase state at the route layer) on both. A model that can
tell a relation from its flip must change them; a student whose tokens barely change gets almost no gradient from
any objective that compares the two (the flip square, route_mirror), since that gradient scales with the change.

  python -m edje.research.mirror_sensitivity --table runs/ho/t100/train.parquet --mirrors runs/ho/m100/tables \
      checkpoints/edje-local-caprel-heldout runs/ho/ckpt/HOS16m/checkpoint_...
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import pyarrow.parquet as pq
import torch

from edje.model.edje import load_checkpoint
from edje.schemas.token_table import read_metadata
from edje.training.batches import MirrorLookup, decode_batch
from edje.training.caption_rewrites import HORIZONTAL, caption_axes


def sensitivity(checkpoint: str, captions: list, tokens: torch.Tensor, mirrors: torch.Tensor) -> dict:
    """Mean norms of one model's adapter tokens and route inputs, and of their change from image to mirror."""
    model = load_checkpoint(checkpoint).eval()
    with torch.no_grad():
        image, mirror = model.adapter(tokens), model.adapter(mirrors)
        _, route, valid = model.encoder.score_and_route(captions, image)
        _, route_m, valid_m = model.encoder.score_and_route(captions, mirror)
    both = valid & valid_m
    return {"checkpoint": checkpoint, "tokens": image.norm(dim=-1).mean().item(),
            "tokens_change": (image - mirror).norm(dim=-1).mean().item(),
            "route": route[both].norm(dim=-1).mean().item(),
            "route_change": (route - route_m)[both].norm(dim=-1).mean().item(), "relations": int(both.sum())}


def main() -> None:
    """Print one JSON line per checkpoint."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True, help="a raw training token table (one file)")
    ap.add_argument("--mirrors", required=True, help="folder of the tables holding the images' mirrored rows")
    ap.add_argument("--rows", type=int, default=400, help="table rows read to find the captions")
    ap.add_argument("--captions", type=int, default=24, help="horizontal-relation captions probed")
    ap.add_argument("checkpoints", nargs="+")
    args = ap.parse_args()
    batch = decode_batch(pq.read_table(args.table).slice(0, args.rows), read_metadata(args.table))
    mirror_tokens, found = MirrorLookup(sorted(glob.glob(os.path.join(args.mirrors, "*.parquet")))).get(batch.image_ids)
    rows = [i for i, c in enumerate(batch.captions) if found[i] and HORIZONTAL in caption_axes(c)][:args.captions]
    if not rows:
        raise SystemExit("no horizontal-relation caption with a mirrored image among the rows read")
    captions = [batch.captions[i] for i in rows]
    for checkpoint in args.checkpoints:
        print(json.dumps(sensitivity(checkpoint, captions, batch.tokens[rows], mirror_tokens[rows])), flush=True)


if __name__ == "__main__":
    main()
