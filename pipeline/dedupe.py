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
whether it is a duplicate, so the result does not depend on B or on the hash. It is
`string_hash`, computed with numpy over the Arrow buffers (no Python object per row).
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from edje.pipeline.reasons import DUPLICATE_IMAGE_ID, DUPLICATE_URL
from edje.pipeline.validate import MAX_EXAMPLES, Drops

IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
HASH = "_hash"  # column of a bucket file: string_hash of its key, so the bucket is sorted by integers

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_P = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the polynomial over 8-byte words


def string_hash(values) -> np.ndarray:
    """A 64-bit hash of each value of a string or binary array (uint64), vectorised with numpy.

    Each value is read as little-endian 8-byte words (the last one masked to the value's bytes),
    combined as a polynomial mod 2**64 (Horner, all rows at once, longest values first), mixed
    with the length and finished with splitmix64's finaliser. It depends only on a value's bytes
    (not on its position, the batch or the process) and costs a few numpy passes over the words,
    about 1/3 of Python's hash on the same strings once the str objects are counted.
    """
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = pc.cast(arr, pa.string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    width = 8 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else 4
    _, off_buf, data = arr.buffers()
    offsets = np.frombuffer(off_buf, f"<i{width}", n + 1, arr.offset * width).astype(np.int64)
    start, length = offsets[:-1], np.diff(offsets)
    if arr.null_count:
        length = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, length)
    size = data.size if data is not None else 0
    if size < int(offsets[-1]) + 8:  # a last word would read past the buffer: use a padded copy
        padded = np.zeros(int(offsets[-1]) + 8, np.uint8)
        padded[:size] = np.frombuffer(data, np.uint8, size) if size else padded[:0]
        data, size = padded, len(padded)
    words = np.ndarray((size - 7,), dtype="<u8", buffer=data, strides=(1,))  # an 8-byte load at every byte
    nw = (length + 7) >> 3
    order = np.argsort(-nw, kind="stable")  # longest first: the rows with more than j words are a prefix
    s, ln, nws = start[order], length[order], nw[order]
    full = np.searchsorted(-nws, -np.arange(2, int(nws[0]) + 2), side="right")  # rows with > j+1 words
    h = np.zeros(n, np.uint64)
    for j, m in enumerate(full):  # every word but the last, whole
        if m == 0:
            break
        head = h[:m]
        head *= _P
        head += words[s[:m] + 8 * j]
    has = int(np.count_nonzero(nws))
    if has:  # the last word, masked to the 1..8 bytes that belong to the value
        last = words[s[:has] + 8 * (nws[:has] - 1)]
        rem = (ln[:has] - 8 * (nws[:has] - 1)).astype(np.uint64)
        last &= _MASK64 >> (np.uint64(64) - np.uint64(8) * rem)
        head = h[:has]
        head *= _P
        head += last
    out = np.empty(n, np.uint64)
    out[order] = h
    out ^= length.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    out ^= out >> np.uint64(30)  # splitmix64's finaliser: every output bit depends on every input bit
    out *= np.uint64(0xBF58476D1CE4E5B9)
    out ^= out >> np.uint64(27)
    out *= np.uint64(0x94D049BB133111EB)
    out ^= out >> np.uint64(31)
    return out


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
        """Append a table's rows to their buckets, with their key's hash as column HASH."""
        if table.num_rows == 0:
            return
        h = string_hash(table.column(self.key))
        bucket = h % np.uint64(self.buckets)
        # a stable sort keeps input order within a bucket; numpy radix-sorts 16-bit keys
        order = np.argsort(bucket.astype(np.uint16) if self.buckets <= 1 << 16 else bucket, kind="stable")
        table = table.append_column(HASH, pa.array(h)).take(pa.array(order))
        counts = np.bincount(bucket.astype(np.int64), minlength=self.buckets)
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
        """Mark rows whose key equals that of an earlier row of a bucket file; returns the mask in its order.

        Rows are grouped by their 64-bit key hash (a numpy sort of integers); only rows that share
        a hash with another row, the duplicates and the rare true collisions, are then compared
        exactly, sorted by (key, row). So the result is exact whatever the hash does.
        """
        n = table.num_rows
        mask = np.zeros(n, dtype=bool)
        if n < 2:
            return mask
        h = table.column(HASH).to_numpy()  # bucket files carry their key's hash (BucketSpill.add)
        order = np.argsort(h)
        sorted_h = h[order]
        same = sorted_h[1:] == sorted_h[:-1]
        if same.any():
            shared = np.zeros(n, dtype=bool)
            shared[1:] |= same
            shared[:-1] |= same
            cand = np.sort(order[shared])  # positions of rows whose hash another row has
            sub = table.select(["row", self.key]).take(pa.array(cand))
            sub_order = pc.sort_indices(sub, sort_keys=[(self.key, "ascending"), ("row", "ascending")])
            keys = sub.column(self.key).take(sub_order)
            dup_sorted = np.zeros(len(cand), dtype=bool)
            dup_sorted[1:] = np.asarray(pc.equal(keys.slice(1), keys.slice(0, len(cand) - 1))
                                        .to_numpy(zero_copy_only=False), dtype=bool)
            mask[cand[sub_order.to_numpy()]] = dup_sorted
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
    """A bucket file as one contiguous table: it holds one small batch per input batch (many, at
    scale), and sorting or taking from a table of many chunks costs several times more. Read, not
    memory-mapped: a mapped file's pages stay in the process's resident memory once touched."""
    with pa.OSFile(path, "rb") as source:
        return pa.ipc.open_file(source).read_all().combine_chunks()


def drop_rows(table: pa.Table, dups: np.ndarray) -> pa.Table:
    """A batch without the rows listed in the sorted array `dups`."""
    if len(dups) == 0 or table.num_rows == 0:
        return table
    rows = table.column("row").to_numpy()
    pos = np.searchsorted(dups, rows)
    hit = (pos < len(dups)) & (dups[np.minimum(pos, len(dups) - 1)] == rows)
    return table.filter(pa.array(~hit)) if hit.any() else table


def iter_spill(path: str) -> Iterable[pa.Table]:
    """Record batches of an Arrow IPC file, one at a time, read (not memory-mapped: the spill of the
    whole list would end up in resident memory as its pages are touched, growing with the rows)."""
    with pa.OSFile(path, "rb") as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield pa.Table.from_batches([reader.get_batch(i)])
