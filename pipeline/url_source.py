"""Find the url-list files of --input and stream their rows in bounded Arrow batches.

--input names one file, several, a folder or a glob, on any fsspec path (local, s3://,
http(s)://, memory://). Folders and globs are expanded to a sorted list of files so that the
same input always gives the same row order. Each file is TSV, CSV (optionally compressed) or
Parquet; batches come out with canonical column names `url`, `caption` and (when the list has
one) `image_id`, values still unvalidated. A file is never read whole: Parquet in record
batches, TSV/CSV through Arrow's streaming CSV reader.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from edje.pipeline.storage import url_to_fs

LIST_SUFFIXES = (".parquet", ".pq", ".tsv", ".csv", ".txt")
COMPRESSIONS = (".gz", ".bz2", ".zst", ".xz")
BATCH_ROWS = 131_072  # rows per batch: a few tens of MB of url + caption text


@dataclass(frozen=True)
class ReadOptions:
    """How to read the url-list files: format and the names of the url / caption / image id columns."""

    fmt: str = "auto"  # auto | tsv | csv | parquet
    url_col: str = "url"
    caption_col: str = "caption"
    id_col: str = "image_id"
    batch_rows: int = BATCH_ROWS


@dataclass(frozen=True)
class InputFile:
    """One url-list file and what identifies its content without reading it (size, etag or mtime)."""

    path: str  # full fsspec url
    size: Optional[int] = None
    version: Optional[str] = None


@dataclass
class Malformed:
    """Rows the parser could not split into the header's fields: a count and the first few."""

    count: int = 0
    examples: List[str] = field(default_factory=list)


def split_inputs(spec) -> List[str]:
    """--input as a list of entries (a string or a sequence of strings)."""
    return [spec] if isinstance(spec, str) else list(spec)


def expand_inputs(spec) -> List[InputFile]:
    """The files an --input names, in a fixed order: each entry expanded (folder, glob) and sorted."""
    files: List[InputFile] = []
    for entry in split_inputs(spec):
        protocol = entry.split("://", 1)[0] if "://" in entry else "file"
        if protocol in ("http", "https"):  # http has no listing: one url is one file
            files.append(InputFile(entry))
            continue
        fs, path = url_to_fs(entry)
        fs.invalidate_cache()
        if fs.isdir(path):
            found = fs.find(path, detail=True)
            found = {p: d for p, d in found.items() if _is_list_file(p)}
        elif any(c in path for c in "*?["):
            found = fs.glob(path, detail=True)
        else:
            found = {path: fs.info(path)}
        if not found:
            raise FileNotFoundError(f"--input {entry!r} names no url-list file")
        for p in sorted(found):
            info = found[p]
            version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
            files.append(InputFile(fs.unstrip_protocol(p), info.get("size"), str(version) if version else None))
    return files


def _is_list_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    if name.startswith((".", "_")):  # hidden files, _SUCCESS markers
        return False
    for ext in COMPRESSIONS:
        name = name[: -len(ext)] if name.endswith(ext) else name
    return name.endswith(LIST_SUFFIXES)


def fingerprint(files: Sequence[InputFile], opts: ReadOptions) -> str:
    """Digest of the file list, sizes, versions and read options: equal means the same rows, unread."""
    desc = [[f.path, f.size, f.version] for f in files] + [[opts.fmt, opts.url_col, opts.caption_col, opts.id_col]]
    return hashlib.sha256(json.dumps(desc).encode()).hexdigest()[:16]


def input_format(path: str, fmt: str = "auto") -> str:
    """'tsv', 'csv' or 'parquet' from an explicit choice or the file name."""
    if fmt != "auto":
        return fmt
    name = path.lower()
    for ext in COMPRESSIONS:
        name = name[: -len(ext)] if name.endswith(ext) else name
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    return "csv" if name.endswith(".csv") else "tsv"


def estimate_rows(files: Sequence[InputFile], opts: ReadOptions) -> int:
    """Row count of the input: exact for Parquet (footers only), from the byte size for text files."""
    total = 0
    for f in files:
        if input_format(f.path, opts.fmt) == "parquet":
            with fsspec.open(f.path, "rb") as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        else:
            total += (f.size or 0) // 80  # a CC12M line is ~130 bytes; err on the side of more rows
    return total


