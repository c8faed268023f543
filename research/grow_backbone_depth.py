"""A deeper image tower started from a shallower one's weights, computing the same function: each trained block
is followed by a new one whose residual branches output zero (their last projections zeroed), so the grown tower
gives the trained tower's tokens and embeddings until training moves the new blocks.

  python -m edje.research.grow_backbone_depth SRC.safetensors DST.safetensors --model edje-tiny-convvit-128-d8
"""
from __future__ import annotations

import argparse
import re

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from edje.model.backbone_registry import open_clip_registry

BLOCK = re.compile(r"^visual\.trunk\.blocks\.(\d+)\.(.*)$")
# A pre-norm transformer block is x + attn(norm1(x)) + mlp(norm2(x + ...)): these two projections end its branches.
ZEROED = ("attn.proj.weight", "attn.proj.bias", "mlp.fc2.weight", "mlp.fc2.bias")


def grown_state(src: dict, target: dict) -> dict:
    """`target`'s keys filled from `src`: block i of src becomes block i * r of target (r = target depth / src
    depth), the blocks between keep target's fresh weights with their residual outputs zeroed; the rest is copied."""
    depth = lambda state: 1 + max(int(m.group(1)) for k in state if (m := BLOCK.match(k)))
    ratio, rest = divmod(depth(target), depth(src))
    if rest or ratio < 1:
        raise ValueError(f"a tower of {depth(target)} blocks cannot interleave one of {depth(src)}")
    out = {}
    for key, value in target.items():
        m = BLOCK.match(key)
        if m is None:
            out[key] = src[key]
        elif int(m.group(1)) % ratio == 0:
            out[key] = src[f"visual.trunk.blocks.{int(m.group(1)) // ratio}.{m.group(2)}"]
        else:
            out[key] = torch.zeros_like(value) if m.group(2) in ZEROED else value
        if out[key].shape != value.shape:
            raise ValueError(f"{key}: {tuple(out[key].shape)} in the source, {tuple(value.shape)} in the target")
    return out


def grow(src: str, dst: str, model: str) -> None:
    """Write dst: `model`'s weights grown from the backbone checkpoint src."""
    with safe_open(src, framework="pt") as f:
        written_for = (f.metadata() or {}).get("model")
    target = open_clip_registry().create_model(model).state_dict()
    state = grown_state({k: v.float() for k, v in load_file(src).items()}, target)
    save_file({k: v.contiguous() for k, v in state.items()}, dst, metadata={"model": model, "grown_from": str(written_for)})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--model", required=True, help="the deeper open_clip model (its image tower interleaves src's)")
    a = p.parse_args(argv)
    grow(a.src, a.dst, a.model)
    print(f"wrote {a.dst}")


if __name__ == "__main__":
    main()
