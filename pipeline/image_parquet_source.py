"""Samples of Parquet files that hold the images themselves: a binary image column, or the Hugging Face
datasets layout (a struct {bytes, path}, where a null `bytes` means the image is the file at `path`), and a
caption column. img2dataset's Parquet output is one (image `jpg`, caption `txt`, its own `key`).

Planning reads every column but the image; the image cells are read later by the shard that holds the row
(pipeline.read_files). Image id: the id column, else img2dataset's `key`, else a hash of the file's path
under the --input entry and the row. Rows img2dataset could not download (its `status` column) are counted
under their download reason.
"""
from __future__ import annotations

from typing import Iterator, Optional

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edje.pipeline.file_samples import path_image_id
from edje.pipeline.locator import ROW, locator_arrays
from edje.pipeline.reasons import classify_download_error
from edje.pipeline.url_source import InputFile, Malformed, ReadOptions, column_map
from edje.pipeline.validate import DROP_COLUMN

IMAGE_COLUMNS = ("jpg", "image", "img", "png", "webp", "jpeg", "image_bytes")  # img2dataset's, then HF datasets'
CAPTION_FALLBACK = "txt"  # img2dataset's Parquet output names its caption column so


def is_parquet(path: str) -> bool:
    """A Parquet file by its name."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith((".parquet", ".pq")) and not name.startswith((".", "_"))


def is_image_type(t: pa.DataType) -> bool:
    """Binary, or a struct with a binary `bytes` field (the Hugging Face datasets Image feature)."""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    return pa.types.is_struct(t) and any(t.field(i).name == "bytes" for i in range(t.num_fields))


def image_column(schema: pa.Schema, given: Optional[str]) -> Optional[str]:
    """The image column of a schema: `given` (checked), else the first of IMAGE_COLUMNS of an image type."""
    if given:
        if given not in schema.names or not is_image_type(schema.field(given).type):
            return None
        return given
    return next((c for c in IMAGE_COLUMNS if c in schema.names and is_image_type(schema.field(c).type)), None)


def caption_column(schema: pa.Schema, opts: ReadOptions) -> str:
    """--caption-col, or img2dataset's `txt` where the file has no column of that name."""
    names = {n.lower() for n in schema.names}
    return opts.caption_col if opts.caption_col.lower() in names or CAPTION_FALLBACK not in names else CAPTION_FALLBACK


def iter_samples(f: InputFile, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    """Planning batches of one Parquet file (pipeline.file_samples' columns), its images left unread."""
    with fsspec.open(f.path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        schema = pf.schema_arrow
        if image_column(schema, opts.image_col) is None:
            raise ValueError(f"{f.path}: no image column (binary, or a struct with `bytes`) named "
                             f"{opts.image_col or ' or '.join(IMAGE_COLUMNS)} (columns: {schema.names})")
        wanted = {opts.id_col: "image_id", "key": "key", caption_column(schema, opts): "caption",
                  opts.url_col: "url", "status": "status", "error_message": "error_message",
                  **{c: c for c in opts.keep_columns}}
        columns = column_map(schema.names, wanted, f.path, ("image_id", "key", "url", "status", "error_message"),
                             "Parquet of images")
        relative = f.path[len(f.root.rstrip("/")) + 1:] if f.root and f.path.startswith(f.root) else f.path
        first = 0
        for batch in pf.iter_batches(batch_size=opts.batch_rows, columns=list(columns), use_threads=False):
            table = pa.Table.from_batches([batch]).rename_columns([columns[c] for c in batch.schema.names])
            yield _samples(table, f.path, relative, first, opts)
            first += table.num_rows


def _samples(table: pa.Table, path: str, relative: str, first: int, opts: ReadOptions) -> pa.Table:
    n = table.num_rows
    rows = list(range(first, first + n))
    if "image_id" in table.column_names:
        ids = pc.cast(table.column("image_id"), pa.string())
    elif "key" in table.column_names:
        ids = pc.cast(table.column("key"), pa.string())
    else:
        ids = pa.array([path_image_id(f"{relative}#{r}") for r in rows], pa.string())
    urls = table.column("url") if "url" in table.column_names else pa.array([f"{path}#{r}" for r in rows])
    columns = {"image_id": ids, "url": urls, "caption": table.column("caption"),
               **locator_arrays([path] * n, rows, [-1] * n, [ROW] * n)}
    for c in opts.keep_columns:
        columns[c] = table.column(c)
    drops = [None] * n
    if "status" in table.column_names:
        errors = table.column("error_message").to_pylist() if "error_message" in table.column_names else [None] * n
        for i, status in enumerate(table.column("status").to_pylist()):
            if status is not None and status != "success":
                drops[i] = classify_download_error(errors[i] or "")
    columns[DROP_COLUMN] = pa.array(drops, pa.string())
    return pa.table(columns)
