"""The English both kinds share: relation phrases of captions, and caption words as grounding reads them."""
from __future__ import annotations

import re

# "<subject> REL <object>"
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left_of": ("to the left of", "left of", "on the left of"),
    "right_of": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "beneath", "under"),
}
SHORT_RELATION: dict[str, str] = {"left_of": "left of", "right_of": "right of", "above": "above", "below": "below"}
# "... and, PRON, <thing>": the thing is REL of "it"
PRONOUN_RELATION: dict[str, str] = {
    "left_of": "to its left",
    "right_of": "to its right",
    "above": "above it",
    "below": "below it",
}
# "between <a> SIDE and <c> SIDE"
SIDE: dict[str, str] = {"left_of": "on the left", "right_of": "on the right", "above": "at the top", "below": "at the bottom"}


def bare(word: str) -> str:
    """A caption word lower-cased, without punctuation ("(large)," -> "large")."""
    return re.sub(r"[^a-z]", "", word.lower())
