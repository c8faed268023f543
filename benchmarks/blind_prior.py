"""How far a BLIND prior over spatial words alone gets on "true caption vs its flip": no image, no nouns.

A count table keyed by a caption's spatial words (every word of either axis that training/caption_rewrites.py
knows, in order) is fitted on the pairs a training recipe shows a model, on the train split's captions, then asked
to pick each held-out (val split) caption over its flip. Score of a text: log((pos[key] + a) / (neg[key] + a)),
by the whole key ("seq") or naive Bayes over its single words ("bag"); ties count 1/2. 50% means the flips carry no
shortcut a model could learn without looking at the image.

Recipes (what a model sees as (positive, negative, weight)):
- plain:   (c, flip c, 1) for every caption with a flip: the `flip` objective as it stood.
- caption: (c, flip c, w) with w from `FlipBalance(axis=None)`: the `flip` objective's caption mode.
- trainer: horizontal flips as a flip square, (c, flip c) and (flip c, c) (the mirrored image makes the flipped
           caption true); vertical flips caption-side only, weighted by `FlipBalance`.
- orientation: (c, flip_orientation c, w) with w from `FlipBalance(ORIENTATION)`: the backbone's orientation
           negatives (the way things face reversed, their places kept).

    .venv/bin/python benchmarks/blind_prior.py --world shapes --seed 100 --n-train 4000 --n-val 1000
"""
from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from functools import lru_cache
from typing import Callable, Iterable, Sequence

import numpy as np

from edje.training.caption_rewrites import (
    HORIZONTAL,
    OPPOSITES,
    ORIENTATION,
    UNPAIRED,
    VERTICAL,
    FlipBalance,
    caption_axes,
    flip_axis,
    flip_orientation,
    flip_relations,
)

SPATIAL = frozenset(w for axis in OPPOSITES for w in OPPOSITES[axis]) | frozenset().union(*UNPAIRED.values())
Pair = tuple  # (positive text, negative text, weight)
Recipe = Callable[[str], list]


@lru_cache(maxsize=1 << 17)
def key(caption: str) -> tuple[str, ...]:
    """The caption's spatial words, lower-cased, in order: all a blind table reads."""
    return tuple(w for w in (m.group().lower() for m in re.finditer(r"[A-Za-z]+", caption)) if w in SPATIAL)


def plain(flip: Callable[[str], str | None]) -> Recipe:
    """Each caption against its flip, weight 1."""
    def pairs(c: str) -> list:
        f = flip(c)
        return [] if f is None else [(c, f, 1.0)]
    return pairs


def trainer(train_captions: Sequence[str]) -> Recipe:
    """The flip square on the horizontal axis, balanced caption-side flips on the vertical one."""
    balance = FlipBalance(train_captions, VERTICAL)

    def pairs(c: str) -> list:
        out = []
        for axis in caption_axes(c):
            f = flip_axis(c, axis)
            out += [(c, f, 1.0), (f, c, 1.0)] if axis == HORIZONTAL else [(c, f, balance.weight(c))]
        return out
    return pairs


def caption(train_captions: Sequence[str]) -> Recipe:
    """Each caption against its `flip_relations` flip, weighted by a `FlipBalance` with no axis."""
    balance = FlipBalance(train_captions, axis=None)

    def pairs(c: str) -> list:
        f = flip_relations(c)
        return [] if f is None else [(c, f, balance.weight(c))]
    return pairs


def orientation(train_captions: Sequence[str]) -> Recipe:
    """Each caption against its `flip_orientation` flip, weighted by a `FlipBalance` on ORIENTATION: the backbone's
    orientation negatives."""
    balance = FlipBalance(train_captions, ORIENTATION)

    def pairs(c: str) -> list:
        f = flip_orientation(c)
        return [] if f is None else [(c, f, balance.weight(c))]
    return pairs


def balanced(flip: Callable[[str], str | None], train_captions: Sequence[str]) -> Recipe:
    """Any rewrite, weighted as `FlipBalance` weights the vertical flips (min(n[k], n[key of flip]) / n[k]): it
    balances the table only when the rewrite is its own inverse."""
    counts = Counter(key(c) for c in train_captions if flip(c) is not None)

    def pairs(c: str) -> list:
        f = flip(c)
        if f is None:
            return []
        n = counts.get(key(c), 0)
        return [(c, f, min(n, counts.get(key(f), 0)) / n if n else 0.0)]
    return pairs


