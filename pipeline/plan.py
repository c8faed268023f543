"""Plan the input shards of an encode job from a url list of any size, in bounded memory.

Two streaming passes, neither holding the list:
  1. read -> validate -> spill the kept rows (local Arrow IPC, in input order) and hand them to
     the duplicate finder (pipeline.dedupe); then find the duplicates, bucket by bucket.
  2. re-read the spill -> drop the duplicates -> cut consecutive runs of `shard_size` kept rows
     into shards -> write them to `<output>/_input/` (Parquet, one row group per shard,
     `shards_per_file` shards per file, so 10,000s of shards are 100s of objects). A file is
     built in memory and written whole (one PUT on S3) by a background thread, so its zstd
     compression overlaps the next file's cutting and digests (at most two files in memory).
A shard's digest hashes its rows' bytes; the plan digest hashes every shard's (rows, digest).
Url lists and file inputs (webdataset shards, image folders, Parquet with bytes) are planned alike:
pipeline.input_source reads either into the same columns, a file input's rows adding where each
image lies (pipeline.locator); kept columns ride along in every shard.
The same input always gives the same shards, digests and image ids: the basis of resuming.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import storage
from edje.pipeline.dedupe import IPC_OPTIONS, DuplicateFinder, drop_rows, iter_spill
from edje.pipeline.input_source import estimate_rows, is_url_list, iter_samples
from edje.pipeline.reasons import MALFORMED_ROW
from edje.pipeline.url_source import InputFile, Malformed, ReadOptions
from edje.pipeline.validate import Drops, split_counts, validate_batch

SHARD_COLUMNS = ("image_id", "url", "caption")


@dataclass(frozen=True)
class PlanConfig:
    """How shards are cut and where planning may spill."""

    shard_size: int = 1000
    shards_per_file: int = 64  # shards per `_input/` Parquet file (one row group each)
    bucket_rows: int = 400_000  # rows per duplicate-finder bucket: bounds planning memory
    scratch: Optional[str] = None  # local folder for spill files (default: the system temp dir)


@dataclass
class Plan:
    """The outcome of planning: counts, drops, and one record per shard (no rows)."""

    rows_in: int
    rows_kept: int
    failed: Dict[str, int]
    examples: Dict[str, List[str]]
    shards: pa.Table  # shard (int64), rows (int64), digest (string)
    digest: str
    has_ids: bool
    timings: Dict[str, float] = field(default_factory=dict)


def input_file(output: str, shard_id: int, shards_per_file: int) -> str:
    """The `_input/` file holding a shard (as row group shard_id % shards_per_file)."""
    return storage.join(output, "_input", f"{shard_id // shards_per_file:05d}.parquet")


def read_shard_input(path: str, row_group: int, columns: Optional[Sequence[str]] = None) -> pa.Table:
    """One shard's rows (image_id, url, caption, then any other planned columns), ids derived from urls where
    the list had none; only `columns` (and what ids are made from) when given."""
    fs, p = storage.url_to_fs(path)
    with fs.open(p, "rb") as f:
        pf = pq.ParquetFile(f)
        names = None if columns is None else [c for c in pf.schema_arrow.names if c in set(columns) | {"image_id", "url"}]
        table = pf.read_row_group(row_group, columns=names)
    table = with_image_ids(table)
    return table if columns is None else table.select(list(columns))


def with_image_ids(table: pa.Table) -> pa.Table:
    """The table with an image_id column: given ids kept, else 'u' + 19 hex digits of the url's sha1."""
    if "image_id" not in table.column_names:
        ids = pa.array([url_image_id(u) for u in table.column("url").to_pylist()], pa.string())
        table = table.append_column("image_id", ids)
    first = [c for c in SHARD_COLUMNS if c in table.column_names]
    return table.select(first + [c for c in table.column_names if c not in first])


def url_image_id(url: str) -> str:
    """Stable image id of a url without one: 'u' + 19 hex digits of its sha1."""
    return "u" + hashlib.sha1(url.encode("utf-8")).hexdigest()[:19]


