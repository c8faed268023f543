"""Paraphrased captions of a shapes-world scene, from templates and synonyms.

Every caption names every object with all three attributes, bound together as
"<size> <colour> <shape>" or "<colour> <shape> (<size>)", and states every relation, so a
caption determines the scene's meaning. Choices are driven by a pre-drawn vector of
uniforms per caption: the random stream consumed does not depend on the scene's content,
so all members of a family (same structure, same caption seed) get the same templates and
synonyms, i.e. captions with the same words (up to the relation word of a mirrored twin)
in a different binding.
"""

from __future__ import annotations

import numpy as np

from .phrases import PRONOUN_RELATION, RELATION_WORDS, SHORT_RELATION, SIDE
from .pickers import Picker
from .relations import INVERSE
from .scene import Scene, SceneObject

SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little"), "large": ("large", "big")}
COLOUR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red",),
    "green": ("green",),
    "blue": ("blue",),
    "yellow": ("yellow",),
    "purple": ("purple", "violet"),
    "orange": ("orange",),
    "white": ("white",),
    "black": ("black",),
}
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc"),
    "square": ("square",),
    "triangle": ("triangle",),
    "star": ("star",),
    "cross": ("cross", "plus sign"),
    "diamond": ("diamond", "rhombus"),
}
VERBS: tuple[str, ...] = ("is", "sits", "lies", "appears")
OPENERS: tuple[str, ...] = ("an image of", "a picture of", "a drawing of")

N_UNIFORMS = 32  # 16 for the lexicon, the rest for template slots


def article(phrase: str) -> str:
    """Prefix ``a``/``an``."""
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _lexicon(p: Picker) -> dict[str, str]:
    """One synonym per attribute value for this caption, picked in a fixed vocabulary order.

    Keying synonyms by value (not by object) keeps the bag of words of a caption identical
    under attribute swaps: a swapped-in "cross" is still called "plus sign"."""
    lex: dict[str, str] = {}
    for table in (SIZE_WORDS, COLOUR_WORDS, SHAPE_WORDS):
        for value, words in table.items():
            lex[value] = p.pick(words)
    return lex


class _Words:
    """The words for one object in one caption."""

    def __init__(self, obj: SceneObject, lex: dict[str, str]) -> None:
        self.size = lex[obj.size]
        self.colour = lex[obj.colour]
        self.shape = lex[obj.shape]

    @property
    def np(self) -> str:
        """Bare noun phrase: "large red circle"."""
        return f"{self.size} {self.colour} {self.shape}"

    @property
    def a(self) -> str:
        """With article: "a large red circle"."""
        return article(self.np)

    @property
    def paren(self) -> str:
        """Terse: "red circle (large)"."""
        return f"{self.colour} {self.shape} ({self.size})"


def _two(w: list[_Words], rel: str, t: int, p: Picker) -> str:
    x, y = w
    inv = INVERSE[rel]
    if t == 0:
        return f"{x.a} {p.pick(RELATION_WORDS[rel])} {y.a}"
    if t == 1:
        return f"{y.a} {p.pick(VERBS)} {p.pick(RELATION_WORDS[inv])} {x.a}"
    if t == 2:
        return f"there is {x.a} and, {PRONOUN_RELATION[inv]}, {y.a}"
    if t == 3:
        return f"{x.paren} {SHORT_RELATION[rel]} {y.np}"
    if t == 4:
        return f"{x.a} and {y.a}; the {x.shape} is {p.pick(RELATION_WORDS[rel])} the {y.shape}"
    if t == 5:
        return f"{p.pick(OPENERS)} {x.a} placed {p.pick(RELATION_WORDS[rel])} {y.a}"
    if t == 6:
        return f"the {y.np} is {p.pick(RELATION_WORDS[inv])} the {x.np}"
    if t == 7:
        return f"{x.np} {SHORT_RELATION[rel]} {y.np}"
    raise IndexError(t)


def _three(w: list[_Words], r1: str, r2: str, row: bool, t: int, p: Picker) -> str:
    # Object 1 is the anchor: "0 r1 1" and "2 r2 1".
    a, b, c = w
    if t == 0:
        return f"{a.a} {p.pick(RELATION_WORDS[r1])} {b.a}, and {c.a} {p.pick(RELATION_WORDS[r2])} the {b.shape}"
    if t == 1:
        return f"{b.a} with {a.a} {PRONOUN_RELATION[r1]} and {c.a} {PRONOUN_RELATION[r2]}"
    if t == 2:
        if row:
            return f"{b.a} between {a.a} {SIDE[r1]} and {c.a} {SIDE[r2]}"
        return f"{a.a} {p.pick(RELATION_WORDS[r1])} {b.a}, which is {p.pick(RELATION_WORDS[INVERSE[r2]])} {c.a}"
    if t == 3:
        return f"there is {b.a}; {a.a} is {p.pick(RELATION_WORDS[r1])} it and {c.a} is {p.pick(RELATION_WORDS[r2])} it"
    if t == 4:
        return f"{a.np} {SHORT_RELATION[r1]} {b.np}; {c.np} {SHORT_RELATION[r2]} {b.np}"
    if t == 5:
        return (
            f"{c.a} {p.pick(VERBS)} {p.pick(RELATION_WORDS[r2])} {b.a}, "
            f"while {a.a} is {p.pick(RELATION_WORDS[r1])} the {b.shape}"
        )
    raise IndexError(t)


def _one(w: _Words, t: int, p: Picker) -> str:
    if t == 0:
        return w.a
    if t == 1:
        return f"there is {w.a}"
    if t == 2:
        return w.paren
    if t == 3:
        return f"{p.pick(OPENERS)} {w.a}"
    raise IndexError(t)


N_TEMPLATES = {1: 4, 2: 8, 3: 6}


def make_captions(scene: Scene, n: int, seed: int) -> list[str]:
    """``n`` paraphrased captions of ``scene``; distinct templates until they run out."""
    rng = np.random.default_rng(seed)
    n_obj = len(scene.objects)
    order = rng.permutation(N_TEMPLATES[n_obj])
    rels = [r.predicate for r in scene.relations]
    out = []
    for i in range(n):
        p = Picker(rng.random(N_UNIFORMS))
        lex = _lexicon(p)
        words = [_Words(o, lex) for o in scene.objects]
        t = int(order[i % len(order)])
        if n_obj == 1:
            text = _one(words[0], t, p)
        elif n_obj == 2:
            text = _two(words, rels[0], t, p)
        else:
            text = _three(words, rels[0], rels[1], scene.is_row, t, p)
        out.append(text)
    return out


def shape_caption(scene: Scene, rng: np.random.Generator) -> str:
    """A training-only caption that names every shape of the scene and nothing else ("a star and a
    disc"): matching it needs shape, which full captions never require against random negatives."""
    names = [SHAPE_WORDS[o.shape][int(rng.integers(len(SHAPE_WORDS[o.shape])))] for o in scene.objects]
    return _listing([article(n) for n in (names[i] for i in rng.permutation(len(names)))])


def colour_caption(scene: Scene, rng: np.random.Generator) -> str:
    """A training-only caption that names every colour of the scene and nothing else ("something red
    and something blue"): it keeps colour in the embedding while shape captions teach shape."""
    colours = sorted({o.colour for o in scene.objects})
    names = [COLOUR_WORDS[c][int(rng.integers(len(COLOUR_WORDS[c])))] for c in colours]
    return _listing([f"something {n}" for n in (names[i] for i in rng.permutation(len(names)))])


def _listing(items: list[str]) -> str:
    """"x", "x and y", "x, y and z"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
