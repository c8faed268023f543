"""The one-table-per-image layout the live log replaced, folded into the log the first time a folder is opened.

That layout kept a text ``LOG`` naming one Parquet table per image under ``tables/``. The move renames it
``LOG.v1`` (``LOG`` is the live log's name from then on), appends the rows the log lacks, then drops ``LOG.v1``
and the tables. It is idempotent: a process that dies at any step leaves a folder the next open finishes, never
a row counted twice. The caller (serving/live_log.py) holds the live log's exclusive lock.
"""
from __future__ import annotations

import logging
import os

from edje.schemas.token_table import read_token_tables
from edje.serving.durable_files import fsync_dir
from edje.serving.live_crash import crash_point
from edje.serving.live_record import MAGIC, first_of_each_id

log = logging.getLogger("ray.serve")

LEGACY_LOG, LEGACY_TABLES = "LOG.v1", "tables"  # the one-table-per-image layout this log replaces


def _text_log(log_path: str) -> bool:
    """Whether LOG is the one-table-per-image layout's text file (False when there is no LOG)."""
    try:
        with open(log_path, "rb") as f:
            return f.read(len(MAGIC)) != MAGIC
    except FileNotFoundError:
        return False


def legacy_pending(live_dir: str, log_path: str) -> bool:
    """A text LOG of the one-table-per-image layout, or a move into the log that has not finished."""
    return os.path.exists(os.path.join(live_dir, LEGACY_LOG)) or _text_log(log_path)


def migrate_legacy(live) -> None:
    """Append the legacy tables' rows a LiveLog's folder lacks, then drop LOG.v1 and the tables (idempotent);
    call under `live.locked()`."""
    legacy = os.path.join(live.dir, LEGACY_LOG)
    if _text_log(live.path):
        try:
            os.replace(live.path, legacy)  # LOG is the new log's name from here on
            fsync_dir(live.dir)
        except FileNotFoundError:
            pass
    if not os.path.exists(legacy):
        return
    with open(legacy) as f:
        names = [line.split("\t")[0] for line in f.read().split("\n") if line]
    tables = os.path.join(live.dir, LEGACY_TABLES)
    paths = [os.path.join(tables, n) for n in names]
    if paths:
        # A second reader of the same folder, built without recovery (this one is recovering it).
        writer = type(live)(live.dir, live.config, live.expected, recover=False)
        have = writer.poll_locked()
        known = set(have.column("image_id").to_pylist()) if have is not None else set()
        table, _ = read_token_tables(paths)
        table, _, _ = first_of_each_id(table, [0] * table.num_rows, [0] * table.num_rows, known)
        for i in range(0, table.num_rows, 1000):
            writer.append(table.slice(i, 1000))
        log.warning("live log %s: %d images of the one-table-per-image layout moved into the log",
                    live.dir, table.num_rows)
    crash_point("legacy_appended")
    os.unlink(legacy)
    fsync_dir(live.dir)
    for p in paths + ([os.path.join(tables, n) for n in os.listdir(tables)] if os.path.isdir(tables) else []):
        if os.path.exists(p) and (p in paths or p.endswith(".tmp")):
            os.unlink(p)
    if os.path.isdir(tables) and not os.listdir(tables):
        os.rmdir(tables)
