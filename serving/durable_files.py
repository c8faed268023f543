"""Local files that survive a crash: fsync of a file or a folder, a whole file written atomically, and flock.

A rename or an unlink is durable only once its folder is fsync'd; a file written under a temp name, fsync'd, then
renamed is seen whole or not at all. The locks are ``flock`` on a file, so they are released when their holder
dies. pipeline/storage.py's ``atomic_write`` covers fsspec urls (object stores too) but never fsyncs: these are for
a local folder that must outlive a power cut (the live log).
"""
from __future__ import annotations

import fcntl
import os


def fsync_dir(path: str) -> None:
    """Make a rename or unlink in a folder durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """Make a file's bytes durable (a file another library wrote, before its rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write a whole file under its final name: temp file, fsync, rename, fsync the folder."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


class FileLock:
    """flock on a file: exclusive or shared, blocking or not (`acquired` says)."""

    def __init__(self, path: str, exclusive: bool = True, blocking: bool = True):
        self.path, self.mode = path, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        self.acquired = False

    def __enter__(self):
        self.f = open(self.path, "a")
        try:
            fcntl.flock(self.f.fileno(), self.mode)
            self.acquired = True
        except BlockingIOError:
            pass
        return self

    def __exit__(self, *exc):
        if self.acquired:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
        self.f.close()


class NoLock:
    """A stand-in for FileLock when the caller already holds it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
