"""Which backbone weights a file holds: a sha256 recorded beside the path, so a file replaced in place is caught.

Token tables and EDJE checkpoints name their backbone by a path. When a retrained backbone is written over the
shipped file, every table and checkpoint made from the old one would silently pair with the new weights (the
adapter reads tokens it never saw, query embeddings miss image embeddings). The digest turns that into an error.
"""
from __future__ import annotations

import functools
import hashlib
import os
from typing import Optional


def local_weights(pretrained: Optional[str]) -> Optional[str]:
    """The local file `pretrained` names (as given, else relative to the repository), or None for a tag or URL."""
    if not pretrained or "://" in pretrained:
        return None
    if os.path.isfile(pretrained):
        return pretrained
    from edje.schemas.shipped import REPO_ROOT

    repo_relative = REPO_ROOT / pretrained
    return str(repo_relative) if repo_relative.is_file() else None


def weights_sha256(pretrained: Optional[str]) -> Optional[str]:
    """sha256 of the weights file `pretrained` names, or None for a tag, a URL or no weights."""
    path = local_weights(pretrained)
    if path is None:
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