def iter_batches(path: str, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    """Batches of one file with canonical columns (url, caption[, image_id]); bad lines go to `malformed`."""
    fmt = input_format(path, opts.fmt)
    wanted = {opts.url_col: "url", opts.caption_col: "caption", opts.id_col: "image_id"}
    if fmt == "parquet":
        with fsspec.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            columns = _column_map(pf.schema_arrow.names, wanted, path)
            for batch in pf.iter_batches(batch_size=opts.batch_rows, columns=list(columns), use_threads=False):
                yield pa.Table.from_batches([batch]).rename_columns([columns[c] for c in batch.schema.names])
    elif fmt in ("tsv", "csv"):
        yield from _iter_delimited(path, "\t" if fmt == "tsv" else ",", opts, wanted, malformed)
    else:
        raise ValueError(f"unknown input format {fmt!r} (tsv, csv or parquet)")


def _column_map(names: Sequence[str], wanted: dict, path: str) -> dict:
    """{file column: canonical name} for the url / caption / image_id columns, matched case-insensitively."""
    lower = {n.strip().lower(): n for n in names}
    out = {}
    for given, canonical in wanted.items():
        found = lower.get(given.lower())
        if found is None:
            if canonical == "image_id":
                continue
            raise ValueError(f"{path}: the url list has no {given!r} column (columns: {list(names)})")
        out[found] = canonical
    return out


def _first_line(path: str) -> bytes:
    with fsspec.open(path, "rb", compression="infer") as f:
        line = f.read(1 << 16).split(b"\n", 1)[0]  # read(n), not readline(n): http files have no sized readline
    return line[3:] if line.startswith(b"\xef\xbb\xbf") else line  # a BOM would hide the first name


def _iter_delimited(path: str, delimiter: str, opts: ReadOptions, wanted: dict,
                    malformed: Malformed) -> Iterator[pa.Table]:
    first = [c.strip() for c in _first_line(path).rstrip(b"\r\n").split(delimiter.encode())]
    has_header = opts.url_col.lower().encode() in [c.lower() for c in first]
    if has_header:
        header = [c.decode("utf-8", "replace") for c in first]
    else:  # CC12M's own TSV has no header: url, caption[, more]
        header = [opts.url_col, opts.caption_col] + [f"extra_{i}" for i in range(max(0, len(first) - 2))]
    columns = _column_map(header, wanted, path)

    def on_invalid(row) -> str:
        malformed.count += 1
        if len(malformed.examples) < 5:
            where = f"line {row.number}: " if row.number is not None else ""
            malformed.examples.append(f"{where}{row.actual_columns} fields, expected {row.expected_columns}: "
                                      f"{(row.text or '')[:80]!r}")
        return "skip"

    read = pacsv.ReadOptions(column_names=header, skip_rows=1 if has_header else 0, use_threads=True,
                             block_size=1 << 24)
    # CC12M captions contain quotes; a TSV row is exactly one line, fields split on tabs only.
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=False if delimiter == "\t" else '"',
                               escape_char=False, newlines_in_values=False, ignore_empty_lines=True,
                               invalid_row_handler=on_invalid)
    # Every column as binary: UTF-8 is checked per row by validation, not by the parser.
    convert = pacsv.ConvertOptions(include_columns=list(columns), column_types={c: pa.binary() for c in columns},
                                   strings_can_be_null=False, quoted_strings_can_be_null=False, null_values=[])
    with fsspec.open(path, "rb", compression="infer") as f:
        reader = pacsv.open_csv(f, read_options=read, parse_options=parse, convert_options=convert)
        pending: List[pa.RecordBatch] = []
        rows = 0
        for batch in reader:  # one batch per 16 MB block; regrouped to about batch_rows rows
            pending.append(batch)
            rows += batch.num_rows
            if rows >= opts.batch_rows:
                yield _renamed(pending, columns)
                pending, rows = [], 0
        if pending:
            yield _renamed(pending, columns)


def _renamed(batches: List[pa.RecordBatch], columns: dict) -> pa.Table:
    table = pa.Table.from_batches(batches)
    return table.rename_columns([columns[c] for c in table.column_names])


def describe(files: Sequence[InputFile]) -> Tuple[str, int]:
    """(first file, number of files): how the manifest and logs name an input."""
    return (files[0].path if files else "", len(files))