class Table:
    """Weighted positive and negative counts of spatial-word keys and of single spatial words."""

    def __init__(self, captions: Iterable[str], recipe: Recipe):
        self.pos, self.neg, self.pos_w, self.neg_w = Counter(), Counter(), Counter(), Counter()
        for c in captions:
            for p, n, w in recipe(c):
                self.pos[key(p)] += w
                self.neg[key(n)] += w
                for word in key(p):
                    self.pos_w[word] += w
                for word in key(n):
                    self.neg_w[word] += w

    def score(self, text: str, kind: str, a: float = 1.0) -> float:
        """Log-odds that ``text`` is the true side, from its spatial words alone."""
        if kind == "seq":
            k = key(text)
            return math.log((self.pos[k] + a) / (self.neg[k] + a))
        return sum(math.log((self.pos_w[w] + a) / (self.neg_w[w] + a)) for w in key(text))


def accuracy(pairs: Sequence[tuple], families: Sequence[int], table: Table, kind: str, rounds: int = 1000) -> dict:
    """Share of (true, flip) pairs whose true side scores higher, with a 95% interval that resamples whole
    families (their members share words)."""
    if not pairs:
        raise ValueError("no pairs to score")
    return family_accuracy([win(table.score(true, kind), table.score(flipped, kind)) for true, flipped in pairs],
                           families, rounds)


def win(true_score: float, other_score: float) -> float:
    """1 when the true side scores higher, 1/2 on a tie, else 0."""
    return 1.0 if true_score > other_score + 1e-12 else 0.5 if abs(true_score - other_score) <= 1e-12 else 0.0


def family_accuracy(hits: Sequence[float], families: Sequence[int], rounds: int = 1000) -> dict:
    """Mean of the pairs' hits, with a 95% interval that resamples whole families (their members share words)."""
    ids, inv = np.unique(np.asarray(families), return_inverse=True)
    sums = np.bincount(inv, weights=np.asarray(hits), minlength=len(ids))
    counts = np.bincount(inv, minlength=len(ids))
    draw = np.random.default_rng(0).integers(0, len(ids), size=(rounds, len(ids)))
    means = sums[draw].sum(1) / counts[draw].sum(1)
    return {"acc": round(100 * float(np.mean(hits)), 2),
            "ci95": [round(100 * float(np.percentile(means, q)), 1) for q in (2.5, 97.5)],
            "ties": round(100 * float(np.mean(np.asarray(hits) == 0.5)), 1), "n": len(hits), "families": len(ids)}


def held_out(records, recipe_of: Callable[[list], Recipe], eval_flips: Callable[[str], list], kind: str = "seq") -> dict:
    """Fit on the train split's captions under the recipe, score the val split's (caption, flip) pairs."""
    train = [c for r in records if r.split == "train" for c in r.captions]
    table = Table(train, recipe_of(train))
    pairs, fams = [], []
    for r in records:
        if r.split != "val":
            continue
        for c in r.captions:
            for f in eval_flips(c):
                pairs.append((c, f))
                fams.append(r.family_id)
    return accuracy(pairs, fams, table, kind)


def new_flips(c: str) -> list:
    """Every one-axis flip of a caption: the pairs a model trained with the trainer recipe is asked about."""
    return [flip_axis(c, a) for a in caption_axes(c)]


def one_flip(flip: Callable[[str], str | None]) -> Callable[[str], list]:
    """The single flip a rewrite makes, as a list."""
    return lambda c: [f for f in (flip(c),) if f is not None]


def records_of(world: str, seed: int, n_train: int, n_val: int):
    """A world's records without images (the generator's own captions and families)."""
    from edje.sampleworld.open_world import open_world_config
    from edje.sampleworld.world import WorldConfig, sample_records

    config = (open_world_config(seed=seed, n_train=n_train, n_val=n_val, n_test=0) if world == "open"
              else WorldConfig(seed=seed, n_train=n_train, n_val=n_val, n_test=0))
    return sample_records(config)


def world_options(description: str, world: str) -> argparse.ArgumentParser:
    """The blind checks' command line: which world's records (default ``world``), and where to write the JSON."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--world", choices=("shapes", "open"), default=world)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--n-val", type=int, default=1000)
    ap.add_argument("--json", default="")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = world_options(__doc__.split("\n")[0], "shapes").parse_args(argv)
    recs = records_of(args.world, args.seed, args.n_train, args.n_val)
    out = {"world": args.world, "seed": args.seed}
    for kind in ("seq", "bag"):
        out[f"plain/{kind}"] = held_out(recs, lambda _: plain(flip_relations), one_flip(flip_relations), kind)
        out[f"caption/{kind}"] = held_out(recs, caption, one_flip(flip_relations), kind)
        out[f"trainer/{kind}"] = held_out(recs, trainer, new_flips, kind)
    for name, v in out.items():
        if "/" in name:
            print(f"{name:14s} {v['acc']:6.2f}% {v['ci95']} (ties {v['ties']}%, n {v['n']}, {v['families']} families)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
