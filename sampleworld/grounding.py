"""Which object each noun phrase of a shapes-world caption names, and where it is: the sample world's boxes.

A noun phrase is a run of attribute and shape words ("a large red circle", "red circle (large)"). Every
caption names each object with all three attributes, so a phrase names the one object whose size, colour
and shape it states; a phrase that fits no object or several is left out. The result is the caption's
grounding, what phrase-box annotations (Flickr30k Entities, Visual Genome) give on real data: for each word
of a grounded phrase, its index among the caption's whitespace words and its object's centre (x right,
y down, fractions of the image side).
"""
from __future__ import annotations

from .captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS
from .phrases import bare
from .scene import Scene

# word -> canonical value; "plus sign" is one shape whose two words both count
_VALUE_OF = {part: value for table in (SIZE_WORDS, COLOUR_WORDS, SHAPE_WORDS)
             for value, words in table.items() for w in words for part in w.split()}
NOUN_WORDS = frozenset(_VALUE_OF)


def noun_phrases(words: list[str]) -> list[tuple[int, int]]:
    """[start, end) word spans of maximal runs of noun-phrase words."""
    spans, start = [], None
    for i, w in enumerate(words + [""]):
        if bare(w) in NOUN_WORDS:
            start = i if start is None else start
        elif start is not None:
            spans.append((start, i))
            start = None
    return spans


def caption_grounding(caption: str, scene: Scene) -> list[list[float]]:
    """[[word index, centre x, centre y], ...] for every word of each noun phrase that names exactly one object."""
    words = caption.split()
    out: list[list[float]] = []
    for start, end in noun_phrases(words):
        values = {_VALUE_OF[bare(w)] for w in words[start:end]}
        named = [o for o in scene.objects if values <= {o.size, o.colour, o.shape}]
        if len(named) == 1:
            x, y = named[0].center
            out.extend([float(i), float(x), float(y)] for i in range(start, end))
    return out
