"""Attribute-swap negatives made from captions alone: one size word or count of a caption replaced by another.

A reranker whose hard negatives differ from the truth by layout learns relations and leaves size and count to the
first stage (on the open world it orders relation twins 96 % of the time alone, size and count twins 74-81 %).
SugarCrepe's "replace-att" negatives change one attribute word and keep the rest; here the attributes are two closed
classes of English, as the spatial words of the flip are:
- size: a word of one side of the scale (big, large, huge, giant) replaced by one of the other (small, little, tiny);
- count: a numeral of a plural (two ... ten, or its digits) replaced by another.

One mention changes (one thing's size or count), the others stay. As with noun swaps, a replacement only goes into a
context it was seen in among the training captions (the word before and the word or mark after), drawn by its
frequency there, so every word pair of a swapped caption occurs in true ones; and where the caption already names
the new value, it keeps its own word for it (a caption that says "big" and "little" swaps "big" for "little", never
for "small": captions seldom use two words of one value, and a model could tell a swap by that). A context where one
value is more common would still give a swap away by the word alone ("big" after "a" twice as often as "small"), so
each swap carries a weight, as the caption-side flips do (`FlipBalance`): min(n[value], n[other values]) / n[value]
over the context's counts, which gives each value as much weight among true captions as among swapped ones.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from edje.training.noun_swaps import END, START, WORD_TOKEN, DonorTable, article_key, indefinite_article

# Each attribute word's (class, value): a swap replaces a word by one of its class with another value.
_SIZE = {**{w: ("size", "large") for w in ("big", "large", "huge", "giant")},
         **{w: ("size", "small") for w in ("small", "little", "tiny")}}
_COUNT = {w: ("count", n) for n, w in enumerate("two three four five six seven eight nine ten".split(), start=2)}
_DIGITS = {str(n): ("count", n) for n in range(2, 11)}
VALUES: dict[str, tuple[str, object]] = {**_SIZE, **_COUNT, **_DIGITS}
KINDS: tuple[str, ...] = ("size", "count")


@dataclass(frozen=True)
class AttributeSlot:
    """One attribute word of a caption: where it stands, its word and class, and the context a donor must share."""

    start: int
    end: int
    word: str
    kind: str  # "size" or "count"
    context: tuple  # (class, word before with a/an as one, word or mark after)
    article: Optional[tuple] = None  # (start, end) of an "a"/"an" right before it


def attribute_slots(caption: str) -> tuple[AttributeSlot, ...]:
    """The caption's size words and counts, each mention apart, in order."""
    tokens = list(WORD_TOKEN.finditer(caption))
    slots = []
    for i, m in enumerate(tokens):
        word = m.group().lower()
        if word not in VALUES:
            continue
        before = tokens[i - 1].group().lower() if i else START
        after = tokens[i + 1].group().lower() if i + 1 < len(tokens) else END
        kind = VALUES[word][0]
        article = tokens[i - 1].span() if before in ("a", "an") else None
        slots.append(AttributeSlot(m.start(), m.end(), word, kind,
                                   (kind, article_key(before), after), article))
    return tuple(slots)


def replace_slot(caption: str, slot: AttributeSlot, new: str) -> str:
    """``caption`` with the slot's word replaced by ``new`` (case kept) and an "a"/"an" before it fitted to it."""
    old = caption[slot.start:slot.end]
    out = new.capitalize() if old[0].isupper() else new
    if slot.article is None:
        return caption[:slot.start] + out + caption[slot.end:]
    a, b = slot.article
    fitted = indefinite_article(new)
    fitted = fitted.capitalize() if caption[a].isupper() else fitted
    return caption[:a] + fitted + caption[b:slot.start] + out + caption[slot.end:]


class AttributeSwaps:
    """Attribute words of the training captions, counted by context: draws each caption's attribute swap (of the
    ``kinds`` named) and its weight."""

    def __init__(self, captions: Iterable[str], kinds: Iterable[str] = KINDS):
        self.kinds = frozenset(kinds)
        self.donors = DonorTable()
        for c in captions:
            for s in attribute_slots(c):
                self.donors.add(s.context, s.word)

    def weight(self, slot: AttributeSlot) -> float:
        """min(n[value], n[other values]) / n[value] in the slot's context: 0 where no other value was seen there."""
        counts = self.donors.counts.get(slot.context, Counter())
        value = VALUES[slot.word]
        same = sum(n for w, n in counts.items() if VALUES[w] == value)
        return min(same, sum(counts.values()) - same) / same if same else 0.0

    def swap(self, caption: str, rng: np.random.Generator) -> Optional[tuple[str, float]]:
        """``caption`` with one attribute word replaced by a word of another value seen in its context, drawn by
        frequency, and the swap's weight; None when no slot has another value seen in its context."""
        slots = attribute_slots(caption)
        own = {VALUES[s.word]: s.word for s in slots}  # the caption's word for each value it names
        for i in rng.permutation(len(slots)):
            slot = slots[i]
            if slot.kind not in self.kinds:
                continue
            value = VALUES[slot.word]
            new = self.donors.draw(slot.context, lambda w, v=value: VALUES[w] != v and own.get(VALUES[w], w) == w, rng)
            if new is not None:
                return replace_slot(caption, slot, new), self.weight(slot)
        return None
