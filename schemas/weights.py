"""Which backbone weights a file holds: a sha256 recorded beside the path, so a file replaced in place is caught.

Token tables and EDJE checkpoints name their backbone by a path. When a retrained backbone is written over the
shipped file, every table and checkpoint made from the old one would silently pair with the new weights (the
adapter reads tokens it never saw, query embeddings miss image embeddings). The digest turns that into an error.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Optional

from edje.schemas.shipped import REPO_ROOT, SHIPPED_BACKBONE_WEIGHTS


def find_weights(pretrained: Optional[str] = None, *, backbone: Optional[str] = None,
                 checkpoint: Optional[str] = None) -> Optional[str]:
    """Where backbone weights are: the one rule every job, the API and serving use.

    `pretrained` names a file (absolute; else relative to the `checkpoint` folder, the working directory or the
    repository, in that order) or, when no such file exists, an open_clip pretrained tag or a URL, returned as given.
    With no `pretrained`, `backbone`'s weights shipped in the repository (None when it ships none)."""
    if pretrained:
        if "://" in pretrained or os.path.isabs(pretrained):
            return pretrained
        bases = ([Path(checkpoint)] if checkpoint else []) + [Path.cwd(), REPO_ROOT]
        return next((str(b / pretrained) for b in bases if (b / pretrained).is_file()), pretrained)
    if backbone is None or backbone not in SHIPPED_BACKBONE_WEIGHTS:
        return None
    path = REPO_ROOT / SHIPPED_BACKBONE_WEIGHTS[backbone]
    if not path.is_file():
        raise FileNotFoundError(f"{backbone}: shipped weights {SHIPPED_BACKBONE_WEIGHTS[backbone]} are missing from {REPO_ROOT}")
    return str(path)


def weights_sha256(pretrained: Optional[str]) -> Optional[str]:
    """sha256 of the weights file `pretrained` names, or None for a tag, a URL or no weights."""
    path = find_weights(pretrained) if pretrained else None
    if path is None or not os.path.isfile(path):
        return None
    st = os.stat(path)
    return _digest(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_weights(pretrained: Optional[str], expected: Optional[str], what: str) -> None:
    """Refuse a weights file whose digest is not the recorded one (nothing recorded: nothing to check)."""
    if not expected:
        return
    got = weights_sha256(pretrained)
    if got is not None and got != expected:
        raise ValueError(f"{what}: backbone weights {pretrained!r} have sha256 {got[:16]}..., but {expected[:16]}... "
                         f"was recorded: the file was replaced (a retrained backbone?); re-encode the tables and "
                         f"use a checkpoint trained on these weights, or point at the original file")
