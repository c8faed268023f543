"""The writer: encoded rows -> part files -> one committed token table + stats per input shard.

Ray Data batches do not follow shard boundaries, so the pipeline's last stage writes each
batch's rows as part files under `_parts/<shard>/` and reports (shard, part, rows). The driver
commits a shard once parts covering all its input rows have been reported: `commit_shard`
reads exactly those parts (parts left behind by failed task attempts are never read), keeps
each input row once, writes the token table under a temporary name and renames it into place,
then writes `stats/<shard>.json`, which is the shard's commit record: a shard is done iff
its stats file exists. Columns kept from the input (--keep-columns) are taken at the commit from the
shard's planned rows, where they keep their Arrow types, rather than carried through the encoder. A table
with an augment (training tables: `--augment hflip`) gets each ok row's transformed copy, carried in the
part row's AUGMENTED_COLUMNS, as a row of its own (schemas/token_table.py).
"""
from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edje.pipeline import storage
from edje.pipeline.decode import OK
from edje.schemas.token_table import (
    AUGMENTS,
    TableMetadata,
    build_table_from_blobs,
    with_columns,
    with_lineage,
    write_token_table,
)

# When the encoder worked and when its actor was built; each part reports the earliest start and latest end.
TIMING_COLUMNS = ("encode_start", "encode_end", "actor_init_start", "actor_init_end")
PART_COLUMNS = ("shard", "row", "image_id", "url", "caption", "status", "detail", "tokens", "token_scales",
                "image_embedding", "text_embedding")
# A row's transformed copy (an augment): its token blob, scales and pooled embedding.
AUGMENTED_COLUMNS = ("tokens_augmented", "token_scales_augmented", "image_embedding_augmented")


class IncompleteShardError(RuntimeError):
    """The parts reported for a shard do not cover every one of its input rows."""


@dataclass(frozen=True)
class CarriedColumns:
    """Columns a committed table takes from the rows it was made from: `columns` of the Parquet file `path`
    (its row group `row_group`, or the whole file when None), whose row i is the shard's row i."""

    path: str
    row_group: Optional[int]
    columns: Tuple[str, ...]

    def read(self, rows: np.ndarray) -> pa.Table:
        """The columns at the given shard rows."""
        fs, path = storage.url_to_fs(self.path)
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            table = pf.read(list(self.columns)) if self.row_group is None else \
                pf.read_row_group(self.row_group, list(self.columns))
        return table.take(pa.array(rows, pa.int64()))


def table_path(output: str, shard_id: int) -> str:
    """Where the committed token table of a shard lives."""
    return storage.join(output, "tables", f"part-{shard_id:05d}.parquet")


def stats_path(output: str, shard_id: int) -> str:
    """Where the stats (= commit record) of a shard live."""
    return storage.join(output, "stats", f"{shard_id:05d}.json")


def parts_dir(output: str, shard_id: int) -> str:
    """Folder of a shard's uncommitted part files."""
    return storage.join(output, "_parts", f"{shard_id:05d}")


def write_parts(batch: pa.Table, output: str) -> pa.Table:
    """Ray Data stage: write the batch's rows as one part file per shard; returns (shard, part, rows, times)."""
    shards, parts, counts = [], [], []
    times = {c: (pc.min if c.endswith("_start") else pc.max)(batch.column(c)).as_py()
             for c in TIMING_COLUMNS if c in batch.column_names}
    batch = batch.select(list(PART_COLUMNS) + [c for c in AUGMENTED_COLUMNS if c in batch.column_names])
    for sid in pc.unique(batch.column("shard")).to_pylist():
        rows = batch.filter(pc.equal(batch.column("shard"), sid))
        part = storage.join(parts_dir(output, sid), f"{uuid.uuid4().hex}.parquet")
        fs, path = storage.url_to_fs(part)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            pq.write_table(rows, f, compression="zstd")
        shards.append(sid)
        parts.append(part)
        counts.append(rows.num_rows)
    n = len(shards)
    return pa.table({"shard": pa.array(shards, pa.int32()), "part": pa.array(parts, pa.string()),
                     "rows": pa.array(counts, pa.int64()),
                     **{c: pa.array([times.get(c)] * n, pa.float64()) for c in TIMING_COLUMNS}})


