"""Samples of an image folder: images with sidecar captions, or a table of image paths and captions.

- A folder (local or `s3://`; img2dataset's "files" output is one): every image file is a sample, its
  caption the sidecar `<key>.txt` beside it, else the `caption` field of a sidecar `<key>.json`, whose fields
  also give the image id, the original url and kept columns. The key is the path under the folder without
  its extension; it is the image id when no sidecar names one.
- A table (CSV, TSV or Parquet) with a path column and a caption column (`--path-col`, `--caption-col`):
  paths relative to the table's folder, absolute, or urls; the id column when the table has one, else the
  path as written without its extension.

The images are read later by the shard that holds them (pipeline.read_files); planning reads only the
listing and the sidecars (in bulk: concurrent requests on object stores).
"""
from __future__ import annotations

import hashlib
from typing import Dict, Iterator, List

import pyarrow as pa

from edje.pipeline.file_samples import IMAGE_EXTENSIONS, json_object, sample_table, split_file_name
from edje.pipeline.locator import FILE, locator_arrays
from edje.pipeline.reasons import MALFORMED_ROW
from edje.pipeline.storage import url_to_fs
from edje.pipeline.url_source import (
    COMPRESSIONS,
    InputFile,
    Malformed,
    ReadOptions,
    file_version,
    input_format,
    iter_columns,
    list_entry,
)
from edje.pipeline.validate import DROP_COLUMN

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".pq")
SIDECAR_CHUNK = 4096  # sidecar files fetched per bulk request


def is_table(path: str) -> bool:
    """A caption table by its name (optionally compressed text)."""
    name = path.rsplit("/", 1)[-1].lower()
    for ext in COMPRESSIONS:
        name = name[: -len(ext)] if name.endswith(ext) else name
    return name.endswith(TABLE_SUFFIXES)


def is_image(path: str) -> bool:
    """An image file by its extension."""
    return split_file_name(path.rsplit("/", 1)[-1])[1] in IMAGE_EXTENSIONS


def expand(entry: str) -> List[InputFile]:
    """The inputs one --input entry names: its caption tables, or the folder itself (one input, whose version
    digests the listing, so a rerun over an unchanged folder reuses its plan)."""
    fs, path = url_to_fs(entry)
    fs.invalidate_cache()
    if not fs.isdir(path):
        tables = list_entry(entry, is_table, "caption table")
        others = [t.path for t in tables if not is_table(t.path)]
        if others:
            raise ValueError(f"--input {entry!r}: an image folder is named by its folder, or by tables of image paths "
                             f"and captions; {others[0]} is neither")
        return tables
    listing = _listing(fs, path)
    digest = hashlib.sha256()
    total = 0
    for p in sorted(listing):
        info = listing[p]
        total += int(info.get("size") or 0)
        digest.update(f"{p}\0{info.get('size')}\0{file_version(info)}\n".encode())
    root = fs.unstrip_protocol(path)
    return [InputFile(root, total, digest.hexdigest()[:16], root)]


def iter_samples(f: InputFile, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    """The samples of a folder or a caption table as planning batches (pipeline.file_samples)."""
    if is_table(f.path):
        yield from _table_samples(f, opts, malformed)
    else:
        yield from _folder_samples(f, opts)


def _listing(fs, path: str) -> Dict[str, Dict]:
    """Visible files under a folder (no hidden or `_`-prefixed names, as img2dataset's `_tmp`)."""
    found = fs.find(path, detail=True)
    root = path.rstrip("/") + "/"
    return {p: d for p, d in found.items()
            if not any(part.startswith((".", "_")) for part in p[len(root):].split("/"))}


def _folder_samples(f: InputFile, opts: ReadOptions) -> Iterator[pa.Table]:
    fs, root = url_to_fs(f.path)
    root = root.rstrip("/")
    names = sorted(_listing(fs, root))
    present = set(names)
    images = [p for p in names if is_image(p)]
    for start in range(0, len(images), SIDECAR_CHUNK):
        chunk = images[start:start + SIDECAR_CHUNK]
        keys = [split_file_name(p[len(root) + 1:])[0] for p in chunk]
        wanted = [f"{root}/{k}.{ext}" for k in keys for ext in ("txt", "json") if f"{root}/{k}.{ext}" in present]
        side = fs.cat(wanted, on_error="omit") if wanted else {}
        ids, urls, captions = [], [], []
        keep: Dict[str, List] = {c: [] for c in opts.keep_columns}
        for path, key in zip(chunk, keys):
            meta = json_object(side.get(f"{root}/{key}.json"))
            caption = side.get(f"{root}/{key}.txt")
            if caption is None and isinstance(meta.get(opts.caption_col), str):
                caption = meta[opts.caption_col].encode("utf-8")
            ids.append(str(meta[opts.id_col]) if meta.get(opts.id_col) is not None else key)
            urls.append(str(meta[opts.url_col]) if meta.get(opts.url_col) else fs.unstrip_protocol(path))
            captions.append(caption)
            for c in opts.keep_columns:
                keep[c].append(meta.get(c))
        n = len(chunk)
        yield sample_table(ids, urls, captions, [fs.unstrip_protocol(p) for p in chunk], [0] * n, [-1] * n,
                           [FILE] * n, keep)


def _table_samples(f: InputFile, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    wanted = {opts.path_col: "path", **opts.wanted()}
    fmt = input_format(f.path, "auto")
    base = f.path.rsplit("/", 1)[0]
    for batch in iter_columns(f.path, fmt, opts, wanted, ("image_id", "url"), opts.path_col, malformed,
                              "caption table"):
        written = [_text(p).strip() for p in batch.column("path").to_pylist()]
        resolved = [p if "://" in p or p.startswith("/") else f"{base}/{p}" for p in written]
        if "image_id" in batch.column_names:
            ids = batch.column("image_id")
        else:
            ids = pa.array([split_file_name(p)[0] for p in written], pa.string())
        urls = batch.column("url") if "url" in batch.column_names else pa.array(resolved, pa.string())
        n = batch.num_rows
        columns = {"image_id": ids, "url": urls, "caption": batch.column("caption"),
                   **locator_arrays(resolved, [0] * n, [-1] * n, [FILE] * n)}
        for c in opts.keep_columns:
            columns[c] = batch.column(c)
        columns[DROP_COLUMN] = pa.array([None if p else MALFORMED_ROW for p in written], pa.string())
        yield pa.table(columns)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
