"""Negatives made from a caption's text alone, by general rules of English: no scene graph, no world vocabulary.

Spatial words are a closed class of the language, so reversing them ("left" -> "right", "above" -> "below")
states the opposite layout of the same words and nouns, on any caption (the relation flip of the `flip`
objective; NegCLIP and SugarCrepe build their hard negatives the same way).

The flip reverses one axis at a time, and on every word it touches it is its own inverse: each word maps to a
word that maps back to it, so flip(flip(c)) == c and a flipped caption uses the same words as true ones do.
A horizontal flip is also what a left-right mirror does to the image ("left-facing" -> "right-facing"
included), so (mirror image, flipped caption) is a true pair: the *flip square*. Vertical flips have no
such image (a mirrored triangle points down), so they stay caption-side only; `FlipBalance` weights them so
that a blind model cannot tell a true caption from its flip by its spatial words, and does the same for
`flip_relations` (every flip caption-side, one axis a caption).

`flip_orientation` reverses only the sides that say which way a thing faces ("left-facing", "facing left",
"pointing right"), not where things are: true of no image the caption describes, and told apart from the caption
only by how each thing faces, where a full horizontal flip can also be told by where things stand.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Iterable

HORIZONTAL, VERTICAL = "horizontal", "vertical"
AXES = (HORIZONTAL, VERTICAL)
# FlipBalance's name for the flips of `flip_orientation` (the horizontal words of orientation alone).
ORIENTATION = "orientation"

# Each axis's spatial words with their opposites, one pair each. "beneath" pairs with "atop" (both single-word
# prepositions) so that it maps to a word that maps back to it; "above" already pairs with "below".
_PAIRS = {
    HORIZONTAL: (("left", "right"), ("leftmost", "rightmost"), ("leftward", "rightward"),
                 ("leftwards", "rightwards")),
    VERTICAL: (("above", "below"), ("over", "under"), ("top", "bottom"), ("upper", "lower"),
               ("uppermost", "lowermost"), ("topmost", "bottommost"), ("atop", "beneath")),
}
OPPOSITES = {axis: {a: b for x, y in pairs for a, b in ((x, y), (y, x))} for axis, pairs in _PAIRS.items()}
# Spatial words with no single-word opposite: a caption using one is not flipped on its axis, since a caption
# flipped around it would state no consistent layout.
UNPAIRED = {HORIZONTAL: frozenset(), VERTICAL: frozenset({"underneath"})}
# "left" and "right" are also a verb and an adjective ("a man left the room", "the right answer"); they are
# spatial only beside these words: "to the left", "its right", "top left", "facing left", "left of", "left-facing".
_SIDE_BEFORE = frozenset({"the", "to", "on", "at", "its", "their", "his", "her", "my", "your", "our", "from", "far",
                          "top", "bottom", "upper", "lower", "facing", "and", "or"})
_SIDE_AFTER = frozenset({"of", "side", "sides", "hand", "-"})
_SIDE_WORDS = frozenset({"left", "right"})
# Verbs of orientation: a side right after one ("facing left") or joined to one ("left-facing") is the way a thing
# faces, not where it is.
# ("looks right" and "heads" are left out: "it looks right", "heads or tails".)
_ORIENTATION_VERBS = frozenset({"facing", "faces", "face", "pointing", "points", "point", "heading", "turned",
                                "turning"})
_JOINED_VERB = re.compile(r"-(" + "|".join(sorted(_ORIENTATION_VERBS)) + r")(?![A-Za-z])", re.IGNORECASE)
_ALL = sorted({w for axis in AXES for w in (*OPPOSITES[axis], *UNPAIRED[axis])}, key=len, reverse=True)
_CANDIDATE = re.compile(r"(?<![A-Za-z])(" + "|".join(_ALL) + r")(?![A-Za-z])", re.IGNORECASE)
_LAST_WORD = re.compile(r"([A-Za-z]+)[^A-Za-z]*$")
_NEXT_WORD = re.compile(r"\s*(-|[A-Za-z]+)")


def _is_side(caption: str, m: re.Match) -> bool:
    """Whether a bare "left" or "right" is a side here: beside a word that makes it one."""
    before = _LAST_WORD.search(caption, 0, m.start())
    after = _NEXT_WORD.match(caption, m.end())
    return ((before is not None and before.group(1).lower() in _SIDE_BEFORE | _ORIENTATION_VERBS)
            or (after is not None and after.group(1).lower() in _SIDE_AFTER))


@lru_cache(maxsize=1 << 16)  # a training run asks about the same captions every epoch
def _spatial(caption: str) -> tuple[tuple[str, int, int, str], ...]:
    """(axis, start, end, lower-cased word) of each spatial word of the caption, in order."""
    out = []
    for m in _CANDIDATE.finditer(caption):
        word = m.group().lower()
        if word in _SIDE_WORDS and not _is_side(caption, m):
            continue
        out.append((next(a for a in AXES if word in OPPOSITES[a] or word in UNPAIRED[a]), m.start(), m.end(), word))
    return tuple(out)


def _cased(new: str, old: str) -> str:
    """``new`` in ``old``'s case: "Left" -> "Right", "LEFT" -> "RIGHT"."""
    if old.isupper() and len(old) > 1:
        return new.upper()
    return new.capitalize() if old[0].isupper() else new


