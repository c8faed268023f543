"""Noun-swap negatives made from captions alone: one noun of a caption replaced by a noun of another caption.

A reranker trained on mined negatives can win by layout, size and count and never learn which thing is which:
its negatives seldom differ from the truth by the noun alone (NegCLIP and SugarCrepe's "replace-object"
negatives fix exactly that). A swap keeps the caption and its image and changes one noun, every mention of it.

Nouns are found by a rule of English, no word list of any world: a *slot* is the last word of a run of content
words (outside the closed classes of function words, numerals and spatial words), so "a small red dog to the left
of two bicycles" has the slots "dog" and "bicycles". A noun may only replace a slot whose context it has itself
been seen in: the same word before it, the same word or mark after it, and the same number (a plural "-s"). So a
compound ("palm trees") or a verb that happens to end a run ("a parrot facing left") only ever swaps with words
seen in its place, and a model that reads the text alone finds every bigram of a swapped caption in true ones.
Donors come first from the caption's hard negatives' captions (its image's neighbours: dog for wolf, car for
taxi), else from the training captions by their frequency in that context, so that a noun is as common among
swapped captions as among true ones.

A swap that names the same thing another way ("dog" for "hound") would be a false negative. Where an image has
several captions, two words that describe one image in different captions and never share a caption are taken
for two names of one thing and never swap for each other (different things of an image share its captions).
"""
from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from edje.model.content_words import FUNCTION_WORDS
from edje.training.caption_rewrites import OPPOSITES, UNPAIRED

# Closed classes of English besides the function words: numerals, and spatial words with no opposite (a slot is a
# thing, never where it is or how many).
NUMERALS = frozenset("zero one two three four five six seven eight nine ten eleven twelve dozen".split())
SPATIAL = (frozenset(w for axis in OPPOSITES for w in OPPOSITES[axis]) | frozenset().union(*UNPAIRED.values())
           | frozenset("middle centre center between beside behind near next front side sides corner".split()))
# A caption's words (hyphenated and apostrophised ones whole), numbers and marks.
WORD_TOKEN = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*|[0-9]+|[^\sA-Za-z0-9]")
START, END = "^", "$"


@dataclass(frozen=True)
class Slot:
    """A noun slot of a caption: its word (lower-cased) and the context a donor must share."""

    word: str
    key: tuple  # (word before, word or mark after, plural)
    article: Optional[str] = None  # "a" or "an" when one stands right before the word


def _is_content(token: str) -> bool:
    low = token.lower()
    return token[0].isalpha() and low not in FUNCTION_WORDS and low not in NUMERALS and low not in SPATIAL


def _is_slot(token: str) -> bool:
    """A content word that can name a thing: "left-facing" continues a run but says which way, not what."""
    return _is_content(token) and not any(part in SPATIAL for part in token.lower().split("-"))


def _plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith(("ss", "us", "is"))


def article_key(word: str) -> str:
    """a/an as one context: the swap rewrites the article to fit the donor."""
    return "a" if word in ("a", "an") else word


def indefinite_article(word: str) -> str:
    """"a" or "an" before ``word``, by its first letter."""
    return "an" if word[:1].lower() in "aeiou" else "a"


@lru_cache(maxsize=1 << 17)  # a training run asks about the same captions every epoch
def noun_slots(caption: str) -> tuple[Slot, ...]:
    """The caption's noun slots, in order, one per distinct word (a word mentioned twice is one slot)."""
    tokens = WORD_TOKEN.findall(caption)
    slots, seen = [], set()
    for i, tok in enumerate(tokens):
        if not _is_slot(tok) or (i + 1 < len(tokens) and _is_content(tokens[i + 1])):
            continue
        word = tok.lower()
        if word in seen:
            continue
        seen.add(word)
        before = tokens[i - 1].lower() if i else START
        after = tokens[i + 1].lower() if i + 1 < len(tokens) else END
        slots.append(Slot(word, (article_key(before), after, _plural(word)), before if before in ("a", "an") else None))
    return tuple(slots)


