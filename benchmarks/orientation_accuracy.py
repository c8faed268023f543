"""How well a backbone's own embeddings tell left-facing from right-facing: a diagnostic of its two towers.

For images whose first caption has a side of orientation ("a left-facing dog", "a cat facing right"), four figures:
- caption vs flip: how often the image scores its caption above the caption's orientation flip ("right-facing dog");
- image vs mirror: how often the caption scores its image above the image mirrored left-right;
- the mean text cosine of a caption and its flip, and the mean image cosine of an image and its mirror.

50 % and a cosine near 1 are a tower blind to left and right. Select on validation world seeds. Example:

  python benchmarks/orientation_accuracy.py --annotations runs/open/w301/flickr30k_test.json \
      --pretrained runs/open/bb/B.safetensors --images 1500
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from edje.model.backbone_registry import open_clip_registry
from edje.model.image_decode import load_image_files
from edje.schemas.annotations import load_annotations
from edje.training.backbone import image_embeddings, image_size, load_init, text_embeddings
from edje.training.caption_rewrites import flip_orientation

open_clip = open_clip_registry()  # with the project's configs registered


def oriented_pairs(annotations: str, limit: int) -> tuple:
    """(image paths, captions, their orientation flips) of the first ``limit`` images whose first caption has a side
    of orientation."""
    ann = load_annotations(annotations)
    paths, captions, flips = [], [], []
    for image, rows in enumerate(ann.image_to_captions()):
        caption = ann.captions[rows[0]]
        flipped = flip_orientation(caption)
        if flipped is not None:
            paths.append(ann.image_paths[image])
            captions.append(caption)
            flips.append(flipped)
            if len(paths) == limit:
                break
    return paths, captions, flips


@torch.no_grad()
def orientation_accuracy(model: str, pretrained: str, annotations: str, limit: int, batch: int = 256) -> dict:
    """The four figures (accuracies in %) of a backbone checkpoint on an annotation set's oriented captions."""
    clip = open_clip.create_model(model)
    load_init(clip, pretrained, model)
    tokenizer = open_clip.get_tokenizer(model)
    paths, captions, flips = oriented_pairs(annotations, limit)
    if not paths:
        raise ValueError(f"no caption in {annotations} has a side of orientation (left-facing, facing right)")
    pixels = torch.from_numpy(load_image_files(paths, image_size(clip)))
    img, mirror = image_embeddings(clip, pixels, batch), image_embeddings(clip, pixels, batch, mirrored=True)
    txt, flip = text_embeddings(clip, tokenizer, captions, batch), text_embeddings(clip, tokenizer, flips, batch)
    pct = lambda won: round(100.0 * float(won.mean()), 1)
    return {"images": len(paths),
            "caption_vs_flip": pct((img * txt).sum(-1) > (img * flip).sum(-1)),
            "image_vs_mirror": pct((txt * img).sum(-1) > (txt * mirror).sum(-1)),
            "text_cosine": round(float((txt * flip).sum(-1).mean()), 4),
            "image_cosine": round(float((img * mirror).sum(-1).mean()), 4)}


def main(argv=None) -> int:
    """CLI: print the four figures as JSON (and write them with --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--annotations", required=True, help="Karpathy-style annotation JSON (images relative to it)")
    p.add_argument("--pretrained", required=True, help="backbone .safetensors (as train-backbone writes)")
    p.add_argument("--model", default="edje-tiny-convvit-128", help="open_clip model name (model/configs/*.json)")
    p.add_argument("--images", type=int, default=1500, help="at most this many images with an oriented caption")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the result here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    result = orientation_accuracy(a.model, a.pretrained, a.annotations, a.images)
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
