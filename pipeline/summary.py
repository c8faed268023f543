"""summary.json: totals over every committed shard of an output folder plus this run's speed."""
from __future__ import annotations

import json
from collections import Counter
from typing import Dict, List, Set

from edje.pipeline import storage
from edje.pipeline.manifest import JobManifest
from edje.pipeline.write import stats_path


def read_stats(output: str, shard_ids: List[int]) -> Dict[int, Dict]:
    """Commit records of the given shards, fetched in one bulk call (concurrent on object stores)."""
    if not shard_ids:
        return {}
    fs, _ = storage.url_to_fs(output)
    paths = {storage.url_to_fs(stats_path(output, s))[1]: s for s in shard_ids}
    blobs = fs.cat(list(paths), on_error="omit")
    return {paths[p]: json.loads(b) for p, b in blobs.items() if p in paths}


def build_summary(output: str, manifest: JobManifest, run: Dict, committed: Set[int]) -> Dict:
    """Aggregate per-shard stats (committed shards only) with the url-list read failures."""
    failed: Counter = Counter(manifest.read_failed)
    examples: Dict[str, List[str]] = {k: list(v) for k, v in manifest.read_examples.items()}
    images_ok, table_bytes, tables = 0, 0, []
    all_stats = read_stats(output, sorted(committed))
    pending = [s for s in range(manifest.num_shards) if s not in all_stats]
    for sid in sorted(all_stats):
        stats = all_stats[sid]
        images_ok += stats["images_ok"]
        table_bytes += stats["table_bytes"]
        tables.append(stats["table"])
        failed.update(stats["failed"])
        for reason, ex in stats.get("failed_examples", {}).items():
            examples.setdefault(reason, [])
            examples[reason] += ex[: max(0, 5 - len(examples[reason]))]
    seconds = max(run["seconds"], 1e-9)
    meta = manifest.table_metadata
    from edje.schemas.token_table import TableMetadata

    return {
        "output": output,
        "kind": manifest.kind,
        "complete": not pending,
        "pending_shards": pending,
        "images_in": manifest.rows_in,
        "images_ok": images_ok,
        "images_failed": sum(failed.values()),
        "failed": dict(sorted(failed.items())),
        "failed_examples": examples,
        "bytes_per_image": TableMetadata(**meta).codec.bytes_per_image,
        "table_bytes_per_image": round(table_bytes / images_ok, 1) if images_ok else None,
        "images_per_second": round(run["images_encoded"] / seconds, 2),
        "run": run,
        "shards": manifest.num_shards,
        "tables": tables,
        "table_metadata": meta,
    }
