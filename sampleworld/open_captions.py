"""Paraphrased captions of open scenes, from templates, synonyms and a held-out set of test-only templates.

Every caption names every thing with all its attributes (count, size, facing when its glyph faces a way, noun
or a synonym: "two small left-facing dogs") and states every relation, so a caption determines the scene's
meaning. As in `captions.py`, choices come from a pre-drawn vector of uniforms per caption and the family's
caption seed, so all members of a family get the same templates and synonym slots: a twin's captions use the
base's words in a different binding, or differ in the one word its change names. Templates whose id starts
with "h" are held out: only test splits use them, so part of the test phrasing is unseen in training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .open_glyphs import GlyphTable
from .open_scene import COUNT_WORDS, OpenScene, Thing
from .phrases import RELATION_WORDS, SHORT_RELATION, SIDE
from .pickers import Picker
from .relations import INVERSE

SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little"), "large": ("large", "big")}
FACING_WORDS: dict[str, str] = {"left": "left-facing", "right": "right-facing"}
VERBS: tuple[tuple[str, str], ...] = (("is", "are"), ("sits", "sit"), ("stands", "stand"), ("appears", "appear"))
OPENERS: tuple[str, ...] = ("an image of", "a picture of", "a photo of")
# Every word the templates themselves use for attributes (grounding extends a noun's phrase over these).
ATTRIBUTE_WORDS = frozenset({w for ws in SIZE_WORDS.values() for w in ws} | set(FACING_WORDS.values())
                            | {COUNT_WORDS[2], COUNT_WORDS[3]})

N_UNIFORMS = 24
_PHI = 0.6180339887498949  # spreads synonym choices of different nouns within one caption


@dataclass(frozen=True)
class Caption:
    """One caption and the template it came from."""

    text: str
    template: str  # e.g. "2/t3", "4/h0"

    @property
    def held_out(self) -> bool:
        """Whether its template is a test-only one."""
        return self.template.split("/")[1].startswith("h")


class _W:
    """The words for one thing in one caption."""

    def __init__(self, thing: Thing, size_word: str, names: tuple[str, str]) -> None:
        self.plural = thing.count > 1
        self.noun = names[1] if self.plural else names[0]
        self.count = COUNT_WORDS[thing.count] if self.plural else ""
        self.size = size_word
        self.face = FACING_WORDS.get(thing.facing, "")
        self.facing = thing.facing

    @property
    def np(self) -> str:
        """Bare phrase: "small left-facing dog", "two large cars"."""
        return " ".join(w for w in (self.count, self.size, self.face, self.noun) if w)

    @property
    def a(self) -> str:
        """With its determiner: "a small dog", "two large cars"."""
        return self.np if self.plural else "a " + self.np  # every phrase starts with a size or count word

    @property
    def the(self) -> str:
        """Definite: "the small dog", "the two large cars"."""
        return "the " + self.np

    @property
    def ref(self) -> str:
        """Short second mention: "the dog", "the cars"."""
        return "the " + self.noun

    @property
    def terse(self) -> str:
        """Noun first: "dog (small, facing left)", "cars (two, large)"."""
        attrs = [self.count, self.size] + ([f"facing {self.facing}"] if self.facing else [])
        return f"{self.noun} ({', '.join(a for a in attrs if a)})"

    @property
    def be(self) -> str:
        return "are" if self.plural else "is"

    @property
    def it(self) -> str:
        return "them" if self.plural else "it"

    def verb(self, p: Picker) -> str:
        return p.pick(VERBS)[int(self.plural)]


def _pron(rel: str, w: _W) -> str:
    """``rel`` of the thing ``w`` names, as a pronoun phrase: "to its left", "above them"."""
    its = "their" if w.plural else "its"
    return {"left_of": f"to {its} left", "right_of": f"to {its} right", "above": f"above {w.it}",
            "below": f"below {w.it}"}[rel]


def _one(w: list[_W], rels: list[str], row: bool, t: str, p: Picker) -> str:
    (x,) = w
    return {
        "t0": lambda: x.a,
        "t1": lambda: f"there {x.be} {x.a}",
        "t2": lambda: f"{p.pick(OPENERS)} {x.a}",
        "t3": lambda: f"{x.a}, alone in the picture",
        "h0": lambda: x.terse,
        "h1": lambda: f"the picture shows just {x.a}",
    }[t]()


def _two(w: list[_W], rels: list[str], row: bool, t: str, p: Picker) -> str:
    x, y = w
    rel = rels[0]
    inv = INVERSE[rel]

    def next_to() -> str:
        if rel in ("left_of", "right_of"):
            return f"{x.a} next to {y.a}, {x.ref} on the {'left' if rel == 'left_of' else 'right'}"
        return f"{x.a} and {y.a}, {x.ref} {SIDE[rel]}"
    return {
        "t0": lambda: f"{x.a} {p.pick(RELATION_WORDS[rel])} {y.a}",
        "t1": lambda: f"{y.a} {y.verb(p)} {p.pick(RELATION_WORDS[inv])} {x.a}",
        "t2": lambda: f"there {x.be} {x.a} and, {_pron(inv, x)}, {y.a}",
        "t3": lambda: f"{p.pick(OPENERS)} {x.a} {p.pick(RELATION_WORDS[rel])} {y.a}",
        "t4": next_to,
        "t5": lambda: f"{y.the} {y.be} {p.pick(RELATION_WORDS[inv])} {x.the}",
        "h0": lambda: f"{y.a} with {x.a} {_pron(rel, y)}",
        "h1": lambda: f"{x.terse} {SHORT_RELATION[rel]} {y.terse}",
        "h2": lambda: f"{x.a} and {y.a}, with {y.ref} {p.pick(RELATION_WORDS[inv])} {x.ref}",
    }[t]()


def _three(w: list[_W], rels: list[str], row: bool, t: str, p: Picker) -> str:
    # Thing 1 is the anchor: "0 r1 1" and "2 r2 1".
    x, y, z = w
    r1, r2 = rels

    def t0() -> str:
        if row:
            return f"{y.a} between {x.a} {SIDE[r1]} and {z.a} {SIDE[r2]}"
        return f"{x.a} {p.pick(RELATION_WORDS[r1])} {y.a}, which {y.be} {p.pick(RELATION_WORDS[INVERSE[r2]])} {z.a}"

    def t3() -> str:
        if row:  # in reading order along the row
            first, last = (x, z) if r1 in ("left_of", "above") else (z, x)
            ends = ("left", "right") if r1 in ("left_of", "right_of") else ("top", "bottom")
            return f"from {ends[0]} to {ends[1]}: {first.a}, {y.a} and {last.a}"
        return f"{y.a} in the middle, {x.a} {SIDE[r1]} and {z.a} {SIDE[r2]}"
    return {
        "t0": t0,
        "t1": lambda: f"{x.a} {p.pick(RELATION_WORDS[r1])} {y.a}, and {z.a} {p.pick(RELATION_WORDS[r2])} {y.ref}",
        "t2": lambda: f"{y.a} with {x.a} {_pron(r1, y)} and {z.a} {_pron(r2, y)}",
        "t3": t3,
        "t4": lambda: (f"there {y.be} {y.a}; {x.a} {x.be} {p.pick(RELATION_WORDS[r1])} {y.it} and "
                       f"{z.a} {z.be} {p.pick(RELATION_WORDS[r2])} {y.it}"),
        "h0": lambda: f"{x.terse} {SHORT_RELATION[r1]} {y.terse}; {z.terse} {SHORT_RELATION[r2]} {y.terse}",
        "h1": lambda: f"{z.a} {z.verb(p)} {p.pick(RELATION_WORDS[r2])} {y.a}, while {x.a} {x.be} {p.pick(RELATION_WORDS[r1])} {y.ref}",
    }[t]()


def _four(w: list[_W], rels: list[str], row: bool, t: str, p: Picker) -> str:
    # Corners: 0 top left, 1 top right, 2 bottom left, 3 bottom right.
    a, b, c, d = w
    return {
        "t0": lambda: f"top left {a.a}, top right {b.a}, bottom left {c.a}, bottom right {d.a}",
        "t1": lambda: (f"{a.a} {p.pick(RELATION_WORDS['left_of'])} {b.a}, and {c.a} {p.pick(RELATION_WORDS['left_of'])} "
                       f"{d.a}; {a.ref} {a.be} {p.pick(RELATION_WORDS['above'])} {c.ref}"),
        "t2": lambda: f"{a.a} above {c.a} on the left, and {b.a} above {d.a} on the right",
        "t3": lambda: f"in the top row {a.a} and {b.a}, in the bottom row {c.a} and {d.a}, from left to right",
        "h0": lambda: f"{c.a} below {a.a}, {d.a} below {b.a}, with {a.ref} left of {b.ref}",
        "h1": lambda: f"{a.a} and {b.a} on top, {c.a} and {d.a} underneath, each pair from left to right",
    }[t]()


_BUILDERS: dict[int, Callable[[list[_W], list[str], bool, str, Picker], str]] = {1: _one, 2: _two, 3: _three, 4: _four}
TEMPLATES: dict[int, tuple[str, ...]] = {
    1: ("t0", "t1", "t2", "t3", "h0", "h1"),
    2: ("t0", "t1", "t2", "t3", "t4", "t5", "h0", "h1", "h2"),
    3: ("t0", "t1", "t2", "t3", "t4", "h0", "h1"),
    4: ("t0", "t1", "t2", "t3", "h0", "h1"),
}


def template_ids(held_out: bool) -> list[str]:
    """Every template id ("<things>/<template>"), the training ones or the held-out (test-only) ones."""
    return [f"{n}/{t}" for n, ts in TEMPLATES.items() for t in ts if t.startswith("h") == held_out]


def _names(table: GlyphTable, noun: str, u: float) -> tuple[str, str]:
    """The (singular, plural) name of ``noun`` this caption uses: noun or a synonym, fixed per (caption, noun)."""
    g = table.by_noun[noun]
    return g.names[int(((u + _PHI * g.index) % 1.0) * len(g.names))]


def make_open_captions(scene: OpenScene, n: int, seed: int, table: GlyphTable, with_held_out: bool = False) -> list[Caption]:
    """``n`` paraphrased captions; distinct templates until they run out. ``with_held_out`` (test splits) adds the
    held-out templates to the training ones."""
    rng = np.random.default_rng(seed)
    n_obj = len(scene.objects)
    pool = [t for t in TEMPLATES[n_obj] if with_held_out or not t.startswith("h")]
    order = rng.permutation(len(pool))
    rels = [r.predicate for r in scene.relations]
    out = []
    for i in range(n):
        p = Picker(rng.random(N_UNIFORMS))
        size_words = {v: p.pick(ws) for v, ws in SIZE_WORDS.items()}  # keyed by value, as in captions.py
        u_names = p.uniform()
        words = [_W(o.thing, size_words[o.size], _names(table, o.noun, u_names)) for o in scene.objects]
        t = pool[int(order[i % len(order)])]
        out.append(Caption(_BUILDERS[n_obj](words, rels, scene.is_row, t, p), f"{n_obj}/{t}"))
    return out