def spatial_words(caption: str) -> tuple[str, ...]:
    """The caption's spatial words on every axis, lower-cased, in order: the key a blind model could read."""
    return tuple(word for _, _, _, word in _spatial(caption))


@lru_cache(maxsize=1 << 16)
def flip_axis(caption: str, axis: str) -> str | None:
    """The caption with its spatial words on ``axis`` reversed ("left" <-> "right"; "above" <-> "below"),
    punctuation and case kept; None when it has none on that axis, or one with no opposite ("underneath")."""
    hits = [(start, end, word) for a, start, end, word in _spatial(caption) if a == axis]
    if not hits or any(word in UNPAIRED[axis] for _, _, word in hits):
        return None
    return _reversed(caption, hits, axis)


def _reversed(caption: str, hits: list, axis: str) -> str:
    """The caption with each (start, end, word) of ``hits`` replaced by its opposite on ``axis``, in its case."""
    out, at = [], 0
    for start, end, word in hits:
        out += [caption[at:start], _cased(OPPOSITES[axis][word], caption[start:end])]
        at = end
    return "".join(out) + caption[at:]


def _orientation_hits(caption: str) -> list:
    """(start, end, word) of each side of orientation in the caption."""
    return [(start, end, word) for axis, start, end, word in _spatial(caption)
            if axis == HORIZONTAL and word in _SIDE_WORDS and _is_orientation(caption, start, end)]


def _is_orientation(caption: str, start: int, end: int) -> bool:
    """Whether the side word at caption[start:end] says which way something faces: "facing left", "left-facing"."""
    before = _LAST_WORD.search(caption, 0, start)
    return ((before is not None and before.group(1).lower() in _ORIENTATION_VERBS)
            or _JOINED_VERB.match(caption, end) is not None)


def orientation_words(caption: str) -> tuple[str, ...]:
    """The caption's sides of orientation ("left" of "left-facing"), lower-cased, in order: a blind model's key."""
    return tuple(word for _, _, word in _orientation_hits(caption))


@lru_cache(maxsize=1 << 16)
def flip_orientation(caption: str) -> str | None:
    """The caption with only its sides of orientation reversed ("a left-facing dog left of a cat" -> "a right-facing
    dog left of a cat"); None when it has none. Its own inverse, like `flip_axis`."""
    hits = _orientation_hits(caption)
    return _reversed(caption, hits, HORIZONTAL) if hits else None


def caption_axes(caption: str) -> tuple[str, ...]:
    """The axes on which the caption can be flipped, horizontal first: a horizontal one can make a flip square
    with the mirrored image, a vertical one only a caption-side flip."""
    return tuple(a for a in AXES if flip_axis(caption, a) is not None)


def flip_relations(caption: str) -> str | None:
    """The caption reversed on one axis, horizontal when it has horizontal spatial words, else vertical; None
    when it can be flipped on neither. A negative made from the text alone: same words, same nouns, the layout
    reversed."""
    for axis in AXES:
        flipped = flip_axis(caption, axis)
        if flipped is not None:
            return flipped
    return None


class FlipBalance:
    """Weights for caption-side flips, counted over the training captions, that give every key of spatial words
    (both axes) as much weight among the true captions as among the flipped ones. ``axis`` names the flips: those
    on one axis (`flip_axis`), or with None those of `flip_relations` (one axis a caption, horizontal first).

    A caption-side flip shows a model (image, c) as true and (image, flip c) as false. If the data says "above"
    more often than "below" (a world that words "above" two ways and "below" three), a blind count of the spatial
    words alone beats chance. Weighting a caption with key k by min(n[k], n[flip k]) / n[k] leaves each key with
    min(n[k], n[flip k]) as a positive and the same as a negative, because the flip is its own inverse. With
    ``axis`` None the keys still pair up: a key with horizontal words flips to one with horizontal words, a key
    with vertical words only to one with vertical words only. With ``axis`` ORIENTATION the flips are those of
    `flip_orientation` and the key is the sides of orientation alone (the other spatial words do not change)."""

    def __init__(self, captions: Iterable[str], axis: str | None):
        self.axis = axis
        self.counts: Counter = Counter(self.key(c) for c in captions if self.flip(c) is not None)

    def flip(self, caption: str) -> str | None:
        """The caption's flip that this balance weighs; None when it has none."""
        if self.axis is None:
            return flip_relations(caption)
        return flip_orientation(caption) if self.axis == ORIENTATION else flip_axis(caption, self.axis)

    def key(self, caption: str) -> tuple[str, ...]:
        """The words a blind model could tell the caption from its flip by."""
        return orientation_words(caption) if self.axis == ORIENTATION else spatial_words(caption)

    def weight(self, caption: str) -> float:
        """The caption's flip weight in [0, 1]; 0 for a caption that cannot be flipped or whose flipped key never
        occurs as a true caption."""
        flipped = self.flip(caption)
        n = self.counts.get(self.key(caption), 0) if flipped is not None else 0
        return min(n, self.counts.get(self.key(flipped), 0)) / n if n else 0.0