def plan_input(files: Sequence[InputFile], opts: ReadOptions, cfg: PlanConfig, output: Optional[str],
               on_shard=None) -> Plan:
    """Read, validate, deduplicate and shard the input; writes `_input/` under `output` unless it is None."""
    if cfg.shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {cfg.shard_size}")
    t0 = time.time()
    drops, malformed = Drops(), Malformed()
    buckets = max(1, -(-estimate_rows(files, opts) // cfg.bucket_rows))
    with tempfile.TemporaryDirectory(prefix="edje-plan-", dir=cfg.scratch) as tmp:
        finder = DuplicateFinder(tmp, buckets)
        spill_path = os.path.join(tmp, "kept.arrow")
        rows_in, has_ids, writer, sink, spill_schema = 0, None, None, None, None
        check_urls = is_url_list(opts)
        for f in files:
            for batch in iter_samples(f, opts, malformed):
                file_ids = "image_id" in batch.column_names
                if has_ids is None:
                    has_ids = file_ids
                elif has_ids != file_ids:
                    raise ValueError(f"{f.path}: some input files have an image id column and others do not")
                kept = validate_batch(batch, rows_in, drops, check_urls)
                rows_in += batch.num_rows
                if writer is None:
                    sink, spill_schema = pa.OSFile(spill_path, "wb"), kept.schema
                    writer = pa.ipc.new_file(sink, spill_schema, options=IPC_OPTIONS)
                writer.write_table(_same_schema(kept, spill_schema, f.path))
                finder.add(kept)
        if writer is not None:
            writer.close()
            sink.close()
        drops.add(MALFORMED_ROW, malformed.count, malformed.examples)
        t1 = time.time()
        dups = finder.finish(drops)
        t2 = time.time()
        batches = iter_spill(spill_path) if writer is not None else iter([])
        records = _write_shards((drop_rows(b, dups) for b in batches), cfg, output, on_shard)
        t3 = time.time()
    failed, examples = split_counts(drops)
    digest = hashlib.sha256()
    for n, d in zip(records["rows"], records["digest"]):
        digest.update(f"{n}:{d};".encode())
    shards = pa.table({"shard": pa.array(np.arange(len(records["rows"]), dtype=np.int64)),
                       "rows": pa.array(records["rows"], pa.int64()), "digest": pa.array(records["digest"], pa.string())})
    return Plan(rows_in=rows_in + malformed.count, rows_kept=int(sum(records["rows"])), failed=failed,
                examples=examples, shards=shards, digest=digest.hexdigest()[:16], has_ids=bool(has_ids),
                timings={"read_validate_s": round(t1 - t0, 3), "dedupe_s": round(t2 - t1, 3),
                         "shard_write_s": round(t3 - t2, 3)})


def _same_schema(table: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
    """A batch in the spill's schema: one file's columns may come out as another type (int vs double,
    strings in a kept column that was numbers); a lossless cast is made, anything else named."""
    if table.schema.equals(schema):
        return table
    if table.column_names != schema.names:
        raise ValueError(f"{path}: columns {table.column_names} differ from the earlier files' {schema.names}")
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValueError(f"{path}: a column's type differs from the earlier files' ({table.schema} vs {schema}): "
                         f"{e}") from None


def _cut(batches: Iterator[pa.Table], size: int) -> Iterator[pa.Table]:
    """Consecutive runs of exactly `size` rows (the last may be shorter) from a stream of batches."""
    pending: List[pa.Table] = []
    have = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        pending.append(b)
        have += b.num_rows
        while have >= size:
            table = pa.concat_tables(pending)
            yield table.slice(0, size)
            rest = table.slice(size)
            pending, have = ([rest] if rest.num_rows else []), rest.num_rows
    if have:
        yield pa.concat_tables(pending)


def _write_shards(batches: Iterator[pa.Table], cfg: PlanConfig, output: Optional[str], on_shard) -> Dict[str, list]:
    """Cut shards, digest them and (with an output) write them as row groups of `_input/` files."""
    records: Dict[str, list] = {"rows": [], "digest": []}
    group: List[pa.Table] = []
    writing: Optional[Future] = None
    with ThreadPoolExecutor(1, thread_name_prefix="edje-input-writer") as pool:
        for sid, shard in enumerate(_cut(batches, cfg.shard_size)):
            first = [c for c in SHARD_COLUMNS if c in shard.column_names]
            shard = shard.select(first + [c for c in shard.column_names if c not in first and c != "row"])
            shard = shard.combine_chunks()
            records["rows"].append(shard.num_rows)
            records["digest"].append(shard_digest(shard))
            if on_shard is not None:
                on_shard(sid, shard)
            if output is None:
                continue
            group.append(shard)
            if len(group) == cfg.shards_per_file:
                writing = _submit_file(pool, writing, output, sid, cfg.shards_per_file, group)
                group = []
        if group:
            writing = _submit_file(pool, writing, output, len(records["rows"]) - 1, cfg.shards_per_file, group)
        if writing is not None:
            writing.result()
    return records


def _submit_file(pool: ThreadPoolExecutor, previous: Optional[Future], output: str, last_sid: int,
                 shards_per_file: int, shards: List[pa.Table]) -> Future:
    """Queue the `_input/` file holding `shards` once the previous one is written (errors surface here)."""
    if previous is not None:
        previous.result()
    return pool.submit(_write_input_file, input_file(output, last_sid, shards_per_file), shards)


def _write_input_file(url: str, shards: List[pa.Table]) -> None:
    """One `_input/` file, one row group per shard, built in memory and written in one piece."""
    sink = pa.BufferOutputStream()
    # urls are unique: dictionary pages only cost time; zstd level 1 is fast and still small
    with pq.ParquetWriter(sink, shards[0].schema, compression="zstd", compression_level=1,
                          use_dictionary=False, write_statistics=False) as writer:
        for shard in shards:
            writer.write_table(shard, row_group_size=shard.num_rows)
    fs, path = storage.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(sink.getvalue())


def shard_digest(shard: pa.Table) -> str:
    """sha256 (16 hex digits) of a shard: each string column's value bytes and their offsets, then any other
    planned column's values (kept columns, image locations) in order."""
    h = hashlib.sha256()
    for name in SHARD_COLUMNS:
        if name not in shard.column_names:
            continue
        arr = shard.column(name).combine_chunks()
        offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4 if arr.offset else 0)
        data = arr.buffers()[2]
        h.update(name.encode())
        h.update((offsets - offsets[0]).astype("<i8").tobytes())
        h.update(memoryview(data)[offsets[0]:offsets[-1]] if data is not None else b"")
    for name in shard.column_names:
        if name not in SHARD_COLUMNS:
            h.update(f"{name}:{shard.schema.field(name).type}".encode())
            h.update(repr(shard.column(name).to_pylist()).encode())
    return h.hexdigest()[:16]
