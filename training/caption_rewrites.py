"""Negatives made from a caption's text alone, by general rules of English: no scene graph, no world vocabulary.

Spatial prepositions and adverbs are a closed class of the language, so reversing them ("left" -> "right",
"above" -> "below") states the opposite layout of the same words and nouns, on any caption (the relation flip
of the `flip` objective; NegCLIP and SugarCrepe build their hard negatives the same way).
"""
from __future__ import annotations

import re

# Each spatial word and its opposite.
OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above", "over": "under", "under": "over",
            "beneath": "above", "top": "bottom", "bottom": "top"}


def _bare(word: str) -> str:
    """A word lower-cased, without punctuation ("(left)," -> "left")."""
    return re.sub(r"[^a-z]", "", word.lower())


def flip_relations(caption: str) -> str | None:
    """The caption with every spatial word replaced by its opposite ("left" -> "right", "above" -> "below"),
    punctuation and case kept; None when it states no relation. A negative made from the text alone: same
    words, same nouns, the layout reversed."""
    words = caption.split()
    flipped = []
    for w in words:
        head = _bare(w)
        if head in OPPOSITE:
            start = w.lower().index(head)
            new = OPPOSITE[head]
            flipped.append(w[:start] + (new.capitalize() if w[start].isupper() else new) + w[start + len(head):])
        else:
            flipped.append(w)
    return " ".join(flipped) if flipped != words else None
