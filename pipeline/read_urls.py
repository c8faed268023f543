"""Read a CC12M-style url list (TSV/CSV/Parquet, any fsspec path), validate rows, cut input shards.

Rows that cannot be used are dropped here and counted under a reason (pipeline.reasons):
malformed rows (wrong field count, missing url, url without a scheme, unusable image id),
empty or non-UTF-8 captions, duplicate urls (the first occurrence is kept) and image ids that
two different urls claim. Kept rows get `image_id` from the list's image_id column when it has
one, otherwise a stable hash of the url. Shards are consecutive runs of `shard_size` kept rows
in input order, so the same list always yields the same shards (the basis of resuming).
"""
from __future__ import annotations

import hashlib
import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.reasons import CAPTION_NOT_UTF8, DUPLICATE_IMAGE_ID, DUPLICATE_URL, EMPTY_CAPTION, MALFORMED_ROW

MAX_EXAMPLES = 5


@dataclass
class UrlList:
    """The kept rows (image_id, url, caption; input order) and what was dropped, by reason."""

    rows: pa.Table
    rows_in: int
    failed: Dict[str, int] = field(default_factory=dict)
    examples: Dict[str, List[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class InputShard:
    """One input shard: its id, its rows and a digest of their content."""

    shard_id: int
    rows: pa.Table
    digest: str


def input_format(path: str, fmt: str = "auto") -> str:
    """'tsv', 'csv' or 'parquet' from an explicit choice or the file name."""
    if fmt != "auto":
        return fmt
    name = path.lower()
    for ext in (".gz", ".bz2", ".zst", ".xz"):
        name = name[: -len(ext)] if name.endswith(ext) else name
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    return "csv" if name.endswith(".csv") else "tsv"


def read_url_list(path: str, fmt: str = "auto", url_col: str = "url", caption_col: str = "caption",
                  storage_options: Optional[dict] = None) -> UrlList:
    """Read and validate a url list; see the module docstring for what is dropped and why."""
    fmt = input_format(path, fmt)
    bad: List[str] = []
    if fmt == "parquet":
        with fsspec.open(path, "rb", **(storage_options or {})) as f:
            table = pq.read_table(f)
    elif fmt in ("tsv", "csv"):
        with fsspec.open(path, "rb", compression="infer", **(storage_options or {})) as f:
            data = f.read()
        table = _read_delimited(data, "\t" if fmt == "tsv" else ",", url_col, caption_col, bad)
    else:
        raise ValueError(f"unknown input format {fmt!r} (tsv, csv or parquet)")
    table = _canonical_columns(table, {url_col: "url", caption_col: "caption", "image_id": "image_id"}, path)
    return validate_rows(table, "url", "caption", malformed=bad)


def _canonical_columns(table: pa.Table, wanted: Dict[str, str], path: str) -> pa.Table:
    """Rename the url / caption / image_id columns (matched case-insensitively) to their canonical names."""
    lower = {c.strip().lower(): c for c in table.column_names}
    names = list(table.column_names)
    for given, canonical in wanted.items():
        found = lower.get(given.lower())
        if found is None:
            if canonical == "image_id":
                continue
            raise ValueError(f"{path}: the url list has no {given!r} column (columns: {table.column_names})")
        names[names.index(found)] = canonical
    return table.rename_columns(names)


def _read_delimited(data: bytes, delimiter: str, url_col: str, caption_col: str, bad: List[str]) -> pa.Table:
    """Parse TSV/CSV bytes with all columns as binary (UTF-8 is checked per row later)."""
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark would hide the header's first name
        data = data[3:]
    first = data.split(b"\n", 1)[0].rstrip(b"\r").split(delimiter.encode())
    has_header = url_col.lower().encode() in [c.strip().lower() for c in first]
    names = None if has_header else [url_col, caption_col] + [f"extra_{i}" for i in range(max(0, len(first) - 2))]

    def on_invalid(row) -> str:
        where = f"line {row.number}: " if row.number is not None else ""
        bad.append(f"{where}{row.actual_columns} fields, expected {row.expected_columns}: {(row.text or '')[:80]!r}")
        return "skip"

    read = pacsv.ReadOptions(column_names=names, autogenerate_column_names=False, use_threads=True,
                             block_size=1 << 24)
    # CC12M captions contain quotes; a TSV row is exactly one line, fields split on tabs only.
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=False if delimiter == "\t" else '"',
                               escape_char=False, newlines_in_values=False, ignore_empty_lines=True,
                               invalid_row_handler=on_invalid)
    header = first if has_header else names
    header = [h.decode("utf-8", "replace").strip() if isinstance(h, bytes) else h for h in header]
    convert = pacsv.ConvertOptions(column_types={h: pa.binary() for h in header}, strings_can_be_null=False,
                                   quoted_strings_can_be_null=False, null_values=[])
    return pacsv.read_csv(io.BytesIO(data), read_options=read, parse_options=parse, convert_options=convert)


def validate_rows(table: pa.Table, url_col: str = "url", caption_col: str = "caption",
                  malformed: Optional[List[str]] = None) -> UrlList:
    """Apply the row checks to a parsed table; returns kept rows (image_id, url, caption)."""
    malformed = malformed or []
    failed: Counter = Counter({MALFORMED_ROW: len(malformed)} if malformed else {})
    examples: Dict[str, List[str]] = {MALFORMED_ROW: malformed[:MAX_EXAMPLES]} if malformed else {}
    n = table.num_rows
    reason = np.full(n, "", dtype=object)

    def drop(mask: np.ndarray, why: str, values) -> None:
        fresh = mask & (reason == "")
        if fresh.any():
            reason[fresh] = why
            failed[why] += int(fresh.sum())
            idx = np.flatnonzero(fresh)[:MAX_EXAMPLES - len(examples.get(why, []))]
            examples.setdefault(why, []).extend(f"row {i}: {str(values[i])[:80]!r}" for i in idx)

    urls, url_bad = _utf8(table.column(url_col))
    urls = [u.strip() if u is not None else None for u in urls]
    no_scheme = np.array([not u or "://" not in u or any(c in "\t\r\n" for c in u) for u in urls])
    drop(url_bad | no_scheme, MALFORMED_ROW, urls)
    has_ids = "image_id" in table.column_names
    if has_ids:
        ids, id_bad = _utf8(table.column("image_id"))
        ids = [i.strip() if i is not None else None for i in ids]
        drop(id_bad | np.array([not i for i in ids]), MALFORMED_ROW, ids)
    caps, cap_bad = _utf8(table.column(caption_col))
    raw_caps = table.column(caption_col).to_pylist()
    drop(cap_bad & np.array([c is not None for c in raw_caps]), CAPTION_NOT_UTF8, raw_caps)
    caps = [c.strip() if c is not None else "" for c in caps]
    drop(np.array([not c for c in caps]), EMPTY_CAPTION, caps)
    seen_url: Dict[str, int] = {}
    dup = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(reason == ""):
        dup[i] = seen_url.setdefault(urls[i], i) != i
    drop(dup, DUPLICATE_URL, urls)
    if not has_ids:
        ids = [url_image_id(u) if u else None for u in urls]
    seen_id: Dict[str, int] = {}
    dup = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(reason == ""):
        dup[i] = seen_id.setdefault(ids[i], i) != i
    drop(dup, DUPLICATE_IMAGE_ID, ids)
    keep = np.flatnonzero(reason == "")
    rows = pa.table({
        "image_id": pa.array([ids[i] for i in keep], pa.string()),
        "url": pa.array([urls[i] for i in keep], pa.string()),
        "caption": pa.array([caps[i] for i in keep], pa.string()),
    })
    return UrlList(rows, rows_in=n + len(malformed), failed=dict(failed), examples=examples)


def url_image_id(url: str) -> str:
    """Stable image id of a url without one: 'u' + 19 hex digits of its sha1."""
    return "u" + hashlib.sha1(url.encode("utf-8")).hexdigest()[:19]


def plan_shards(rows: pa.Table, shard_size: int) -> List[InputShard]:
    """Cut the kept rows into consecutive shards of `shard_size` rows, each with a content digest."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    shards = []
    for sid, start in enumerate(range(0, rows.num_rows, shard_size)):
        part = rows.slice(start, shard_size)
        h = hashlib.sha256()
        for col in ("image_id", "url", "caption"):
            for v in part.column(col).to_pylist():
                h.update(v.encode("utf-8"))
                h.update(b"\x00")
        shards.append(InputShard(sid, part, h.hexdigest()[:16]))
    return shards


def _utf8(column) -> tuple[list, np.ndarray]:
    """Binary/string column -> (list of str or None, mask of values that are not valid UTF-8)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        try:
            arr.validate(full=True)  # Parquet "strings" can still hold invalid UTF-8
            return arr.to_pylist(), np.zeros(len(arr), dtype=bool)
        except pa.ArrowInvalid:
            arr = arr.cast(pa.binary())
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = pc.cast(arr, pa.string())
        return arr.to_pylist(), np.zeros(len(arr), dtype=bool)
    try:  # fast path: the whole column is valid UTF-8
        return arr.cast(pa.string()).to_pylist(), np.zeros(len(arr), dtype=bool)
    except pa.ArrowInvalid:
        pass
    out, bad = [], np.zeros(len(arr), dtype=bool)
    for i, v in enumerate(arr.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(v.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            bad[i] = True
    return out, bad
