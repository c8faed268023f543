"""Models named by a local path or a Hugging Face Hub id, fetched as the user's environment allows.

A hub id is fetched with `huggingface_hub` (`snapshot_download`, `hf_hub_download`), which honours `HF_HUB_OFFLINE`,
`HF_HOME` / `HF_HUB_CACHE`, `HF_ENDPOINT` and `HF_TOKEN`: nothing here forces offline or online mode. Offline, a
repository already in the cache loads from it. A model that cannot be had fails with one line that names it and
says why (offline and not cached, the hub unreachable, not found, no access), never a network error from deep
inside a download.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Optional, Sequence, Tuple

# owner/name as the hub spells repository ids (and no path separator beyond the one slash)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
# The environment that decides where and whether the hub is reached; Ray workers get the driver's.
HUB_VARIABLES: Tuple[str, ...] = ("HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN",
                                  "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_DISABLE_XET",
                                  "TRANSFORMERS_OFFLINE")


def hub_env() -> Dict[str, str]:
    """The hub variables set in this process, for a Ray runtime env: workers then reach the hub (or stay offline,
    or read the cache) exactly as the driver does."""
    return {k: os.environ[k] for k in HUB_VARIABLES if k in os.environ}


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
    try:
        return hub_snapshot(name, revision, cache_folder=cache_folder)[0]
    except Exception as e:
        err = unavailable(f"checkpoint {name!r}", e, cache_folder, hint=f"download it where the hub is reachable "
                          f"(hf download {name}) or pass the checkpoint's folder")
        if err is None:
            raise
        raise err from e


def hub_snapshot(repo_id: str, revision: Optional[str] = None, allow_patterns: Optional[Sequence[str]] = None,
                 cache_folder: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """(local snapshot folder, commit sha) of a hub repository, downloaded or read from the cache."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns,
                               cache_dir=cache_folder)
    return folder, snapshot_commit(folder, revision)


def hub_file(repo_id: str, filename: str, revision: Optional[str] = None,
             cache_folder: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """(local path, commit sha) of one file of a hub repository, downloaded or read from the cache."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_folder)
    return path, snapshot_commit(os.path.dirname(path), revision)


def snapshot_commit(folder: str, revision: Optional[str] = None) -> Optional[str]:
    """The commit a hub cache path belongs to: its `snapshots/<sha>` folder (the cache's own layout), else the
    revision asked for when it is a commit sha, else None."""
    parts = os.path.normpath(folder).split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i - 1] == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", parts[i]):
            return parts[i]
    return revision if revision and re.fullmatch(r"[0-9a-f]{40}", revision) else None


def unavailable(what: str, error: BaseException, cache_folder: Optional[str] = None,
                hint: str = "") -> Optional[CheckpointNotFound]:
    """`error` as one line that names the model and says why it cannot be had (None: the error is not about
    reaching the hub or finding a file on it)."""
    why = _why(error, cache_folder)
    if why is None:
        return None
    return CheckpointNotFound(f"{what} cannot be loaded: {why}" + (f"; {hint}" if hint else ""))


def _why(error: BaseException, cache_folder: Optional[str]) -> Optional[str]:
    """Why a hub download failed, in words, from the first hub error in the exception's chain."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = cache_folder or constants.HF_HUB_CACHE
    for e in _chain(error):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(e, GatedRepoError) or (isinstance(e, HfHubHTTPError) and status in (401, 403)
                                             and not isinstance(e, RepositoryNotFoundError)):
            return (f"no access (HTTP {status}): the repository is gated or private; accept its terms on the hub "
                    f"and set HF_TOKEN (or run `hf auth login`)")
        if isinstance(e, RepositoryNotFoundError):
            if status == 401:
                return ("not found, or no access (HTTP 401): no such repository at " + constants.ENDPOINT +
                        ", or it is private or gated and HF_TOKEN is not set")
            return f"not found (HTTP {status or 404}): no such repository at {constants.ENDPOINT}"
        if isinstance(e, RevisionNotFoundError):
            return f"not found (HTTP {status or 404}): the repository has no such revision"
        if isinstance(e, RemoteEntryNotFoundError):
            return f"not found (HTTP {status or 404}): {_url(e)} is not in the repository"
        if isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.TransportError)):
            if constants.HF_HUB_OFFLINE:
                return f"HF_HUB_OFFLINE is set and the hub cache ({cache}) holds no copy of it"
            return (f"the hub ({constants.ENDPOINT}) could not be reached and the hub cache ({cache}) holds no copy "
                    f"of it")
        if isinstance(e, HfHubHTTPError):
            return f"the hub ({constants.ENDPOINT}) answered HTTP {status}"
    return None


def _chain(error: BaseException):
    """The exception, then its causes and contexts (libraries wrap hub errors in their own)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _url(error: BaseException) -> str:
    """The file a /resolve/<revision>/<file> request asked for."""
    url = str(getattr(getattr(getattr(error, "response", None), "request", None), "url", "/resolve/-/the file"))
    return url.rsplit("/resolve/", 1)[-1].split("/", 1)[-1]
