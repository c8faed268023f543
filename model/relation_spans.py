"""Spatial relations a caption states, found by general rules of English: no list of nouns, colours or shapes.

Spatial words are a closed class of the language; the things they relate are the text around them. The rule:

- **Relation phrases** (binary): "to/on/at the left of", "to/on the left side of", "left of" (a bare "left" or
  "right" is a relation only before "of", so "a man left the room" states none), "above", "over", "on top of",
  "atop", "below", "under", "beneath", "underneath"; and pronoun forms, "to its left", "above it".
- **Subject**: the text before the phrase back to a boundary (punctuation, "and", "or", "but", "while",
  "which", "between", another spatial phrase, the start); "with" is one too for a pronoun form ("a pear with a
  crayon below it"). Nothing before it ("Above the table, a lamp"): the text after the object. A relative
  pronoun ("..., which is above Y"): the phrase before it. **Object**: the text after, up to the next boundary.
  Spans drop a leading "there is/are", article or "with" and a trailing copula ("is", "are").
- **Pronouns**: "it", "them", "its", "their" stand for the caption's first phrase (its topic, "there is a pear;
  a crayon is below it"); a definite "the dog" stands for the earlier phrase with the same last word.
- **Layouts**: "on the left", "at the top", "on top", "top left", "in the top row", "in the middle", "from left
  to right: A, B and C", "B between A on the left and C on the right" place phrases on a coarse grid; two phrases
  placed apart on one axis and level on the other (or with nothing said about it) are related on that axis.

Spans are character offsets into the caption; `mention_pieces` turns them into wordpiece ranges of a fast Hugging
Face tokenizer, so a model can pool a phrase's word embeddings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HORIZONTAL, VERTICAL = "horizontal", "vertical"
AXIS = {"left_of": HORIZONTAL, "right_of": HORIZONTAL, "above": VERTICAL, "below": VERTICAL}
INVERSE = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}
Span = Tuple[int, int]

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*|[^\sA-Za-z0-9]")
_PUNCT = frozenset(",;:.!?")
_SENTENCE = frozenset(";.!?")
_CONJUNCTIONS = frozenset({"and", "or", "but", "while", "whereas", "which", "who", "where"})
_RELATIVE = frozenset({"which", "who", "that"})
_PRONOUNS = frozenset({"it", "them", "him", "her"})
_POSSESSIVES = ("its", "their", "his", "her")
_ARTICLES = frozenset({"a", "an", "the", "this", "that", "these", "those"})
_NOT_THINGS = _PRONOUNS | _RELATIVE | frozenset(_POSSESSIVES)
_COPULAS = frozenset({"is", "are", "was", "were", "be", "been", "being", "am"})
# Grid values along an axis: 0 left / top, 1 middle, 2 right / bottom.
_SIDE = {"left": (HORIZONTAL, 0), "right": (HORIZONTAL, 2), "top": (VERTICAL, 0), "bottom": (VERTICAL, 2),
         "upper": (VERTICAL, 0), "lower": (VERTICAL, 2)}


def _lexicon() -> Dict[Tuple[str, ...], tuple]:
    """Every spatial phrase, as lower-case words, and what it states: ("rel", relation, pronoun word or None),
    ("place", ((axis, value), ...)), ("order", axis, reversed), ("middle",), ("between",) or ("near",)."""
    lex: Dict[Tuple[str, ...], tuple] = {}
    for side in ("left", "right"):
        rel = f"{side}_of"
        lex[(side, "of")] = ("rel", rel, None)
        for prep in ("to", "on", "at"):
            for tail in ((side,), (side, "side"), (f"{side}-hand", "side")):
                lex[(prep, "the", *tail, "of")] = ("rel", rel, None)
                lex[(prep, "the", *tail)] = ("place", (_SIDE[side],))
            for poss in _POSSESSIVES:
                lex[(prep, poss, side)] = lex[(prep, poss, side, "side")] = ("rel", rel, 1)
        lex[("in", "the", side, "column")] = ("place", (_SIDE[side],))
    for words, rel in ((("above",), "above"), (("over",), "above"), (("on", "top", "of"), "above"), (("atop",), "above"),
                       (("below",), "below"), (("under",), "below"), (("beneath",), "below"),
                       (("underneath",), "below")):
        lex[words] = ("rel", rel, None)
    for words, end in ((("on", "top"), "top"), (("at", "the", "top"), "top"), (("at", "the", "bottom"), "bottom"),
                       (("on", "the", "bottom"), "bottom"), (("in", "the", "top", "row"), "top"),
                       (("in", "the", "bottom", "row"), "bottom")):
        lex[words] = ("place", (_SIDE[end],))
    for v in ("top", "bottom", "upper", "lower"):
        for h in ("left", "right"):
            for pre in ((), ("the",), ("in", "the"), ("at", "the"), ("on", "the")):
                lex[(*pre, v, h)] = lex[(*pre, v, h, "corner")] = ("place", (_SIDE[v], _SIDE[h]))
    for a, b in (("left", "right"), ("top", "bottom")):
        lex[("from", a, "to", b)] = ("order", _SIDE[a][0], False)
        lex[("from", b, "to", a)] = ("order", _SIDE[a][0], True)
    for words in (("in", "the", "middle"), ("in", "the", "centre"), ("in", "the", "center")):
        lex[words] = ("middle",)
    lex[("between",)] = ("between",)
    for words in (("next", "to"), ("beside",), ("near",), ("close", "to")):
        lex[words] = ("near",)
    return lex


_LEXICON = _lexicon()
_LONGEST = max(len(k) for k in _LEXICON)


@dataclass(frozen=True)
class RelationMention:
    """``subject`` is ``relation`` ``object``: character spans of the two phrases (a pronoun's or a second
    mention's own antecedent), and of the spatial words that state it (None when a layout implies it)."""

    relation: str
    subject: Span
    object: Span
    phrase: Optional[Span] = None

    @property
    def axis(self) -> str:
        """"horizontal" or "vertical"."""
        return AXIS[self.relation]


@dataclass
class _Parse:
    """Tokens of one caption with the spatial phrases marked."""

    caption: str
    tokens: List[re.Match]
    lower: List[str]
    phrase_at: Dict[int, Tuple[int, tuple]] = field(default_factory=dict)  # token index -> (end index, meaning)
    in_phrase: List[bool] = field(default_factory=list)
    in_parens: List[bool] = field(default_factory=list)

    def hard(self, i: int, with_too: bool = False) -> bool:
        """Whether token ``i`` ends a phrase: punctuation, a conjunction, a spatial phrase (and "with")."""
        w = self.lower[i]
        if self.in_parens[i]:
            return False
        return (w in _PUNCT or w in _CONJUNCTIONS or self.in_phrase[i] or (with_too and w == "with"))

    def chunk_back(self, end: int, with_too: bool = False) -> Span:
        """Token range of the phrase that ends at token ``end`` (exclusive), back to a boundary."""
        start = end
        while start > 0 and not self.hard(start - 1, with_too):
            start -= 1
        return self.clean(start, end)

    def chunk_forward(self, start: int) -> Span:
        """Token range of the phrase that starts at token ``start``, up to a boundary."""
        while start < len(self.tokens) and self.lower[start] in _PUNCT and not self.in_parens[start]:
            start += 1
        end = start
        while end < len(self.tokens) and not self.hard(end):
            end += 1
        return self.clean(start, end)

    def clean(self, start: int, end: int) -> Span:
        """Without a leading "there is/are" or "with" and a trailing copula or relative pronoun ("a dog that is")."""
        while start < end and (self.lower[start] in ("with", "there") or
                               (self.lower[start] in _COPULAS and start > 0 and self.lower[start - 1] == "there")):
            start += 1
        while end > start and (self.lower[end - 1] in _COPULAS or self.lower[end - 1] in _RELATIVE):
            end -= 1
        return start, end

    def chars(self, span: Span, strip_article: bool = True) -> Span:
        """Character span of a token range, without a leading article."""
        start, end = span
        if strip_article and end - start > 1 and self.lower[start] in _ARTICLES:
            start += 1
        return self.tokens[start].start(), self.tokens[end - 1].end()

    def head(self, span: Span) -> str:
        """The phrase's last word outside parentheses."""
        words = [i for i in range(*span) if not self.in_parens[i] and self.lower[i] not in _PUNCT | {"(", ")"}]
        return self.lower[words[-1]] if words else ""


def _parse(caption: str) -> _Parse:
    tokens = list(_TOKEN.finditer(caption))
    p = _Parse(caption, tokens, [t.group().lower() for t in tokens])
    depth, parens = 0, []
    for w in p.lower:
        depth += w == "("
        parens.append(depth > 0 or w == ")")
        depth = max(0, depth - (w == ")"))
    p.in_parens, p.in_phrase = parens, [False] * len(tokens)
    i = 0
    while i < len(tokens):
        for n in range(min(_LONGEST, len(tokens) - i), 0, -1):
            words = tuple(p.lower[i:i + n])
            if words in _LEXICON and not any(parens[i:i + n]):
                p.phrase_at[i] = (i + n, _LEXICON[words])
                p.in_phrase[i:i + n] = [True] * n
                i += n
                break
        else:
            i += 1
    return p


class _Entities:
    """The caption's things: each phrase span maps to the span of its first mention."""

    def __init__(self, p: _Parse):
        self.p = p
        self.order: List[Span] = []
        self.labels: Dict[Span, Dict[str, int]] = {}
        self.wild: set = set()  # "in the middle": the reference on every axis
        self.on_axis: Dict[Span, set] = {}  # axes a thing has an explicit relation on
        self.topic: Optional[Span] = None
        start = 0
        for i in range(len(p.tokens) + 1):  # every phrase between boundaries names a thing, the first the topic
            if i == len(p.tokens) or p.hard(i, with_too=True):
                span = p.clean(start, i)
                if span[1] > span[0] and not (span[1] - span[0] == 1 and p.lower[span[0]] in _NOT_THINGS):
                    self.topic = self.topic or span
                    self.resolve(span)
                start = i + 1

    def resolve(self, span: Span) -> Span:
        """The first mention of what ``span`` names: a pronoun's topic, a definite phrase's earlier namesake."""
        p = self.p
        if span[1] - span[0] == 1 and p.lower[span[0]] in _NOT_THINGS and self.topic is not None:
            return self.add(self.topic)
        if p.lower[span[0]] == "the":
            head = p.head(span)
            for earlier in self.order:
                if earlier[0] < span[0] and p.head(earlier) == head:
                    return earlier
        return self.add(span)

    def add(self, span: Span) -> Span:
        if span not in self.order:
            self.order.append(span)
            self.order.sort()
        return span

    def place(self, span: Span, axis: str, value: int) -> None:
        self.labels.setdefault(span, {})[axis] = value


def _relative_antecedent(p: _Parse, i: int) -> Optional[Span]:
    """The phrase before the relative pronoun at token ``i`` ("B" in "A left of B, which is above C")."""
    j = i
    while j > 0 and p.lower[j - 1] in _PUNCT:
        j -= 1
    span = p.chunk_back(j)
    return span if span[1] > span[0] else None


def _binary(p: _Parse, ents: _Entities, i: int, end: int, rel: str, pronoun: Optional[int],
            out: list, placed: list) -> None:
    """A relation phrase at tokens [i, end): its subject and object, or a place when it has no object."""
    if pronoun is not None:
        obj = (i + pronoun, i + pronoun + 1)
    else:
        obj = p.chunk_forward(end)
        if obj[1] - obj[0] == 1 and p.lower[obj[0]] in _PRONOUNS:
            pass  # "above it": the pronoun is the object
        elif obj[1] == obj[0] or p.lower[end] in _PUNCT:  # "c and d underneath": where they are, not a relation
            placed.append((i, end, ("place", ((VERTICAL, 0 if rel == "above" else 2),))))
            return
    subj = p.chunk_back(i, with_too=pronoun is not None or (obj[1] - obj[0] == 1 and p.lower[obj[0]] in _PRONOUNS))
    if subj[1] == subj[0]:
        b = subj[0] - 1
        while b >= 0 and p.lower[b] in _COPULAS | _PUNCT:
            b -= 1
        if b >= 0 and p.lower[b] in _RELATIVE:
            subj = _relative_antecedent(p, b) or subj
        else:
            subj = p.chunk_forward(max(obj[1], end))  # "Above the table, a lamp"; "and, to its left, a saw"
    if subj[1] == subj[0] or obj[1] == obj[0]:
        return
    s, o = ents.resolve(subj), ents.resolve(obj)
    if s == o:  # "the circle is above the circle": two namesakes, keep each phrase as written
        s, o = ents.add(subj), ents.add(obj)
    for e in (s, o):
        ents.on_axis.setdefault(e, set()).add(AXIS[rel])
    out.append((s, rel, o, (i, end), obj))


def _holders(p: _Parse, ents: _Entities, i: int, end: int, pairs: Dict[Span, Tuple[Span, Span]]) -> List[Span]:
    """The things a place phrase at tokens [i, end) describes: the phrase before it (both sides of a relation
    that ends there; a list joined by "and"), else the phrase after it."""
    before = p.chunk_back(i)
    if before[1] > before[0]:
        if before in pairs:
            return list(pairs[before])
        found = [ents.resolve(before)]
        j = before[0]
        while j > 0 and p.lower[j - 1] == "and" and not p.in_phrase[j - 1]:
            prev = p.chunk_back(j - 1)
            if prev[1] == prev[0] or prev in pairs:
                break
            found.insert(0, ents.resolve(prev))
            j = prev[0]
        return found
    found, j = [], end
    while j < len(p.tokens) and not (p.lower[j] in _PUNCT and j > end) and not p.in_phrase[j]:
        span = p.chunk_forward(j)
        if span[1] == span[0]:
            break
        found.append(ents.resolve(span))
        j = span[1]
        if j < len(p.tokens) and p.lower[j] == "and":
            j += 1
    return found


def _sentence_things(p: _Parse, ents: _Entities, start: int, stop: int) -> List[Span]:
    """Each phrase between tokens ``start`` and ``stop``, resolved, in order."""
    found, j = [], start
    while j < stop:
        if p.hard(j, with_too=True):
            j += 1
            continue
        span = p.chunk_forward(j)
        if span[1] > span[0] and span[1] <= stop:
            found.append(ents.resolve(span))
        j = max(span[1], j + 1)
    return found


def relation_mentions(caption: str) -> List[RelationMention]:
    """Every spatial relation the caption states or lays out, in order: subject, relation and object spans."""
    p = _parse(caption)
    ents = _Entities(p)
    rels: list = []
    placed: list = []
    for i, (end, meaning) in sorted(p.phrase_at.items()):
        if meaning[0] == "rel":
            _binary(p, ents, i, end, meaning[1], meaning[2], rels, placed)
        elif meaning[0] != "near":
            placed.append((i, end, meaning))
    pairs = {raw: (s, o) for s, _, o, _, raw in rels}  # a place right after "A above C" holds both
    for i, end, meaning in placed:
        kind = meaning[0]
        if kind == "place":
            for thing in _holders(p, ents, i, end, pairs):
                for axis, value in meaning[1]:
                    ents.place(thing, axis, value)
        elif kind == "middle":
            for thing in _holders(p, ents, i, end, pairs):
                ents.wild.add(thing)
        elif kind == "between":
            anchor = p.chunk_back(i)
            if anchor[1] > anchor[0]:
                ents.wild.add(ents.resolve(anchor))
    for i, end, meaning in placed:  # orders last: they sort things the places have grouped into rows
        if meaning[0] == "order":
            _order(p, ents, i, end, meaning[1], meaning[2])
    _complement(ents, rels)
    return _mentions(p, ents, rels)


def _order(p: _Parse, ents: _Entities, i: int, end: int, axis: str, backwards: bool) -> None:
    """"from left to right: A, B and C" (the things after it), or "..., from left to right" (each row before it)."""
    stop = next((j for j in range(end, len(p.tokens)) if p.lower[j] in _SENTENCE), len(p.tokens))
    things = _sentence_things(p, ents, end, stop)
    if not things:
        start = max((j + 1 for j in range(i) if p.lower[j] in _SENTENCE), default=0)
        things = _sentence_things(p, ents, start, i)
    other = VERTICAL if axis == HORIZONTAL else HORIZONTAL
    groups: Dict[Optional[int], List[Span]] = {}
    for t in dict.fromkeys(things):
        groups.setdefault(ents.labels.get(t, {}).get(other), []).append(t)
    for group in groups.values():
        for k, t in enumerate(reversed(group) if backwards else group):
            ents.place(t, axis, k)


def _complement(ents: _Entities, rels: list) -> None:
    """Two things, one placed on an axis ("a saw next to a rose, the saw on the left"): the other is opposite."""
    if len(ents.order) != 2:
        return
    a, b = ents.order
    for axis in (HORIZONTAL, VERTICAL):
        la, lb = ents.labels.get(a, {}).get(axis), ents.labels.get(b, {}).get(axis)
        if (la is None) != (lb is None) and not any(AXIS[r] == axis for _, r, _, _, _ in rels):
            known, other = (a, b) if la is not None else (b, a)
            if ents.labels[known][axis] != 1:
                ents.place(other, axis, 2 - ents.labels[known][axis])


def _level(ents: _Entities, a: Span, b: Span, axis: str) -> bool:
    """Whether two things are level on ``axis``: placed alike, one is the middle, or nothing places either."""
    la, lb = ents.labels.get(a, {}).get(axis), ents.labels.get(b, {}).get(axis)
    if a in ents.wild or b in ents.wild:
        return True
    if la is not None or lb is not None:
        return la == lb
    return axis not in ents.on_axis.get(a, set()) | ents.on_axis.get(b, set())


def _mentions(p: _Parse, ents: _Entities, rels: list) -> List[RelationMention]:
    out, seen = [], set()
    for s, rel, o, phrase, _ in rels:
        seen |= {(s, rel, o), (o, INVERSE[rel], s)}
        out.append(RelationMention(rel, p.chars(s), p.chars(o), p.chars(phrase, strip_article=False)))
    things = [t for t in ents.order if t in ents.labels or t in ents.wild]
    for x, a in enumerate(things):
        for b in things[x + 1:]:
            for axis, before, after in ((HORIZONTAL, "left_of", "right_of"), (VERTICAL, "above", "below")):
                other = VERTICAL if axis == HORIZONTAL else HORIZONTAL
                va = 1 if a in ents.wild else ents.labels.get(a, {}).get(axis)
                vb = 1 if b in ents.wild else ents.labels.get(b, {}).get(axis)
                if va is None or vb is None or va == vb or not _level(ents, a, b, other):
                    continue
                rel = before if va < vb else after
                if (a, rel, b) not in seen:
                    seen |= {(a, rel, b), (b, INVERSE[rel], a)}
                    out.append(RelationMention(rel, p.chars(a), p.chars(b)))
    return out


def mention_pieces(caption: str, tokenizer, mentions: Optional[Sequence[RelationMention]] = None) -> List[dict]:
    """For each relation mention, the wordpiece ranges [start, end) of its subject, object and phrase among the
    caption's wordpieces (the tokenizer without special tokens: the pair layout puts them at 1 + index)."""
    enc = tokenizer(caption, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]

    def pieces(span: Optional[Span]) -> Optional[Span]:
        if span is None:
            return None
        hit = [k for k, (a, b) in enumerate(offsets) if b > a and a < span[1] and b > span[0]]
        return (hit[0], hit[-1] + 1) if hit else None
    found = relation_mentions(caption) if mentions is None else mentions
    return [{"relation": m.relation, "axis": m.axis, "subject": pieces(m.subject), "object": pieces(m.object),
             "phrase": pieces(m.phrase)} for m in found]
