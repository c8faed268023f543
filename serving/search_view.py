"""What /v1/search adds for a person looking at its results: the first-stage order and the caption's own image.

Both are optional fields of SearchResponse (absent unless asked for or known), so older clients see the
response they always did.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Dict, List, Optional, Sequence, Tuple

from edje.schemas.api import FirstStageHit

log = logging.getLogger("ray.serve")

# The caption lookup only decorates a search: a busy miner (training asks it for negatives) must not hold it up.
CAPTION_LOOKUP_TIMEOUT_S = 2.0


def first_stage_ranks(hits: Sequence[Tuple[str, float]]) -> Dict[str, int]:
    """1-based first-stage rank of each candidate id."""
    return {image_id: n for n, (image_id, _) in enumerate(hits, 1)}


def first_stage_list(hits: Sequence[Tuple[str, float]], urls: Sequence[Optional[str]]) -> List[FirstStageHit]:
    """The candidates in first-stage order, with their cosine and url."""
    return [FirstStageHit(image_id=i, first_stage_score=c, url=u) for (i, c), u in zip(hits, urls)]


async def caption_image(miner, query: Optional[str]) -> Optional[str]:
    """The image id whose caption the query is (from the miner's caption sources), or None: no miner, no text,
    an unknown or shared caption, or a miner that did not answer in time (never an error)."""
    if miner is None or query is None:
        return None
    try:
        return await asyncio.wait_for(miner.image_of_caption.remote(query), CAPTION_LOOKUP_TIMEOUT_S)
    except Exception as e:
        log.info("caption lookup skipped: %s: %s", type(e).__name__, e)
        return None
