"""Plot recall against tokens kept and bytes per image from bench_recall.py's results.json.

    python benchmarks/plot_recall.py --workdir runs/bench_recall --output docs/recall_vs_bytes.png

One point per variant that stores tokens: local (all backbone tokens), compressed-32/64/128,
and the distilled compressed-64 at fp16 / int8 / int4; the backbone's own first stage is a
horizontal line. Bytes per image come from the codec (schemas.codecs) for the variant's token
count and the joint encoder's width, read from the variant's checkpoint.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from edje.schemas.codecs import bytes_per_image  # noqa: E402

# variant name in results.json -> (checkpoint folder under <workdir>/ckpt, storage codec)
VARIANTS = {
    "(b) EDJE local": ("local", "fp16"),
    "(c) compressed-64": ("c64", "fp16"),
    "(d) compressed-64 distilled": ("c64_distilled", "fp16"),
    "(e) (d) int8 tokens": ("c64_distilled", "int8"),
    "(e) (d) int4 tokens": ("c64_distilled", "int4"),
    "(g) compressed-32": ("c32", "fp16"),
    "(g) compressed-128": ("c128", "fp16"),
}


def token_shape(ckpt: Path, backbone_tokens: int) -> tuple:
    """(tokens kept, width) of a checkpoint: its adapter's queries (or all backbone tokens) x the LM width."""
    cfg = json.loads((ckpt / "config.json").read_text())["config"]
    tokens = cfg["adapter"]["num_queries"] if cfg["adapter"]["kind"] == "compressed" else backbone_tokens
    return tokens, cfg["adapter"]["output_dim"]


def points(workdir: Path, backbone_tokens: int) -> list:
    """(label, tokens, bytes/image, T2I R@1, I2T R@1) of every stored-token variant present in results.json."""
    results = json.loads((workdir / "results.json").read_text())["results"]
    out = []
    for name, (ckpt, quant) in VARIANTS.items():
        if name not in results or not (workdir / "ckpt" / ckpt / "config.json").exists():
            continue
        tokens, width = token_shape(workdir / "ckpt" / ckpt, backbone_tokens)
        r = results[name]
        short = re.sub(r"^\([a-g]\) ", "", name).replace("(d) ", "c64-distilled ")
        out.append((short, tokens, bytes_per_image(tokens, width, quant), r["t2i"]["reranked"]["r1"], r["i2t"]["reranked"]["r1"]))
    return out


def plot(workdir: Path, output: Path, backbone_tokens: int) -> list:
    """Write the PNG; returns the plotted points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points(workdir, backbone_tokens)
    base = json.loads((workdir / "results.json").read_text())["results"].get("(a) backbone alone")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (col, label) in zip(axes, ((3, "text→image R@1"), (4, "image→text R@1"))):
        for p in pts:
            ax.scatter(p[2], p[col], s=30 + p[1], alpha=0.8)
            ax.annotate(f"{p[0]} ({p[1]} tok)", (p[2], p[col]), textcoords="offset points", xytext=(5, 4), fontsize=8)
        if base:
            first = base["t2i" if col == 3 else "i2t"]["first_stage"]["r1"]
            ax.axhline(first, color="grey", linestyle="--", label=f"backbone first stage ({first:.1f})")
            ax.legend(loc="center right", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("bytes per image (log)")
        ax.set_ylabel(label + " after reranking")
        ax.grid(alpha=0.3)
    fig.suptitle("Recall vs tokens kept and bytes per image (sample world test split)")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return pts


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="bench_recall.py's --workdir (results.json, ckpt/)")
    p.add_argument("--output", default="docs/recall_vs_bytes.png")
    p.add_argument("--backbone-tokens", type=int, default=65, help="tokens the local variant keeps (edje-tiny-clip: 65)")
    a = p.parse_args(argv)
    for label, tokens, nbytes, t2i, i2t in plot(Path(a.workdir), Path(a.output), a.backbone_tokens):
        print(f"{label:<28}{tokens:>5} tokens {nbytes:>8,} B/image  T2I R@1 {t2i:5.1f}  I2T R@1 {i2t:5.1f}")
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
