"""Exact duplicate urls and image ids over the whole url list, with memory bounded by a bucket.

Scope: the whole --input (every file), compared after trimming whitespace, byte for byte.
The first occurrence (lowest global row index) is kept. Urls are checked first; among the rows
that survive, an image id that a second url claims is a duplicate image id. Lists without an
image id column get ids from a hash of the url, so a unique url already means a unique id.

Method (hash-partitioned state): while the list streams past, every kept row's (row, url[,
image_id]) is appended to one of B spill files on local disk, chosen by a hash of its url, so
equal urls always meet in the same file. Afterwards each file is loaded alone, sorted by (url,
row) and compared with its neighbour; survivors are partitioned again by image id for the id
check. Memory holds one bucket (B is chosen from the row estimate so a bucket has ~bucket_rows
rows) plus 8 bytes per duplicate found. The hash only decides where a row is spilled, never
whether it is a duplicate, so the result does not depend on B or on the hash (Python's own
string hash, randomised per process, is fine).
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.reasons import DUPLICATE_IMAGE_ID, DUPLICATE_URL
from pipeline.validate import MAX_EXAMPLES, Drops

IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class BucketSpill:
    """B append-only Arrow IPC files; rows go to the file their key's hash picks."""

    def __init__(self, folder: str, buckets: int, key: str):
        self.folder, self.buckets, self.key = folder, max(1, buckets), key
        os.makedirs(folder, exist_ok=True)
        self.writers: Dict[int, pa.ipc.RecordBatchFileWriter] = {}
        self.sinks: Dict[int, pa.OSFile] = {}

    def path(self, bucket: int) -> str:
        """File of one bucket."""
        return os.path.join(self.folder, f"{bucket:05d}.arrow")

    def add(self, table: pa.Table) -> None:
        """Append a table's rows to their buckets."""
        if table.num_rows == 0:
            return
        h = np.fromiter(map(hash, table.column(self.key).to_pylist()), np.int64, table.num_rows)
        bucket = (h.view(np.uint64) % np.uint64(self.buckets)).astype(np.int64)
        order = np.argsort(bucket, kind="stable")
        table = table.take(pa.array(order))
        counts = np.bincount(bucket, minlength=self.buckets)
        start = 0
        for b in np.flatnonzero(counts):
            part = table.slice(start, int(counts[b]))
            start += int(counts[b])
            if b not in self.writers:
                self.sinks[b] = pa.OSFile(self.path(b), "wb")
                self.writers[b] = pa.ipc.new_file(self.sinks[b], table.schema, options=IPC_OPTIONS)
            self.writers[b].write_table(part)

    def close(self) -> List[str]:
        """Close every file; returns the bucket files that exist, in bucket order."""
        for b in list(self.writers):
            self.writers.pop(b).close()
            self.sinks.pop(b).close()
        return [self.path(b) for b in range(self.buckets) if os.path.exists(self.path(b))]


class DuplicateFinder:
    """Collects kept rows while the list streams, then finds duplicate urls and image ids exactly."""

    def __init__(self, scratch: str, buckets: int):
        self.scratch, self.buckets = scratch, buckets
        self.urls = BucketSpill(os.path.join(scratch, "by_url"), buckets, "url")

    def add(self, kept: pa.Table) -> None:
        """Spill a validated batch's (row, url[, image_id]) by url."""
        self.urls.add(kept.select([c for c in ("row", "url", "image_id") if c in kept.column_names]))

    def finish(self, drops: Drops) -> np.ndarray:
        """Sorted global row indices to drop; counts and examples go to `drops`."""
        ids: Optional[BucketSpill] = None
        dup_url = _Dups(DUPLICATE_URL, "url")
        for path in self.urls.close():
            table = _load(path)
            dup = dup_url.add(table)
            if "image_id" in table.column_names:
                ids = ids or BucketSpill(os.path.join(self.scratch, "by_id"), self.buckets, "image_id")
                ids.add(table.filter(pa.array(~dup)).select(["row", "image_id"]))
            os.remove(path)
        dup_id = _Dups(DUPLICATE_IMAGE_ID, "image_id")
        for path in (ids.close() if ids else []):
            dup_id.add(_load(path))
            os.remove(path)
        for d in (dup_url, dup_id):
            d.report(drops)
        rows = np.concatenate(dup_url.rows + dup_id.rows) if dup_url.rows or dup_id.rows else np.zeros(0, np.int64)
        return np.sort(rows)


class _Dups:
    """Duplicate rows of one key, found bucket by bucket, with the first examples in input order."""

    def __init__(self, reason: str, key: str):
        self.reason, self.key = reason, key
        self.rows: List[np.ndarray] = []
        self.examples = pa.table({"row": pa.array([], pa.int64()), "value": pa.array([], pa.string())})

    def add(self, table: pa.Table) -> np.ndarray:
        """Mark rows whose key equals that of an earlier row; returns the mask in the table's order."""
        order = pc.sort_indices(table, sort_keys=[(self.key, "ascending"), ("row", "ascending")])
        keys = table.column(self.key).take(order)
        dup_sorted = np.zeros(table.num_rows, dtype=bool)
        if table.num_rows > 1:
            same = pc.equal(keys.slice(1), keys.slice(0, table.num_rows - 1))
            dup_sorted[1:] = np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        mask = np.zeros(table.num_rows, dtype=bool)
        mask[order.to_numpy()] = dup_sorted
        if mask.any():
            found = table.filter(pa.array(mask))
            self.rows.append(found.column("row").to_numpy())
            ex = pa.table({"row": found.column("row"), "value": found.column(self.key)})
            self.examples = pa.concat_tables([self.examples, ex]).sort_by("row").slice(0, MAX_EXAMPLES)
        return mask

    def report(self, drops: Drops) -> None:
        """Add the count and the earliest examples to `drops`."""
        n = int(sum(len(r) for r in self.rows))
        drops.add(self.reason, n, [f"row {r}: {v[:80]!r}" for r, v in zip(self.examples.column("row").to_pylist(),
                                                                        self.examples.column("value").to_pylist())])


def _load(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def drop_rows(table: pa.Table, dups: np.ndarray) -> pa.Table:
    """A batch without the rows listed in the sorted array `dups`."""
    if len(dups) == 0 or table.num_rows == 0:
        return table
    rows = table.column("row").to_numpy()
    pos = np.searchsorted(dups, rows)
    hit = (pos < len(dups)) & (dups[np.minimum(pos, len(dups) - 1)] == rows)
    return table.filter(pa.array(~hit)) if hit.any() else table


def iter_spill(path: str) -> Iterable[pa.Table]:
    """Record batches of an Arrow IPC file, one at a time."""
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield pa.Table.from_batches([reader.get_batch(i)])