def swap_noun(caption: str, old: str, new: str, article: Optional[str] = None) -> str:
    """``caption`` with every mention of the word ``old`` replaced by ``new`` (case kept), and an "a"/"an" right
    before each mention rewritten for ``new``: ``article`` when given (the one the data puts before it), else by
    its first letter."""
    new_article = article

    def sub(m: re.Match) -> str:
        article, space, word = m.group(1), m.group(2), m.group(3)
        out = new.capitalize() if word[0].isupper() else new
        if article:
            fixed = new_article or indefinite_article(new)
            article = fixed.capitalize() if article[0].isupper() else fixed
        return (article or "") + (space or "") + out
    pattern = re.compile(r"(?:\b(an?|An?)(\s+))?(?<![A-Za-z'-])(" + re.escape(old) + r")(?![A-Za-z'-])", re.IGNORECASE)
    return pattern.sub(sub, caption)


def aliases(captions: Iterable[str], image_ids: Iterable[str]) -> frozenset[frozenset[str]]:
    """Pairs of slot words that describe one image in different captions and never share a caption."""
    by_image: dict[str, list[set]] = defaultdict(list)
    for c, i in zip(captions, image_ids):
        by_image[i].append({s.word for s in noun_slots(c)})
    across, together = set(), set()
    for sets in by_image.values():
        if len(sets) < 2:
            continue
        for a, b in itertools.combinations(sorted(set().union(*sets)), 2):
            (together if any(a in s and b in s for s in sets) else across).add(frozenset((a, b)))
    return frozenset(across - together)


class DonorTable:
    """Words counted by the context they were seen in; draws one by its frequency there among those a caller keeps."""

    def __init__(self):
        self.counts: dict[tuple, Counter] = defaultdict(Counter)
        self._draw: dict[tuple, tuple[list, np.ndarray]] = {}

    def add(self, key: tuple, word: str) -> None:
        """Count ``word`` once more in the context ``key``."""
        self.counts[key][word] += 1
        self._draw.pop(key, None)

    def draw(self, key: tuple, keep: Callable[[str], bool], rng: np.random.Generator) -> Optional[str]:
        """A word seen in ``key`` for which ``keep`` holds, drawn by its count there; None when there is none."""
        if key not in self._draw:
            counts = self.counts.get(key, Counter())
            words = sorted(counts)
            n = np.array([counts[w] for w in words], dtype=float)
            self._draw[key] = (words, n / n.sum() if len(n) else n)
        words, p = self._draw[key]
        q = p * np.array([keep(w) for w in words], dtype=bool)
        return words[rng.choice(len(words), p=q / q.sum())] if q.any() else None


class NounSwaps:
    """Noun slots of the training captions, counted by context: draws each caption's noun-swap negative.
    ``image_ids`` (one per caption) lets it find two names of one thing (`aliases`) and never swap them."""

    def __init__(self, captions: Iterable[str], image_ids: Optional[Iterable[str]] = None):
        captions = list(captions)
        self.donors = DonorTable()
        articles: dict[str, Counter] = defaultdict(Counter)  # "an hour", "a unicorn": the data says which
        for c in captions:
            for s in noun_slots(c):
                self.donors.add(s.key, s.word)
                if s.article:
                    articles[s.word][s.article] += 1
        self.articles = {w: c.most_common(1)[0][0] for w, c in articles.items()}
        self.aliases = aliases(captions, image_ids) if image_ids is not None else frozenset()

    def _allowed(self, old: str, new: str, present: set) -> bool:
        return new not in present and frozenset((old, new)) not in self.aliases

    def swap(self, caption: str, neighbours: Sequence[str], rng: np.random.Generator) -> Optional[str]:
        """``caption`` with one noun replaced: by a noun of a ``neighbours`` caption seen in the same context when
        there is one, else by a training caption's noun drawn by its frequency in that context; None when no slot
        has another noun seen in its context."""
        slots = noun_slots(caption)
        present = {s.word for s in slots}
        near = [(s, d.word) for s in slots for n in neighbours for d in noun_slots(n)
                if d.key == s.key and self._allowed(s.word, d.word, present)]
        if near:
            slot, new = near[rng.integers(len(near))]
            return swap_noun(caption, slot.word, new, self.articles.get(new))
        order = rng.permutation(len(slots))
        for i in order:
            slot = slots[i]
            new = self.donors.draw(slot.key, lambda w, old=slot.word: self._allowed(old, w, present), rng)
            if new is not None:
                return swap_noun(caption, slot.word, new, self.articles.get(new))
        return None
