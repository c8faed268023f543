"""The encode job's first stage for images a user already holds: a planned shard -> rows with image bytes.

The counterpart of pipeline.download for file inputs (webdataset shards, image folders, Parquet with
bytes): it reads each image where the plan says it lies (pipeline.locator) in bulk requests (concurrent
on object stores) and normalises it with the download's own step (pipeline.decode.PilResizer: the one
decode rule, stored as JPEG at the model's size), so an image gives the same stored bytes, and the same
tokens, whether it was downloaded from a url or read from a file. An image that cannot be read is a row
with status `unreadable_file`; one that cannot be decoded carries the decode rule's reason.
"""
from __future__ import annotations

import bisect
import io
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import storage
from edje.pipeline.decode import OK, PilResizer
from edje.pipeline.image_parquet_source import image_column
from edje.pipeline.locator import FILE, LOCATOR_COLUMNS, RANGE, ROW
from edje.pipeline.plan import read_shard_input
from edje.pipeline.reasons import UNREADABLE_FILE, split_reason

Fetched = Tuple[Optional[bytes], str]  # (bytes, "") or (None, why not)


@dataclass(frozen=True)
class ReadConfig:
    """How a shard's images are normalised: the model's input size and resize mode, the pixel limit."""

    image_size: int
    resize_mode: str = "shortest"
    max_pixels: int = 89_478_485
    image_col: Optional[str] = None  # Parquet inputs: the image column (None: found by name)


def read_rows(item: Dict, cfg: ReadConfig) -> Iterator[Dict]:
    """Ray Data flat_map stage: the rows of one planned shard with their images read and normalised."""
    shard_id = int(item["shard"])
    rows = read_shard_input(item["input"], int(item["row_group"]), ("image_id", "url", "caption") + LOCATOR_COLUMNS)
    fetched = fetch_images(rows, cfg.image_col)
    resize = PilResizer(cfg.image_size, cfg.resize_mode, cfg.max_pixels)
    for i, r in enumerate(rows.select(["image_id", "url", "caption"]).to_pylist()):
        data, why = fetched[i]
        status, detail, jpg = UNREADABLE_FILE, why, None
        if data is not None:
            jpg, _, _, _, _, error = resize(io.BytesIO(data))
            status, detail = split_reason(error) if error else (OK, "")
        yield {"shard": shard_id, "row": i, "image_id": r["image_id"], "url": r["url"], "caption": r["caption"],
               "status": status, "detail": detail, "jpg": jpg}


def fetch_images(rows: pa.Table, image_col: Optional[str] = None) -> List[Fetched]:
    """The image bytes of each row (or why there are none), read in bulk per kind of location."""
    sources = rows.column("source").to_pylist()
    positions = rows.column("position").to_pylist()
    lengths = rows.column("length").to_pylist()
    kinds = rows.column("kind").to_pylist()
    out: List[Fetched] = [(None, "no location")] * len(sources)
    by_kind: Dict[str, List[int]] = defaultdict(list)
    for i, k in enumerate(kinds):
        by_kind[k].append(i)
    for i, got in zip(by_kind[FILE], read_files([sources[i] for i in by_kind[FILE]])):
        out[i] = got
    ranges = read_ranges([sources[i] for i in by_kind[RANGE]], [positions[i] for i in by_kind[RANGE]],
                         [lengths[i] for i in by_kind[RANGE]])
    for i, got in zip(by_kind[RANGE], ranges):
        out[i] = got
    for i, got in zip(by_kind[ROW], read_cells([sources[i] for i in by_kind[ROW]], [positions[i] for i in by_kind[ROW]],
                                               image_col)):
        out[i] = got
    unknown = set(kinds) - {FILE, RANGE, ROW}
    if unknown:
        raise ValueError(f"unknown image locations {sorted(unknown)}")
    return out


def read_files(paths: List[str]) -> List[Fetched]:
    """Whole files, one bulk request per filesystem."""
    out: List[Fetched] = [(None, "")] * len(paths)
    for fs, idx, stripped in _by_filesystem(paths):
        found = fs.cat(stripped, on_error="return") if stripped else {}
        for i, p in zip(idx, stripped):
            value = found.get(p, FileNotFoundError(p))
            out[i] = (value, "") if isinstance(value, bytes) else (None, _why(paths[i], value))
    return out


def read_ranges(paths: List[str], starts: List[int], lengths: List[int]) -> List[Fetched]:
    """Byte ranges (tar members), one bulk request per filesystem; a range cut short is unreadable."""
    out: List[Fetched] = [(None, "")] * len(paths)
    for fs, idx, stripped in _by_filesystem(paths):
        got = fs.cat_ranges(stripped, [starts[i] for i in idx], [starts[i] + lengths[i] for i in idx],
                            on_error="return") if stripped else []
        for i, value in zip(idx, got):
            if not isinstance(value, bytes):
                out[i] = (None, _why(paths[i], value))
            elif len(value) != lengths[i]:
                out[i] = (None, f"{paths[i]}: cut short, {len(value)} of {lengths[i]} bytes at {starts[i]}")
            else:
                out[i] = (value, "")
    return out


def read_cells(paths: List[str], rows: List[int], image_col: Optional[str]) -> List[Fetched]:
    """Image cells of Parquet rows: each file's needed row groups read once, image column only. A Hugging
    Face struct cell without bytes names its image file by path (relative to the Parquet file's folder)."""
    out: List[Fetched] = [(None, "")] * len(paths)
    by_file: Dict[str, List[int]] = defaultdict(list)
    for i, p in enumerate(paths):
        by_file[p].append(i)
    linked: List[Tuple[int, str]] = []
    for path, idx in by_file.items():
        fs, p = storage.url_to_fs(path)
        with fs.open(p, "rb") as f:
            pf = pq.ParquetFile(f)
            col = image_column(pf.schema_arrow, image_col)
            sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
            starts = [sum(sizes[:g]) for g in range(len(sizes))]
            groups = sorted({bisect.bisect_right(starts, rows[i]) - 1 for i in idx})
            cells = pf.read_row_groups(groups, columns=[col]).column(0).to_pylist()
        offset = {g: sum(sizes[h] for h in groups[:k]) for k, g in enumerate(groups)}
        for i in idx:
            g = bisect.bisect_right(starts, rows[i]) - 1
            cell = cells[offset[g] + rows[i] - starts[g]]
            data = cell.get("bytes") if isinstance(cell, dict) else cell
            if data:
                out[i] = (bytes(data), "")
            elif isinstance(cell, dict) and cell.get("path"):
                target = cell["path"]
                linked.append((i, target if "://" in target or target.startswith("/") else
                               f"{path.rsplit('/', 1)[0]}/{target}"))
            else:
                out[i] = (None, f"{path}: row {rows[i]} holds no image bytes")
    for (i, _), got in zip(linked, read_files([t for _, t in linked])):
        out[i] = got
    return out


def _by_filesystem(paths: List[str]):
    """(filesystem, indices, paths on it) for each protocol among `paths`."""
    groups: Dict[str, List[int]] = defaultdict(list)
    for i, p in enumerate(paths):
        groups[p.split("://", 1)[0] if "://" in p else "file"].append(i)
    for _, idx in groups.items():
        fs, _ = storage.url_to_fs(paths[idx[0]])
        yield fs, idx, [storage.url_to_fs(paths[i])[1] for i in idx]


def _why(path: str, error) -> str:
    return f"{path}: {type(error).__name__}: {error}"[:300]
