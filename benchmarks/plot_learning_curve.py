"""Reranked R@1 against training step, with the first stage as a line (docs/learning_curve.png).

Reads the metrics.json that `jobs/evaluate.py` wrote for each evaluated checkpoint of one run:

  python benchmarks/plot_learning_curve.py --eval 200=runs/edje/eval/c16-s200 600=runs/edje/eval/c16-s600 \
      --output docs/learning_curve.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", nargs="+", required=True, metavar="STEP=DIR", help="evaluation folders by training step")
    p.add_argument("--output", default="docs/learning_curve.png")
    p.add_argument("--title", default="EDJE on the sample world (val split): R@1 against training step")
    a = p.parse_args(argv)
    rows = []
    for item in a.eval:
        step, _, folder = item.partition("=")
        rows.append((int(step), json.loads((Path(folder) / "metrics.json").read_text())))
    rows.sort(key=lambda r: r[0])
    steps = [s for s, _ in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, d, label in ((axes[0], "t2i", "text → image"), (axes[1], "i2t", "image → text")):
        ax.axhline(rows[-1][1][d]["first_stage"]["r1"], color="grey", ls="--", label="first stage")
        itm = [m[d].get("reranked_itm_only", m[d]["reranked"])["r1"] for _, m in rows]
        ax.plot(steps, itm, "o-", label="reranked, ITM alone")
        fused = [(s, m[d]["reranked"]["r1"]) for s, m in rows if "reranked_itm_only" in m[d]]
        if fused:
            ax.plot(*zip(*fused), "s-", label="reranked, ITM + w × first-stage cosine (w fitted on val)")
        ax.set_title(label)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("R@1 (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle(a.title, fontsize=10)
    fig.tight_layout()
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.output, dpi=110)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
