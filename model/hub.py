"""A checkpoint named by a local folder or a Hugging Face Hub repository id, as `from_pretrained` takes it.

A hub id is fetched with `huggingface_hub.snapshot_download`, which honours `HF_HUB_OFFLINE`, `HF_HOME` /
`HF_HUB_CACHE` and a given cache folder: offline, a repository already in the cache loads from it, and one that is
not fails with a message that says so (never a network error from deep inside a download).
"""
from __future__ import annotations

import os
import re
from typing import Optional

# owner/name as the hub spells repository ids (and no path separator beyond the one slash)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")


class CheckpointNotFound(OSError):
    """Neither a local checkpoint folder nor a hub repository that can be had here."""


def is_repo_id(name: str) -> bool:
    """Whether `name` reads as a hub repository id (owner/name) rather than a path."""
    return bool(_REPO_ID.match(name)) and not name.startswith((".", "/")) and ".." not in name


def checkpoint_folder(name_or_path: str | os.PathLike, revision: Optional[str] = None,
                      cache_folder: Optional[str] = None) -> str:
    """The local folder of a checkpoint: the path itself, or the snapshot of a hub repository (downloaded, or read
    from the cache when offline)."""
    name = os.fspath(name_or_path)
    if os.path.isdir(name) or "://" in name:  # a folder, or an fsspec URL that the loaders read themselves
        return name
    if os.path.exists(name) or not is_repo_id(name):
        raise CheckpointNotFound(f"{name!r} is not a checkpoint folder (nor an owner/name hub repository id)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id=name, revision=revision, cache_dir=cache_folder)
    except LocalEntryNotFoundError as e:
        from huggingface_hub import constants

        where = cache_folder or constants.HF_HUB_CACHE
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise CheckpointNotFound(f"{name!r} is not a local folder, {why}, and the hub cache ({where}) holds no copy "
                                 f"of it: download it where the hub is reachable (huggingface-cli download {name}) "
                                 f"or pass the checkpoint's folder") from e
    except HfHubHTTPError as e:
        raise CheckpointNotFound(f"{name!r}: the hub refused it ({e}); is the id right, and is a token needed?") from e
