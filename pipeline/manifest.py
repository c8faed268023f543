"""The job manifest: what this output folder is (model, table metadata, input shards) and its runs.

Written once by the first run into `<output>/manifest.json`. A rerun re-reads the url list,
re-plans the shards and checks the plan and the model against the manifest: an output folder
only ever holds tables of one input and one model, so skipping committed shards is safe.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from pipeline import storage

MANIFEST_VERSION = 1


class ManifestMismatchError(ValueError):
    """The output folder holds a job for another input, shard size or model."""


@dataclass
class JobManifest:
    """Identity of an encode job's output folder."""

    input: str
    kind: str
    table_metadata: Dict
    shard_size: int
    rows_in: int
    read_failed: Dict[str, int]
    read_examples: Dict[str, List[str]]
    shards: List[Dict]  # [{shard, rows, digest}]
    encoder: Dict = field(default_factory=dict)
    world_port: Optional[int] = None  # loopback port the default sample world was served on
    runs: List[Dict] = field(default_factory=list)
    version: int = MANIFEST_VERSION
    created_at: float = field(default_factory=time.time)

    def check_same_job(self, other: "JobManifest") -> None:
        """Raise ManifestMismatchError naming what differs between two plans of the same folder."""
        for name in ("version", "kind", "table_metadata", "shard_size", "rows_in", "read_failed"):
            if getattr(self, name) != getattr(other, name):
                raise ManifestMismatchError(
                    f"the output folder holds a different job: {name} was {getattr(self, name)!r}, "
                    f"now {getattr(other, name)!r}; use a new --output")
        if len(self.shards) != len(other.shards):
            raise ManifestMismatchError(f"the output folder holds a different job: {len(self.shards)} input "
                                        f"shards before, {len(other.shards)} now; use a new --output")
        for a, b in zip(self.shards, other.shards):
            if a != b:
                raise ManifestMismatchError(f"the output folder holds a different job: input shard "
                                            f"{a['shard']} was {a}, now {b}; use a new --output")


def manifest_path(output: str) -> str:
    """Location of the manifest in an output folder."""
    return storage.join(output, "manifest.json")


def load_manifest(output: str) -> Optional[JobManifest]:
    """The manifest of an output folder, or None for a fresh folder."""
    data = storage.read_json(manifest_path(output))
    return JobManifest(**data) if data is not None else None


def save_manifest(output: str, manifest: JobManifest) -> None:
    """Write the manifest atomically."""
    storage.write_json(manifest_path(output), asdict(manifest))
