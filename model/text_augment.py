"""Caption augmentation for contrastive text-tower training and for fitting the ranking rule on varied wordings: the
generic word-level operations of EDA (Wei and Zou, 2019: random swap, random deletion) and AEDA (Karimi et al., 2021:
random punctuation insertion), and function-word drops.

A backbone trained on one corpus's phrasing reads another phrasing badly: its text tower has only seen the word
orders and punctuation of its training captions. These operations know no vocabulary and no world: they perturb a
caption's form while keeping most of its words. A swap can move a relation's words, so the rate is a share of
captions and most stay as written; on the open world it read an unseen terse form better and relation sentences worse
(BENCHMARKS.md, "A text tower that has read varied phrasing").
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from edje.model.content_words import FUNCTION_WORDS

# AEDA's punctuation marks, as the paper inserts them.
PUNCTUATION = (".", ";", "?", ":", "!", ",")
OPERATIONS = ("swap", "delete", "punctuate")
# Beyond EDA/AEDA: each of English's function words (model/content_words.py: articles, auxiliaries, non-spatial
# prepositions; spatial words and numerals are content) dropped with probability one half. A sentence turns terse
# ("a small dog to the left of a cat" -> "small dog left cat") while what it says of the image stays: no swap moves
# who is where.
ALL_OPERATIONS = OPERATIONS + ("function_words",)


def check_operations(ops: Sequence[str]) -> None:
    """ValueError unless `ops` names one or more of ALL_OPERATIONS."""
    if not ops or set(ops) - set(ALL_OPERATIONS):
        raise ValueError(f"augmentation operations must be some of {ALL_OPERATIONS}, got {tuple(ops)}")


def check_text_augment(rate: float, ops: Sequence[str]) -> None:
    """ValueError unless `rate` (a share of captions) is in [0, 1] and `ops` names some of ALL_OPERATIONS."""
    # Called by the configs, so that a job's options fail when it starts, not at its first augmented batch.
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"text_augment must be in [0, 1], got {rate}")
    check_operations(ops)


def augment_caption(caption: str, rng: np.random.Generator, alpha: float = 0.1,
                    ops: Sequence[str] = OPERATIONS) -> str:
    """``caption`` with one of `ops` drawn at random: ``max(1, alpha * words)`` random swaps, each word deleted with
    probability ``alpha`` (at least one kept), between 1 and a third of the words in punctuation marks inserted, or
    each function word dropped with probability one half (at least one word kept)."""
    words = caption.split()
    if len(words) < 2:
        return caption
    op = ops[rng.integers(len(ops))]
    if op == "function_words":
        kept = [w for w, u in zip(words, rng.random(len(words))) if u >= 0.5 or w.lower() not in FUNCTION_WORDS]
        words = kept or [words[rng.integers(len(words))]]
    elif op == "swap":
        for _ in range(max(1, int(alpha * len(words)))):
            i, j = rng.choice(len(words), size=2, replace=False)
            words[i], words[j] = words[j], words[i]
    elif op == "delete":
        kept = [w for w, u in zip(words, rng.random(len(words))) if u >= alpha]
        words = kept or [words[rng.integers(len(words))]]
    else:
        for _ in range(rng.integers(1, max(1, len(words) // 3) + 1)):
            words.insert(int(rng.integers(len(words) + 1)), PUNCTUATION[rng.integers(len(PUNCTUATION))])
    return " ".join(words)


def augment_batch(captions: Sequence[str], rate: float, rng: np.random.Generator, alpha: float = 0.1,
                  ops: Sequence[str] = OPERATIONS) -> Tuple[List[str], List[int]]:
    """The batch's captions with each rewritten by `augment_caption` with probability ``rate``, and the rewritten rows."""
    check_operations(ops)
    rows = np.flatnonzero(rng.random(len(captions)) < rate).tolist()
    out = list(captions)
    for r in rows:
        out[r] = augment_caption(out[r], rng, alpha, ops)
    return out, rows
