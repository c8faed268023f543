"""How far a BLIND model of word pairs gets on "true caption vs its attribute swap": no image.

The naive Bayes over word bigrams of benchmarks/blind_noun_swap.py, fitted on the train split's captions against
their attribute swaps (`AttributeSwaps`: one size word or count replaced by another seen in its context), then asked
to pick each held-out (val split) caption over its swap. The objective weighs each swap (`AttributeSwaps.weight`);
here a swap is shown with that probability ("weighted"), or always ("unweighted", what the objective would be
without the weights). 50% means the swaps carry no shortcut in their wording.

    .venv/bin/python benchmarks/blind_attribute_swap.py --world open --seed 100 --n-train 4000 --n-val 1000
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from blind_noun_swap import Swap, report
from blind_prior import world_options

from edje.training.attribute_swaps import KINDS, AttributeSwaps


def attribute_swap(weighted: bool, kinds: Sequence[str] = KINDS):
    """A builder of the swap (of ``kinds``) from the train captions: each swap kept with its weight's probability if
    ``weighted``."""
    def build(train: Sequence[str], _image_ids: Sequence[str]) -> Swap:
        swaps = AttributeSwaps(train, kinds)

        def swap(c: str, rng: np.random.Generator) -> Optional[str]:
            s = swaps.swap(c, rng)
            if s is None or (weighted and rng.random() >= s[1]):
                return None
            return s[0]
        return swap
    return build


def main(argv: list[str] | None = None) -> dict:
    args = world_options(__doc__.split("\n")[0], "open").parse_args(argv)
    return report(args, {f"{'+'.join(kinds)} {name}": attribute_swap(weighted, kinds)
                         for kinds in (KINDS, ("size",), ("count",))
                         for name, weighted in (("weighted", True), ("unweighted", False))})


if __name__ == "__main__":
    main()
