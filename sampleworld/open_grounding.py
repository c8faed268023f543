"""Which thing each noun phrase of an open-world caption names, and where it is (as `grounding.py` does for shapes).

A phrase is a name of one of the scene's things (its noun, a synonym, singular or plural; the longest match
wins, so "hot dog" is not "dog") with the attribute words right before it ("two small left-facing dogs").
Names are unique across the glyph table and nouns are distinct within a scene, so each phrase names exactly
one thing. Output as `caption_grounding`: [word index, centre x, centre y] for every word of every phrase.
"""
from __future__ import annotations

import re
from functools import lru_cache

from .open_captions import ATTRIBUTE_WORDS
from .open_glyphs import GlyphTable, load_glyphs
from .open_scene import OpenScene


@lru_cache(maxsize=1 << 16)  # a world's captions repeat a few thousand words hundreds of thousands of times
def _norm(word: str) -> str:
    """A caption word lower-cased, without punctuation other than inner hyphens ("(small," -> "small")."""
    return re.sub(r"[^a-z\-]", "", word.lower()).strip("-")


def open_caption_grounding(caption: str, scene: OpenScene, table: GlyphTable | None = None) -> list[list[float]]:
    """[[word index, centre x, centre y], ...] for every word of each phrase that names one of the scene's things."""
    table = table or load_glyphs()
    forms: dict[tuple[str, ...], int] = {}
    for k, o in enumerate(scene.objects):
        for pair in table.by_noun[o.noun].names:
            for name in pair:
                forms[tuple(name.split(" "))] = k
    longest = max(len(f) for f in forms)
    words = [_norm(w) for w in caption.split()]
    out: list[list[float]] = []
    i = 0
    while i < len(words):
        for n in range(min(longest, len(words) - i), 0, -1):
            k = forms.get(tuple(words[i:i + n]))
            if k is not None:
                start = i
                while start > 0 and words[start - 1] in ATTRIBUTE_WORDS:
                    start -= 1
                x, y = scene.objects[k].center
                out.extend([float(j), float(x), float(y)] for j in range(start, i + n))
                i += n
                break
        else:
            i += 1
    return out
