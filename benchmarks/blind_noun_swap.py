"""How far a BLIND model of word pairs gets on "true caption vs its noun swap": no image.

A naive Bayes over a caption's word bigrams (with start and end marks) is fitted on the train split's captions
against their noun swaps, then asked to pick each held-out (val split) caption over its swap. 50% means a swap
carries no shortcut in its wording that a model could learn without looking at the image. Two rules of swapping:
- context: `NounSwaps` (a donor noun only into a context it was seen in: the word before, the word or mark after,
  the number), drawn by its frequency there;
- free: any slot's noun replaced by any training noun, by its frequency (what a swap without the context rule does).

    .venv/bin/python benchmarks/blind_noun_swap.py --world open --seed 100 --n-train 4000 --n-val 1000
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Callable, Optional, Sequence

import numpy as np
from blind_prior import family_accuracy, records_of, win, world_options

from edje.training.noun_swaps import NounSwaps, noun_slots, swap_noun

Swap = Callable[[str, np.random.Generator], Optional[str]]


def bigrams(text: str) -> list[tuple[str, str]]:
    """The caption's word and mark bigrams, lower-cased, with start and end marks."""
    words = ["^"] + re.findall(r"[a-z]+(?:['-][a-z]+)*|[^\sa-z]", text.lower()) + ["$"]
    return list(zip(words, words[1:]))


class Bigrams:
    """Counts of bigrams among true captions and among their swaps."""

    def __init__(self, captions: Sequence[str], swap: Swap, rng: np.random.Generator):
        self.pos, self.neg = Counter(), Counter()
        for c in captions:
            s = swap(c, rng)
            if s is not None:
                self.pos.update(bigrams(c))
                self.neg.update(bigrams(s))

    def score(self, text: str, a: float = 1.0) -> float:
        """Log-odds that ``text`` is the true side, from its bigrams alone."""
        return sum(math.log((self.pos[b] + a) / (self.neg[b] + a)) for b in bigrams(text))


def context_swap(train: Sequence[str], image_ids: Sequence[str]) -> Swap:
    """`NounSwaps` over the train captions, donors from the training captions alone."""
    swaps = NounSwaps(train, image_ids)
    return lambda c, rng: swaps.swap(c, (), rng)


def free_swap(train: Sequence[str]) -> Swap:
    """Any slot's noun replaced by any training slot noun, by frequency: no context rule."""
    counts = Counter(s.word for c in train for s in noun_slots(c))
    words = sorted(counts)
    p = np.array([counts[w] for w in words], dtype=float)
    p /= p.sum()

    def swap(c: str, rng: np.random.Generator) -> Optional[str]:
        slots = noun_slots(c)
        if not slots:
            return None
        old = slots[rng.integers(len(slots))].word
        present = {s.word for s in slots}
        while True:
            new = words[rng.choice(len(words), p=p)]
            if new not in present:
                return swap_noun(c, old, new)
    return swap


RULES: dict[str, Callable[[Sequence[str], Sequence[str]], Swap]] = {
    "context": context_swap, "free": lambda caps, _ids: free_swap(caps)}


def held_out(records, rule: str | Callable[[Sequence[str], Sequence[str]], Swap], rounds: int = 1000) -> dict:
    """Fit on the train split under ``rule`` (a name in RULES, or a builder of a swap from the train captions and
    their image ids), score the val split's (caption, swap) pairs."""
    train = [(c, r.image_id) for r in records if r.split == "train" for c in r.captions]
    caps = [c for c, _ in train]
    swap = (RULES[rule] if isinstance(rule, str) else rule)(caps, [i for _, i in train])
    table = Bigrams(caps, swap, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    hits, fams = [], []
    for r in records:
        if r.split != "val":
            continue
        for c in r.captions:
            s = swap(c, rng)
            if s is None:
                continue
            hits.append(win(table.score(c), table.score(s)))
            fams.append(r.family_id)
    n_val = sum(len(r.captions) for r in records if r.split == "val")
    return {**family_accuracy(hits, fams, rounds), "swapped": round(100 * len(hits) / n_val, 1)}


def report(args, rules: dict) -> dict:
    """`held_out` of each named rule on the world that ``args`` (`world_options`) names: printed, and written to
    ``args.json`` when given."""
    recs = records_of(args.world, args.seed, args.n_train, args.n_val)
    out = {"world": args.world, "seed": args.seed}
    for name, rule in rules.items():
        v = out[name] = held_out(recs, rule)
        print(f"{name:21s} {v['acc']:6.2f}% {v['ci95']} (n {v['n']}, {v['swapped']}% of val captions swapped, "
              f"{v['families']} families)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


def main(argv: list[str] | None = None) -> dict:
    return report(world_options(__doc__.split("\n")[0], "open").parse_args(argv), {rule: rule for rule in RULES})


if __name__ == "__main__":
    main()
