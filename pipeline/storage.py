"""fsspec helpers shared by the stages: path joining, atomic writes, JSON files, S3 endpoint config.

Atomic commit: on a local filesystem a file is written under a temporary name in the same
directory and renamed into place (rename is atomic). On object stores a PUT (or completed
multipart upload) is already all-or-nothing, so the final key is written directly.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Callable, Dict, Optional

import fsspec

S3_ENDPOINT_ENV = "FSSPEC_S3_ENDPOINT_URL"  # fsspec reads FSSPEC_<PROTOCOL>_<KWARG> into s3fs's kwargs


def url_to_fs(url: str):
    """(filesystem, path) for any fsspec url (local paths, s3://, http(s)://, memory://)."""
    return fsspec.core.url_to_fs(url)


def join(root: str, *parts: str) -> str:
    """Join url parts with '/' (fsspec urls are '/'-separated on every filesystem)."""
    out = root.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def is_local(fs) -> bool:
    """True for the local filesystem (where rename is atomic)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def absolute(url: str) -> str:
    """Local paths made absolute (Ray workers may run in another directory); urls unchanged."""
    return url if "://" in url else os.path.abspath(url)


def atomic_write(url: str, write: Callable[[str], Any]) -> Any:
    """Call write(target) so that `url` appears complete or not at all; returns write's result."""
    fs, path = url_to_fs(url)
    if not is_local(fs):
        return write(url)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        result = write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return result


def write_json(url: str, obj: Any) -> None:
    """Atomically write an object as indented JSON."""
    data = json.dumps(obj, indent=2, sort_keys=True).encode()

    def put(target: str) -> None:
        fs, path = url_to_fs(target)
        with fs.open(path, "wb") as f:
            f.write(data)

    atomic_write(url, put)


def read_json(url: str) -> Optional[Any]:
    """Parsed JSON at `url`, or None when the file does not exist.

    One GET (cat_file): no existence probe first, which on S3 is a HEAD plus, for a missing key,
    a listing (s3fs checks for a folder), and no cached listing that could be stale.
    """
    fs, path = url_to_fs(url)
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def exists(url: str) -> bool:
    """Whether a file exists (a fresh listing: object-store listings are cached by s3fs)."""
    fs, path = url_to_fs(url)
    fs.invalidate_cache()
    return fs.exists(path)


def remove(url: str, recursive: bool = False) -> None:
    """Delete a file or folder if it exists."""
    fs, path = url_to_fs(url)
    fs.invalidate_cache()
    if fs.exists(path):
        fs.rm(path, recursive=recursive)


def configure_s3_endpoint(endpoint: Optional[str]) -> Dict[str, str]:
    """Point every s3fs filesystem of this process at `endpoint`; returns env vars for Ray workers."""
    env = {}
    if endpoint:
        os.environ[S3_ENDPOINT_ENV] = endpoint
        fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = endpoint
    for key in (S3_ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env
