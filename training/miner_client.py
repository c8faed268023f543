"""Client of POST /v1/negatives for training: corpus-wide hard negatives, and ELIP-style batches of neighbours.

Pretraining calls `fetch_negatives(url, image_ids, captions, k)` with a batch's positives and gets,
per pair, k negative image ids (for the caption) and k negative captions (for the image), chosen
from the whole served corpus. `neighbour_batch` turns anchors plus their mined neighbours into the
image ids of a batch whose in-batch negatives are hard (global hard-sample mining, as ELIP does).
Connection errors and 5xx answers (a replica being replaced) are retried with back-off.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import List, Optional, Sequence

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


class MinerError(RuntimeError):
    """The miner refused the request (4xx) or stayed unavailable; the message is the server's."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"miner answered {status}: {message}")


@dataclass(frozen=True)
class MinedNegatives:
    """Per pair: k negative image ids, k negative captions and the images those captions belong to."""

    image_ids: List[List[str]]
    captions: List[List[str]]
    caption_image_ids: List[List[str]]


def session(retries: int = 5, backoff_s: float = 0.5) -> requests.Session:
    """A requests session that retries connection errors and 502/503/504 on POST too (mining is idempotent)."""
    s = requests.Session()
    # Names the asking process: the miner records it (Miner.recent), so one sees which worker asked what.
    s.headers["User-Agent"] = f"edje-miner-client/{socket.gethostname()}/{os.getpid()}"
    retry = Retry(total=retries, backoff_factor=backoff_s, status_forcelist=(502, 503, 504),
                  allowed_methods=None, raise_on_status=False)
    s.mount("http://", HTTPAdapter(max_retries=retry))
    s.mount("https://", HTTPAdapter(max_retries=retry))
    return s


def fetch_negatives(base_url: str, image_ids: Sequence[str], captions: Sequence[str], k: int = 4,
                    rescore: bool = False, pool: Optional[int] = None, auth_token: Optional[str] = None,
                    timeout_s: float = 60.0, http: Optional[requests.Session] = None) -> MinedNegatives:
    """POST the batch's (image id, caption) pairs to {base_url}/v1/negatives; k negatives per caption and per image."""
    if len(image_ids) != len(captions):
        raise ValueError(f"{len(image_ids)} image ids but {len(captions)} captions")
    body = {"pairs": [{"image_id": str(i), "caption": c} for i, c in zip(image_ids, captions)], "k": k, "rescore": rescore}
    if pool is not None:
        body["pool"] = pool
    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    http = http or session()
    r = http.post(base_url.rstrip("/") + "/v1/negatives", json=body, headers=headers, timeout=timeout_s)
    if r.status_code != 200:
        try:
            payload = r.json()
            message = payload.get("message") or payload.get("detail")
        except ValueError:
            message = r.text
        raise MinerError(r.status_code, str(message))
    rows = r.json()["negatives"]
    return MinedNegatives(
        image_ids=[[n["image_id"] for n in row["negative_images"]] for row in rows],
        captions=[[n["caption"] for n in row["negative_captions"]] for row in rows],
        caption_image_ids=[[n["image_id"] for n in row["negative_captions"]] for row in rows],
    )


def neighbour_batch(anchor_ids: Sequence[str], mined: MinedNegatives, batch_size: int) -> List[str]:
    """Image ids of a batch of neighbours: the anchors, then their mined negatives round-robin, unique, up to batch_size."""
    out = list(dict.fromkeys(anchor_ids))[:batch_size]
    seen = set(out)
    depth = max((len(r) for r in mined.image_ids), default=0)
    for j in range(depth):
        for row in mined.image_ids:
            if len(out) >= batch_size:
                return out
            if j < len(row) and row[j] not in seen:
                seen.add(row[j])
                out.append(row[j])
    return out
