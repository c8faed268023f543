"""Which text queries are written from a held-out caption template, so figures can be given over those alone.

An open world's test captions come partly from templates that no training or validation caption uses (world.json's
`caption_templates` and `held_out_captions`, sampleworld/open_captions.py): recall and within-family accuracy over
those queries measure wordings a model never read. Shapes worlds record no templates and have no such split.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from edje.schemas.annotations import Annotations


def caption_flags(ann: Annotations, records: Optional[Sequence[dict]]) -> Optional[np.ndarray]:
    """bool per annotation caption: written from a held-out template; None when the world records no templates
    (a shapes world, no world.json, or a caption its image's record does not hold). `records`: each annotation
    image's world.json record, in the annotation's image order."""
    if records is None or not any(r.get("caption_templates") for r in records):
        return None
    # By text, not position: an annotation file may hold an image's captions in another order, or only some.
    held = [dict(zip(r["captions"], r.get("held_out_captions", ()))) for r in records]
    flags = [held[i].get(c) for c, i in zip(ann.captions, ann.caption_image)]
    return None if any(f is None for f in flags) else np.array(flags, dtype=bool)


def select_queries(per_image: Sequence[np.ndarray], flags: Optional[np.ndarray], first: Optional[int],
                   held_out: int) -> Optional[np.ndarray]:
    """Sorted caption indices kept as text queries: each image's first `first` captions, then its first `held_out`
    held-out-template captions where those are not among them; None keeps every caption."""
    if not first:
        return None
    keep: List[int] = []
    for caps in per_image:
        chosen = [int(j) for j in caps[:first]]
        extra = [int(j) for j in caps if flags is not None and flags[j]][:held_out]
        keep += chosen + [j for j in extra if j not in chosen]
    return np.array(sorted(keep), dtype=np.int64)


def summary(flags: np.ndarray, added: int) -> Dict[str, int]:
    """How many text queries come from a held-out template, and how many of the queries were added for the split."""
    return {"queries": int(flags.size), "held_out_queries": int(flags.sum()), "added_queries": int(added)}
