"""A PNG grid of example text-to-image queries: the top 5 before and after reranking, the answer marked."""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on workers or CI
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from edje.schemas.annotations import Annotations

TOP = 5


def pick_examples(first: np.ndarray, reranked: np.ndarray, answers, n: int) -> list:
    """Queries worth showing: reranking fixed the top 1, then broke it, then any; deterministic."""
    fixed, broke, rest = [], [], []
    for q in range(first.shape[0]):
        a, b = first[q, 0] in answers[q], reranked[q, 0] in answers[q]
        (fixed if b and not a else broke if a and not b else rest).append(q)
    return (fixed[: max(1, n - 1)] + broke[:1] + rest)[:n]


def example_grid(ann: Annotations, t2i, path: Path, n: int = 4, reranked: bool = True) -> Path:
    """Write `path`: one row per query, 5 first-stage images then 5 reranked, the correct one framed green."""
    queries = pick_examples(t2i.first, t2i.reranked, t2i.answers, n)
    cols = 2 * TOP if reranked else TOP
    fig, axes = plt.subplots(len(queries), cols, figsize=(1.6 * cols, 2.1 * len(queries)), squeeze=False)
    for r, q in enumerate(queries):
        lists = [("before", t2i.first[q])] + ([("after", t2i.reranked[q])] if reranked else [])
        for block, (label, ranking) in enumerate(lists):
            for j in range(TOP):
                ax = axes[r, block * TOP + j]
                ax.set_xticks([])
                ax.set_yticks([])
                if j >= len(ranking):
                    ax.axis("off")
                    continue
                img = ranking[j]
                with Image.open(ann.image_paths[img]) as im:
                    ax.imshow(np.asarray(im.convert("RGB")))
                hit = img in t2i.answers[q]
                for spine in ax.spines.values():
                    spine.set_edgecolor("limegreen" if hit else "lightgray")
                    spine.set_linewidth(4 if hit else 1)
                ax.set_title(f"{label} #{j + 1}" + (" ✓" if hit else ""), fontsize=7, color="green" if hit else "black")
        axes[r, 0].set_ylabel("\n".join(textwrap.wrap(ann.captions[q], 28)[:5]), fontsize=6, rotation=0,
                              ha="right", va="center", labelpad=4)
    fig.suptitle("text→image: top 5 before (left) and after (right) reranking; green = correct image", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
