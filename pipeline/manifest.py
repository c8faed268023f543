"""The job manifest and the shard ledger of an output folder, sized for 10,000s of shards.

    manifest.json        what this folder is: input, read options, model, plan digest, counts.
                         Written once, after the plan; never rewritten.
    plan/shards.parquet  one record per input shard (shard, rows, digest), written with it.
    stats/<shard>.json   a shard's commit record (pipeline.write), written once by its commit.
    runs/<start>.json    one record per run.

Committing a shard touches only its own files, so its cost does not grow with the shard count.
Resuming reads the manifest and the plan (two objects) and lists `stats/` once (S3 returns
1,000 keys a request), instead of probing one object per shard. A rerun whose input files
have the same fingerprint (paths, sizes, versions) reuses the plan without reading the list;
otherwise it re-plans and the plan digest must match.
"""
from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Set

import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import storage

MANIFEST_VERSION = 2


class ManifestMismatchError(ValueError):
    """The output folder holds a job for another input, shard size or model."""


@dataclass
class JobManifest:
    """Identity of an encode job's output folder."""

    input: List[str]
    kind: str
    table_metadata: Dict
    shard_size: int
    shards_per_file: int
    read_options: Dict
    fingerprint: str  # of the input files as listed; equal on a rerun -> the plan is reused unread
    rows_in: int
    rows_kept: int
    read_failed: Dict[str, int]
    read_examples: Dict[str, List[str]]
    num_shards: int
    plan_digest: str
    has_ids: bool
    encoder: Dict = field(default_factory=dict)
    world_port: Optional[int] = None  # loopback port the default sample world was served on
    version: int = MANIFEST_VERSION
    created_at: float = field(default_factory=time.time)

    def check_model(self, kind: str, table_metadata: Dict) -> None:
        """Raise ManifestMismatchError when the folder holds tables of another model or kind."""
        for name, now in (("version", MANIFEST_VERSION), ("kind", kind), ("table_metadata", table_metadata)):
            if getattr(self, name) != now:
                raise ManifestMismatchError(
                    f"the output folder holds a different job: {name} was {getattr(self, name)!r}, "
                    f"now {now!r}; use a new --output")

    def check_plan(self, other: "JobManifest", stored: pa.Table, planned: pa.Table) -> None:
        """Raise ManifestMismatchError naming what differs between the stored plan and a new one."""
        for name in ("shard_size", "rows_in", "read_failed", "num_shards", "plan_digest"):
            if getattr(self, name) != getattr(other, name):
                where = ""
                if name == "plan_digest":
                    a, b = stored.to_pylist(), planned.to_pylist()
                    first = next((x for x, y in zip(a, b) if x != y), None)
                    where = f" (input shard {first['shard']} differs first)" if first else ""
                raise ManifestMismatchError(
                    f"the output folder holds a different job: {name} was {getattr(self, name)!r}, "
                    f"now {getattr(other, name)!r}{where}; use a new --output")


def manifest_path(output: str) -> str:
    """Location of the manifest in an output folder."""
    return storage.join(output, "manifest.json")


def plan_path(output: str) -> str:
    """Location of the per-shard plan records."""
    return storage.join(output, "plan", "shards.parquet")


def load_manifest(output: str) -> Optional[JobManifest]:
    """The manifest of an output folder, or None for a fresh folder."""
    data = storage.read_json(manifest_path(output))
    if data is None:
        return None
    if data.get("version") != MANIFEST_VERSION:
        raise ManifestMismatchError(f"{manifest_path(output)} has manifest version {data.get('version')}, this "
                                    f"code writes {MANIFEST_VERSION}; use a new --output")
    return JobManifest(**data)


def save_manifest(output: str, manifest: JobManifest, shards: pa.Table) -> None:
    """Write the plan records, then the manifest (its existence commits the plan)."""
    buf = io.BytesIO()
    pq.write_table(shards, buf, compression="zstd")
    storage.atomic_write(plan_path(output), lambda tmp: _put(tmp, buf.getvalue()))
    storage.write_json(manifest_path(output), asdict(manifest))


def load_plan(output: str) -> pa.Table:
    """The plan records (shard, rows, digest) of an output folder."""
    fs, path = storage.url_to_fs(plan_path(output))
    with fs.open(path, "rb") as f:
        return pq.read_table(f)


def committed_shards(output: str) -> Set[int]:
    """Ids of committed shards: one listing of `stats/` (no per-shard request)."""
    fs, path = storage.url_to_fs(storage.join(output, "stats"))
    fs.invalidate_cache()
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:
        stem = name.rsplit("/", 1)[-1]
        if stem.endswith(".json") and stem[:-5].isdigit():
            out.add(int(stem[:-5]))
    return out


def save_run(output: str, run: Dict) -> None:
    """Record one run under `runs/` (a new object per run; the manifest is never rewritten)."""
    storage.write_json(storage.join(output, "runs", f"{run['started_at']:.3f}.json"), run)


def _put(url: str, data: bytes) -> None:
    fs, path = storage.url_to_fs(url)
    with fs.open(path, "wb") as f:
        f.write(data)
