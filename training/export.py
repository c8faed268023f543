"""Copy an EDJE checkpoint with its weights stored as fp16 (half the bytes; loading upcasts to fp32).

  python -m training.export runs/ckpt/c64_distilled checkpoints/edje-c64-distilled
"""
from __future__ import annotations

import argparse
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from model.edje import CONFIG, TOKENIZER, WEIGHTS, load_checkpoint


def export_fp16(src: str, dst: str) -> int:
    """Write dst = src with fp16 weights; checks that it loads and scores like the source. Returns bytes."""
    os.makedirs(dst, exist_ok=True)
    state = load_file(os.path.join(src, WEIGHTS))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, os.path.join(dst, WEIGHTS))
    shutil.copy2(os.path.join(src, CONFIG), os.path.join(dst, CONFIG))
    shutil.copytree(os.path.join(src, TOKENIZER), os.path.join(dst, TOKENIZER), dirs_exist_ok=True)
    a, b = load_checkpoint(src), load_checkpoint(dst)
    m = a.config.encoder.num_image_tokens if a.config.adapter.kind == "local" else a.config.adapter.num_queries
    n = m if a.config.adapter.kind == "local" else 16
    tokens = torch.randn(2, n, a.config.adapter.input_dim)
    with torch.no_grad():
        sa = a.score_backbone_tokens(["a red circle", "a blue square"], tokens)
        sb = b.score_backbone_tokens(["a red circle", "a blue square"], tokens)
    if not torch.allclose(sa, sb, atol=5e-2, rtol=5e-2):
        raise RuntimeError(f"fp16 copy scores {sb.tolist()} differ from the source's {sa.tolist()}")
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs)


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    a = p.parse_args(argv)
    print(f"wrote {a.dst}: {export_fp16(a.src, a.dst)} bytes")


if __name__ == "__main__":
    main()
