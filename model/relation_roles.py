"""Roles of caption words in spatial relations: by the rule of English (`mention_roles`), or by a parse with a
word list (`role_matrix`, a DIAGNOSTIC).

`mention_roles` takes the relations, subjects and objects that model/relation_spans.py finds by the closed class
of spatial words and the text around them: no list of nouns, colours or shapes of any world.

The diagnostic parse:

A noun phrase is a run of words from a given vocabulary, a relation is a spatial head word ("left", "above", ...),
its subject is the noun phrase before it and its object the one after it; pronoun forms ("to its left", "above
it") take the caption's first noun phrase as their object, as a reader would resolve "it"; an absolute form ("on
the left") describes the noun phrase before it, relative to the first one after "between". The vocabulary is the
checkpoint's `role_vocabulary` (the sample world's attribute and shape words for every checkpoint that has roles),
so the parse does not read open-vocabulary captions, and it takes "a man left the room" for a relation: no
default recipe uses it. Nothing here knows the sample world; the checkpoint carries its word list.
"""
from __future__ import annotations

import re
from typing import Callable, Collection

import numpy as np

from edje.model.relation_spans import mention_pieces

MAX_RELATIONS = 2
NUM_ROLES = 3 * MAX_RELATIONS  # (relation, subject, object) for each relation of a caption
RELATION, SUBJECT, OBJECT = 0, 1, 2

# What each relation says of (subject - object) on the image grid (x to the right, y down): its dot product with
# this is negative when the relation holds ("S left of O": x_S < x_O).
ORDER = {"left_of": (1.0, 0.0), "right_of": (-1.0, 0.0), "above": (0.0, 1.0), "below": (0.0, -1.0)}

_HEADS = {"left", "right", "above", "over", "below", "beneath", "under", "top", "bottom"}
_ALWAYS_PREPOSITION = {"above", "over", "below", "beneath", "under"}


def _bare(word: str) -> str:
    """A caption word lower-cased, without punctuation ("(large)," -> "large")."""
    return re.sub(r"[^a-z]", "", word.lower())


def _noun_phrases(words: list[str], vocabulary: Collection[str]) -> list[tuple[int, int]]:
    """[start, end) word spans of maximal runs of vocabulary words."""
    spans, start = [], None
    for i, w in enumerate(words + [""]):
        if _bare(w) in vocabulary:
            start = i if start is None else start
        elif start is not None:
            spans.append((start, i))
            start = None
    return spans


def word_roles(caption: str, vocabulary: Collection[str]) -> list[set[int]]:
    """For each whitespace word of ``caption``, the role indices it holds (3 * k + role for the k-th relation);
    noun phrases are runs of ``vocabulary`` words."""
    words = caption.split()
    nps = _noun_phrases(words, vocabulary)
    roles: list[set[int]] = [set() for _ in words]
    k = 0
    for j, w in enumerate(words):
        if _bare(w) not in _HEADS or k >= MAX_RELATIONS:
            continue
        nxt = _bare(words[j + 1]) if j + 1 < len(words) else ""
        prev = _bare(words[j - 1]) if j > 0 else ""
        after_of = _bare(words[j + 2]) if nxt == "of" and j + 2 < len(words) else nxt
        pronoun = prev == "its" or after_of == "it"
        regular = not pronoun and (nxt == "of" or _bare(w) in _ALWAYS_PREPOSITION)
        before = [s for s in nps if s[1] <= j]
        after = [s for s in nps if s[0] > j]
        if regular:
            subject = before[-1] if before else None
            obj = after[0] if after else None
        elif pronoun:  # "to its left", "above it": "it" is the first noun phrase, the object
            obj = nps[0] if nps else None
            later = [s for s in before if s != obj]
            subject = later[-1] if later else (after[0] if after else None)
            for q in (j - 1, j + 1, j + 2):  # the pronoun itself stands for the object
                if 0 <= q < len(words) and _bare(words[q]) in ("it", "its"):
                    roles[q].add(3 * k + OBJECT)
        else:  # "on the left": of the noun phrase before it; of the first one too after "between"
            subject = before[-1] if before else (after[0] if after else None)
            between = any(_bare(x) == "between" for x in words[:j])
            obj = nps[0] if between and nps and nps[0] != subject else None
        roles[j].add(3 * k + RELATION)
        for span, role in ((subject, SUBJECT), (obj, OBJECT)):
            if span is not None:
                for q in range(*span):
                    roles[q].add(3 * k + role)
        k += 1
    return roles


def word_starts(caption: str, pieces_of: Callable[[str], int]) -> list[int]:
    """Index of each whitespace word's first wordpiece among the caption's wordpieces."""
    starts, at = [], 0
    for word in caption.split():
        starts.append(at)
        at += pieces_of(word)
    return starts


def role_matrix(caption: str, pieces_of: Callable[[str], int], vocabulary: Collection[str]) -> np.ndarray:
    """[wordpieces, NUM_ROLES] multi-hot roles of ``caption``'s wordpieces; ``pieces_of(word)`` counts a word's pieces."""
    rows = []
    for word, held in zip(caption.split(), word_roles(caption, vocabulary)):
        row = np.zeros(NUM_ROLES, np.float32)
        row[list(held)] = 1.0
        rows.extend([row] * pieces_of(word))
    return np.stack(rows) if rows else np.zeros((0, NUM_ROLES), np.float32)


def mention_roles(caption: str, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """([wordpieces, NUM_ROLES] multi-hot roles, [MAX_RELATIONS, 2] ORDER of each relation, 0 where there is none) of
    the caption's first MAX_RELATIONS relation mentions by the rule of English; `tokenizer` is a fast one."""
    roles = np.zeros((len(tokenizer(caption, add_special_tokens=False)["input_ids"]), NUM_ROLES), np.float32)
    order = np.zeros((MAX_RELATIONS, 2), np.float32)
    for k, m in enumerate(mention_pieces(caption, tokenizer)[:MAX_RELATIONS]):
        for part, role in (("phrase", RELATION), ("subject", SUBJECT), ("object", OBJECT)):
            if m[part] is not None:  # a layout ("A on the left, B on the right") names no relation words
                roles[m[part][0]:m[part][1], 3 * k + role] = 1.0
        if m["subject"] is not None and m["object"] is not None:
            order[k] = ORDER[m["relation"]]
    return roles, order