def commit_shard(output: str, shard_id: int, parts: List[str], expected_rows: int, meta_json: str,
                 extra: Optional[Dict] = None, carry: Optional[CarriedColumns] = None,
                 lineage: Optional[Dict[str, Any]] = None) -> Dict:
    """Merge a shard's parts into its token table (with the `carry` columns, and `lineage` when it was made
    from other tables), commit it atomically, write its stats; returns stats."""
    start = time.time()
    done = storage.read_json(stats_path(output, shard_id))
    if done is not None:  # a retried commit whose first attempt got as far as the commit record
        return done
    meta = TableMetadata.from_bytes(meta_json.encode())
    tables = []
    for part in parts:
        fs, path = storage.url_to_fs(part)
        with fs.open(path, "rb") as f:
            tables.append(pq.read_table(f))
    rows = pa.concat_tables(tables) if tables else None
    if rows is None or rows.num_rows == 0:
        raise IncompleteShardError(f"shard {shard_id}: no rows in its parts")
    rows = rows.sort_by("row")
    row_ids = rows.column("row").to_numpy()
    first = np.concatenate([[True], row_ids[1:] != row_ids[:-1]])  # a row twice (a retried write): keep one
    rows = rows.filter(pa.array(first))
    got = rows.column("row").to_numpy()
    if len(got) != expected_rows or not np.array_equal(got, np.arange(expected_rows)):
        missing = sorted(set(range(expected_rows)) - set(got.tolist()))[:10]
        raise IncompleteShardError(f"shard {shard_id}: parts hold {len(got)} of {expected_rows} rows "
                                   f"(missing e.g. {missing})")
    status = rows.column("status").to_numpy(zero_copy_only=False)
    ok = rows.filter(pa.array(status == OK))
    failed = Counter(status[status != OK].tolist())
    examples: Dict[str, List[str]] = {}
    for s, d, u in zip(status, rows.column("detail").to_pylist(), rows.column("url").to_pylist()):
        if s != OK and len(examples.setdefault(s, [])) < 3:
            examples[s].append(f"{u}: {d}"[:200])
    n = ok.num_rows
    codec = meta.codec
    # The images, then (with an augment) their transformed copies, each a row of its own.
    copies = [("tokens", "token_scales", "image_embedding")] + ([AUGMENTED_COLUMNS] if meta.augment else [])
    ids, sources = ok.column("image_id").to_pylist(), None
    if meta.augment is not None:
        ids, sources = ids + [i + AUGMENTS[meta.augment] for i in ids], [None] * n + ids
    blob = np.concatenate([_blob_matrix(ok.column(c[0]), codec.blob_bytes, n) for c in copies])
    scales = np.concatenate([_blob_matrix(ok.column(c[1]), 2 * codec.num_scales, n).view("<f2")
                             for c in copies]) if codec.num_scales else None
    embeddings = np.concatenate([_vectors(ok.column(c[2]), meta.embed_dim, n) for c in copies])
    times = len(copies)  # a copy keeps its source row's caption, text embedding, url and kept columns
    with_text = meta.kind == "raw"
    table = build_table_from_blobs(
        meta, ids, blob, scales, embeddings,
        captions=ok.column("caption").to_pylist() * times if with_text else None,
        text_embeddings=np.tile(_vectors(ok.column("text_embedding"), meta.embed_dim, n), (times, 1))
        if with_text else None,
        urls=ok.column("url").to_pylist() * times, sources=sources,
    )
    if carry is not None and carry.columns:
        table = with_columns(table, carry.read(np.tile(ok.column("row").to_numpy(), times)))
    if lineage is not None:
        table = with_lineage(table, lineage)
    target = table_path(output, shard_id)
    table_bytes = storage.atomic_write(target, lambda tmp: write_token_table(table, tmp))
    stats = {
        "shard": shard_id, "rows_in": expected_rows, "images_ok": n, "augmented_rows": table.num_rows - n,
        "failed": dict(sorted(failed.items())),
        "failed_examples": examples, "table": target, "table_bytes": int(table_bytes),
        "token_bytes_per_image": codec.bytes_per_image, "commit_seconds": round(time.time() - start, 3),
        "committed_at": time.time(), **(extra or {}),
    }
    storage.write_json(stats_path(output, shard_id), stats)  # the commit record: written last
    storage.remove(parts_dir(output, shard_id), recursive=True)
    return stats


def _blob_matrix(column: pa.ChunkedArray, width: int, n: int) -> np.ndarray:
    """Variable binary column of equal-length blobs -> uint8 [n, width]."""
    if n == 0:
        return np.zeros((0, width), np.uint8)
    data = b"".join(column.to_pylist())
    if len(data) != n * width:
        raise ValueError(f"token blobs hold {len(data)} bytes, expected {n} x {width}")
    return np.frombuffer(data, dtype=np.uint8).reshape(n, width)


def _vectors(column: pa.ChunkedArray, dim: int, n: int) -> np.ndarray:
    """List<float32> column -> float32 [n, dim]."""
    if n == 0:
        return np.zeros((0, dim), np.float32)
    flat = pc.list_flatten(column.combine_chunks()).to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(n, dim)
