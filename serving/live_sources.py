"""The source bytes of live images (POST /v1/images), kept beside the live log so that they have a thumbnail.

A token table holds tokens, not pixels: without these bytes an image added from a base64 body (or from a
url that has since gone) could be searched but never shown. One file per image id under
`live_dir/sources/`, named by the sha256 of the id (ids may hold any character; file names may not),
written before the image's log line is committed, so that every replica that sees the image finds its bytes.
No torch, no model: the ingress reads them.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

SOURCES_DIR = "sources"


def content_hash(data: bytes) -> str:
    """sha256 hex of image bytes (cache key; default id of an added image)."""
    return hashlib.sha256(data).hexdigest()


def default_image_id(data: bytes) -> str:
    """The id an image added without one gets: 'live-' + the first 16 hex digits of its sha256."""
    return "live-" + content_hash(data)[:16]


def source_path(live_dir: str, image_id: str) -> str:
    """Where the source bytes of a live image are kept."""
    return os.path.join(os.path.abspath(live_dir), SOURCES_DIR, hashlib.sha256(image_id.encode()).hexdigest())


def keep_source(live_dir: str, image_id: str, data: bytes) -> str:
    """Write an added image's bytes (temp file + rename: a reader never sees half of them); returns the path."""
    path = source_path(live_dir, image_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def read_source(live_dir: Optional[str], image_id: str) -> Optional[bytes]:
    """The kept bytes of a live image, or None (no live dir, an image added before bytes were kept, not live)."""
    if not live_dir:
        return None
    try:
        with open(source_path(live_dir, image_id), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
