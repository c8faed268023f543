"""Row checks on one batch of a url list, vectorised with pyarrow compute.

A row is dropped, under the first reason that applies (pipeline.reasons): a url that is not
UTF-8, empty, has no scheme or holds a tab or newline, or an empty image id (malformed_row);
a caption that is not UTF-8 (caption_not_utf8) or empty after trimming (empty_caption).
Duplicates are not decided here: they need the whole list (pipeline.dedupe). Every row
carries its global index `row` (its position among the parsed rows of all files), which
orders "first occurrence" and makes the plan deterministic. Other columns (kept columns, where a
file input's image lies) pass through, filtered with the rows.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from edje.pipeline.reasons import CAPTION_NOT_UTF8, EMPTY_CAPTION, MALFORMED_ROW

MAX_EXAMPLES = 5
# A column an input may add: the reason (one of pipeline.reasons) a row it already knows to be unusable is
# dropped under, before any other check; null for the usable rows.
DROP_COLUMN = "_drop"


@dataclass
class Drops:
    """Dropped rows by reason, with the first few examples of each (in input order)."""

    failed: Counter = field(default_factory=Counter)
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def add(self, reason: str, count: int, examples: List[str]) -> None:
        """Count `count` rows under `reason`, keeping the first MAX_EXAMPLES examples."""
        if count:
            self.failed[reason] += count
            kept = self.examples.setdefault(reason, [])
            kept.extend(examples[: MAX_EXAMPLES - len(kept)])


def validate_batch(batch: pa.Table, first_row: int, drops: Drops, check_urls: bool = True) -> pa.Table:
    """Kept rows of a batch as (row, url, caption[, image_id], other columns), strings trimmed; drops counted
    in `drops`. Without `check_urls` the url is provenance only (a file input's), not something to fetch."""
    n = batch.num_rows
    rows = pa.array(np.arange(first_row, first_row + n, dtype=np.int64))
    dropped = np.zeros(n, dtype=bool)

    def drop(mask: pa.Array, reason: str, values: pa.Array) -> None:
        fresh = np.asarray(mask.fill_null(True).to_numpy(zero_copy_only=False), dtype=bool) & ~dropped
        if fresh.any():
            idx = np.flatnonzero(fresh)
            dropped[idx] = True
            drops.add(reason, len(idx), [f"row {first_row + i}: {_text(values[i].as_py())[:80]!r}"
                                         for i in idx[:MAX_EXAMPLES]])

    if DROP_COLUMN in batch.column_names:
        marked = batch.column(DROP_COLUMN).combine_chunks()
        for reason in sorted(r for r in pc.unique(marked).to_pylist() if r is not None):
            drop(pc.fill_null(pc.equal(marked, reason), False), reason, batch.column("url").combine_chunks())
    url = pc.utf8_trim_whitespace(_utf8(batch.column("url")))
    if check_urls:
        bad_url = pc.or_(pc.equal(pc.binary_length(url), 0), pc.invert(pc.match_substring(url, "://")))
        if _has_control_bytes(url):  # the regex is the slow check: run it only on batches that need it
            bad_url = pc.or_(bad_url, pc.match_substring_regex(url, "[\t\r\n]"))
        drop(bad_url, MALFORMED_ROW, batch.column("url").combine_chunks())
    out = {"row": rows, "url": url}
    if "image_id" in batch.column_names:
        ids = pc.utf8_trim_whitespace(_utf8(batch.column("image_id")))
        drop(pc.equal(pc.binary_length(ids), 0), MALFORMED_ROW, batch.column("image_id").combine_chunks())
        out["image_id"] = ids
    raw_caption = batch.column("caption").combine_chunks()
    caption = _utf8(raw_caption)
    drop(pc.and_(pc.is_null(caption), pc.is_valid(raw_caption)), CAPTION_NOT_UTF8, raw_caption)
    caption = pc.utf8_trim_whitespace(caption)
    drop(pc.equal(pc.binary_length(caption), 0), EMPTY_CAPTION, caption)
    out["caption"] = caption
    for name in batch.column_names:
        if name not in out and name != DROP_COLUMN:
            out[name] = batch.column(name).combine_chunks()
    keep = pa.array(~dropped)
    return pa.table({k: pc.filter(v, keep) for k, v in out.items()})


def _has_control_bytes(arr: pa.Array) -> bool:
    """Whether any value of a string array holds a byte below 0x20 (tab, newline, ...)."""
    data = arr.buffers()[2]
    return data is not None and bool((np.frombuffer(data, np.uint8) < 32).any())


def _utf8(column) -> pa.Array:
    """A column as strings; values that are not valid UTF-8 become null."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.binary() if pa.types.is_large_binary(arr.type) else pa.string())
    if pa.types.is_string(arr.type):
        try:
            arr.validate(full=True)  # Parquet "strings" can still hold invalid UTF-8
            return arr
        except pa.ArrowInvalid:
            arr = arr.cast(pa.binary())
    if not pa.types.is_binary(arr.type):
        return pc.cast(arr, pa.string())  # numbers as ids, for instance
    try:  # fast path: the whole batch is valid UTF-8
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    return pa.array([_decode(v) for v in arr.to_pylist()], pa.string())  # rare: only batches with bad bytes


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _decode(value) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def split_counts(drops: Drops) -> Tuple[Dict[str, int], Dict[str, List[str]]]:
    """(failed counts, examples) as plain dicts, sorted by reason."""
    return dict(sorted(drops.failed.items())), {k: drops.examples[k] for k in sorted(drops.examples)}
