"""Copy an EDJE checkpoint with its weights stored as fp16 (half the bytes; loading upcasts to fp32).

  python -m edje.training.export runs/binding_backbone/model_cont checkpoints/edje-local-bind
"""
from __future__ import annotations

import argparse
import os

import torch

from edje.model.edje import load_checkpoint, read_checkpoint_config, save_checkpoint


def export_fp16(src: str, dst: str) -> int:
    """Write dst = src with fp16 weights (the adapter hash is the stored weights'); returns its bytes."""
    model = load_checkpoint(src)
    extra = {k: v for k, v in read_checkpoint_config(src).items() if k not in ("config", "adapter_hash")}
    save_checkpoint(model, dst, extra=extra, dtype=torch.float16)
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
