"""Find the url-list files of --input and stream their rows in bounded Arrow batches.

--input names one file, several, a folder or a glob, on any fsspec path (local, s3://,
http(s)://, memory://). Folders and globs are expanded to a sorted list of files so that the
same input always gives the same row order. Each file is TSV, CSV (optionally compressed) or
Parquet; batches come out with canonical column names `url`, `caption` and (when the list has
one) `image_id`, plus the --keep-columns under their own names, values still unvalidated. A file
is never read whole: Parquet in record batches, TSV/CSV through Arrow's streaming CSV reader.
Kept columns keep their Parquet types; TSV/CSV have none, so theirs are strings.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

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

    fmt: str = "auto"  # auto | tsv | csv | parquet, or a file input (pipeline.input_source.FILE_FORMATS)
    url_col: str = "url"
    caption_col: str = "caption"
    id_col: str = "image_id"
    batch_rows: int = BATCH_ROWS
    keep_columns: Tuple[str, ...] = ()  # input columns carried into the token tables
    image_col: Optional[str] = None  # Parquet with image bytes: the image column (None: found by name)
    path_col: str = "path"  # a table of image paths and captions: the path column

    def wanted(self) -> Dict[str, str]:
        """{input column name: canonical name} of the columns a url list is read for."""
        return {self.url_col: "url", self.caption_col: "caption", self.id_col: "image_id",
                **{c: c for c in self.keep_columns}}


@dataclass(frozen=True)
class InputFile:
    """One url-list file and what identifies its content without reading it (size, etag or mtime)."""

    path: str  # full fsspec url
    size: Optional[int] = None
    version: Optional[str] = None
    root: Optional[str] = None  # the folder of the --input entry that named it: ids made from paths are relative to it


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
        files += list_entry(entry, _is_list_file, "url-list")
    return files


def list_entry(entry: str, wanted, what: str) -> List[InputFile]:
    """The files one --input entry names (itself, a glob's matches, or the files under a folder that
    `wanted(path)` accepts), sorted, each with its size and version."""
    fs, path = url_to_fs(entry)
    fs.invalidate_cache()
    if fs.isdir(path):
        root = path
        found = fs.find(path, detail=True)
        found = {p: d for p, d in found.items() if wanted(p)}
    elif any(c in path for c in "*?["):
        root = path[: min(path.find(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
        found = fs.glob(path, detail=True)
    else:
        root = path.rsplit("/", 1)[0]
        found = {path: fs.info(path)}
    if not found:
        raise FileNotFoundError(f"--input {entry!r} names no {what} file")
    out = []
    for p in sorted(found):
        info = found[p]
        out.append(InputFile(fs.unstrip_protocol(p), info.get("size"), file_version(info), fs.unstrip_protocol(root)))
    return out


def file_version(info: dict) -> Optional[str]:
    """What identifies a file's content in a listing: its etag on object stores, else its mtime."""
    version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    return str(version) if version else None


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
    if opts.keep_columns or opts.image_col or opts.path_col != ReadOptions.path_col:  # folders planned before stay valid
        desc.append([list(opts.keep_columns), opts.image_col, opts.path_col])
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
    yield from iter_columns(path, input_format(path, opts.fmt), opts, opts.wanted(), ("image_id",),
                            opts.url_col, malformed)


def iter_columns(path: str, fmt: str, opts: ReadOptions, wanted: Dict[str, str], optional: Sequence[str],
                 header_col: str, malformed: Malformed, what: str = "url list") -> Iterator[pa.Table]:
    """Batches of one TSV/CSV/Parquet table with its `wanted` columns renamed; all but the `optional` ones
    must exist. A text file whose first line holds `header_col` has a header; one without is (url, caption[, more])."""
    if fmt == "parquet":
        with fsspec.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            columns = column_map(pf.schema_arrow.names, wanted, path, optional, what)
            for batch in pf.iter_batches(batch_size=opts.batch_rows, columns=list(columns), use_threads=False):
                yield pa.Table.from_batches([batch]).rename_columns([columns[c] for c in batch.schema.names])
    elif fmt in ("tsv", "csv"):
        yield from _iter_delimited(path, "\t" if fmt == "tsv" else ",", opts, wanted, optional, header_col,
                                   malformed, what)
    else:
        raise ValueError(f"unknown input format {fmt!r} (tsv, csv or parquet)")


def column_map(names: Sequence[str], wanted: dict, path: str, optional: Sequence[str] = ("image_id",),
               what: str = "url list") -> dict:
    """{file column: canonical name} for the wanted columns, matched case-insensitively; a missing one is an
    error unless its canonical name is `optional`."""
    lower = {n.strip().lower(): n for n in names}
    out = {}
    for given, canonical in wanted.items():
        found = lower.get(given.lower())
        if found is None:
            if canonical in optional:
                continue
            raise ValueError(f"{path}: the {what} has no {given!r} column (columns: {list(names)})")
        out[found] = canonical
    return out


def first_line(path: str) -> bytes:
    """The first line of a (possibly compressed) text file, without a BOM."""
    return _first_line(path)


def _first_line(path: str) -> bytes:
    with fsspec.open(path, "rb", compression="infer") as f:
        line = f.read(1 << 16).split(b"\n", 1)[0]  # read(n), not readline(n): http files have no sized readline
    return line[3:] if line.startswith(b"\xef\xbb\xbf") else line  # a BOM would hide the first name


def _iter_delimited(path: str, delimiter: str, opts: ReadOptions, wanted: dict, optional: Sequence[str],
                    header_col: str, malformed: Malformed, what: str) -> Iterator[pa.Table]:
    first = [c.strip() for c in _first_line(path).rstrip(b"\r\n").split(delimiter.encode())]
    has_header = header_col.lower().encode() in [c.lower() for c in first]
    if has_header:
        header = [c.decode("utf-8", "replace") for c in first]
    else:  # CC12M's own TSV has no header: url, caption[, more]
        header = [header_col, opts.caption_col] + [f"extra_{i}" for i in range(max(0, len(first) - 2))]
    columns = column_map(header, wanted, path, optional, what)
    kept = {c for c, canonical in columns.items() if canonical in opts.keep_columns}

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
    # Every column as binary: UTF-8 is checked per row by validation, not by the parser. Kept columns
    # are text to the reader of the tables.
    convert = pacsv.ConvertOptions(include_columns=list(columns),
                                   column_types={c: pa.string() if c in kept else pa.binary() for c in columns},
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
