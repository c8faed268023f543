"""What --input is and who reads it: url lists (pipeline.url_source), or images a user already holds:
webdataset shards (pipeline.webdataset_source), image folders or tables of image paths
(pipeline.image_folder_source), Parquet with image bytes (pipeline.image_parquet_source).

`--input-format auto` looks at the entries: .tar files are webdataset shards, image files an image folder;
a table is read by its columns (an image-bytes column: Parquet of images, whose url column, as img2dataset's
has, is where the image came from; else a url column: a url list; a path column: a table of image paths).
Entries that disagree, or a table that fits two readings, are refused with the --input-format that settles it.
"""
from __future__ import annotations

from typing import Iterator, List, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import image_folder_source, image_parquet_source, url_source, webdataset_source
from edje.pipeline.storage import url_to_fs
from edje.pipeline.url_source import InputFile, Malformed, ReadOptions, split_inputs
from edje.schemas.encode_job import INPUT_FORMATS, URL_LIST_FORMATS

URLS = "urls"  # what detection calls a url list of any of the URL_LIST_FORMATS
BYTES_PER_IMAGE_ESTIMATE = 8_000  # a small image: row estimates of file inputs err on the side of more rows


def is_url_list(opts: ReadOptions) -> bool:
    """Whether the input is a url list (to download) rather than images already held."""
    return opts.fmt in URL_LIST_FORMATS


def resolve_format(spec, opts: ReadOptions) -> str:
    """The format the input is read as: --input-format when named, else what detect() finds in every entry."""
    if opts.fmt != "auto":
        return opts.fmt
    found = {entry: detect(entry, opts) for entry in split_inputs(spec)}
    kinds = sorted(set(found.values()))
    if len(kinds) > 1:
        raise ValueError(f"--input entries are of different kinds ({found}); encode them as separate jobs, or "
                         f"name one with --input-format")
    return "auto" if kinds[0] == URLS else kinds[0]


def detect(entry: str, opts: ReadOptions) -> str:
    """The kind of one --input entry: 'urls' or one of FILE_FORMATS (ValueError where it is unclear)."""
    if entry.split("://", 1)[0] in ("http", "https"):
        return URLS
    fs, path = url_to_fs(entry)
    fs.invalidate_cache()
    if fs.isdir(path):
        names = sorted(fs.find(path))
    elif any(c in path for c in "*?["):
        names = sorted(fs.glob(path))
    else:
        names = [path]
    tars = any(webdataset_source.is_tar(n) for n in names)
    images = any(image_folder_source.is_image(n) for n in names)
    if tars and images:
        raise ValueError(f"--input {entry!r} holds both .tar shards and image files: name one with "
                         f"--input-format webdataset or image-folder")
    if tars:
        return "webdataset"
    if images:
        return "image-folder"
    tables = [n for n in names if image_folder_source.is_table(n)]
    if not tables:
        raise FileNotFoundError(f"--input {entry!r} names no url list, .tar shard, image or Parquet file")
    return _table_kind(fs.unstrip_protocol(tables[0]), opts, entry)


def _table_kind(path: str, opts: ReadOptions, entry: str) -> str:
    """A table by its columns: url column -> url list, image bytes -> Parquet of images, path -> image paths."""
    fmt = url_source.input_format(path, "auto")
    if fmt == "parquet":
        with fsspec.open(path, "rb") as f:
            schema = pq.read_schema(f)
        names = {n.lower() for n in schema.names}
        has_image = image_parquet_source.image_column(schema, opts.image_col) is not None
    else:
        first = url_source.first_line(path).rstrip(b"\r\n").split(b"\t" if fmt == "tsv" else b",")
        names = {c.strip().decode("utf-8", "replace").lower() for c in first}
        has_image = False
    if has_image:
        return "image-parquet"
    kinds = [k for k, hit in ((URLS, opts.url_col.lower() in names), ("image-folder", opts.path_col.lower() in names))
             if hit]
    if len(kinds) > 1:
        raise ValueError(f"--input {entry!r} could be read as {' or '.join(kinds)} (columns {sorted(names)}): "
                         f"name one with --input-format")
    if not kinds and fmt == "parquet":
        raise ValueError(f"--input {entry!r}: {path} has no url column ({opts.url_col!r}), image column or "
                         f"path column ({opts.path_col!r}) (columns {sorted(names)})")
    return kinds[0] if kinds else URLS  # a text list without a header is CC12M's: url, caption


def expand(spec, opts: ReadOptions) -> List[InputFile]:
    """The input files of --input for a resolved format, in a fixed order."""
    if is_url_list(opts):
        return url_source.expand_inputs(spec)
    files: List[InputFile] = []
    for entry in split_inputs(spec):
        if opts.fmt == "webdataset":
            files += url_source.list_entry(entry, webdataset_source.is_tar, "webdataset .tar")
        elif opts.fmt == "image-parquet":
            files += url_source.list_entry(entry, image_parquet_source.is_parquet, "Parquet")
        elif opts.fmt == "image-folder":
            files += image_folder_source.expand(entry)
        else:
            raise ValueError(f"unknown input format {opts.fmt!r} (one of {', '.join(INPUT_FORMATS)})")
    return files


def iter_samples(f: InputFile, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    """Planning batches of one input file: a url list's (url, caption[, image_id], kept columns), or a file
    input's rows with where each image lies (pipeline.file_samples)."""
    if is_url_list(opts):
        return url_source.iter_batches(f.path, opts, malformed)
    reader = {"webdataset": webdataset_source, "image-folder": image_folder_source,
              "image-parquet": image_parquet_source}[opts.fmt]
    return reader.iter_samples(f, opts, malformed)


def estimate_rows(files: Sequence[InputFile], opts: ReadOptions) -> int:
    """Row count of the input, to size the duplicate finder's buckets: exact where footers say, else from sizes."""
    if is_url_list(opts):
        return url_source.estimate_rows(files, opts)
    if opts.fmt == "image-parquet":
        total = 0
        for f in files:
            with fsspec.open(f.path, "rb") as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        return total
    return sum((f.size or 0) for f in files) // BYTES_PER_IMAGE_ESTIMATE
