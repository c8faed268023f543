"""Token tables as memory-mapped column files: built once per node, then shared through the page cache.

A corpus of token tables (Parquet, one row per image) becomes one folder of `.npy` files: the sorted, unique image
ids (`ids.npy`, fixed-width bytes) and one matrix per column (`tokens.npy` uint8 [N, blob_bytes], `token_scales.npy`
fp16 [N, scales], `image_embedding.npy` fp32 [N, e]; `url.offsets.npy` + `url.data.npy` for the variable-width
urls), row r of every file belonging to ids[r]. Readers open them with `np.load(mmap_mode="r")`: start-up reads
the files' headers only, a request faults in the pages of the rows it gathers, and every replica on a node maps
the same page-cache pages instead of holding its own copy of the corpus.

The folder is keyed by the tables' identity (real paths, sizes, mtimes, metadata) and the shard, under
$EDJE_TABLE_CACHE or `.edje-cache/` beside the first table (`~/.cache/edje/tables` when that folder is read-only).
Each file is written under a temporary name and renamed when complete, under a lock (one builder per node; the
other replicas wait, then map what it wrote): a crashed build leaves only a temporary file, which no reader opens
and the next build removes. Remote tables (s3://...) are read into RAM by the same two passes (`read_columns`).
`python -m edje.storage.prebuild` builds the folders ahead of serving (storage/prebuild.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edje.schemas.token_table import TableMetadata, blob_matrix, vector_matrix
from edje.storage.shards import shard_of

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the files' layout changes: the key changes with it
CACHE_ENV = "EDJE_TABLE_CACHE"
CACHE_DIR_NAME = ".edje-cache"
VARIABLE = ("url",)  # string columns: offsets + bytes rather than one fixed width
TOKEN_COLUMNS = ("tokens", "token_scales", "image_embedding", "url")  # what a token store serves


@dataclass(frozen=True)
class CacheConfig:
    """Where the mapped files go and how many rows a build pass holds at once."""

    root: Optional[str] = None  # None: $EDJE_TABLE_CACHE, else .edje-cache beside the first table
    batch_rows: int = 65_536


def is_local(paths: Sequence[str]) -> bool:
    """True when every path is a local file (plain or file://): what can be memory-mapped on this node."""
    return bool(paths) and all(fsspec.core.split_protocol(p)[0] in (None, "file", "local") for p in paths)


def local_path(path: str) -> str:
    """The real local path of a plain or file:// path."""
    return os.path.realpath(fsspec.core.split_protocol(path)[1])


# ----------------------------------------------------------------------------------------------- ids
def string_bytes(array: Union[pa.Array, pa.ChunkedArray]) -> Tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1], bytes uint8) of a string or binary column; nulls are empty."""
    arr = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    arr = arr.cast(pa.large_binary())
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(b"", pa.large_binary()))
    if arr.offset:
        arr = pa.concat_arrays([arr])
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1) if n else np.zeros(1, np.int64)
    data = arr.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets - offsets[0], data[offsets[0]:offsets[-1]]


def fixed_width(offsets: np.ndarray, data: np.ndarray, width: Optional[int] = None) -> np.ndarray:
    """Variable-length byte strings as one numpy 'S' array (zero-padded to `width`, default the longest)."""
    lengths = np.diff(offsets)
    width = max(1, int(lengths.max(initial=0)) if width is None else width)
    out = np.zeros((len(lengths), width), np.uint8)
    col = np.arange(width)
    inside = col[None, :] < lengths[:, None]
    out[inside] = data[(offsets[:-1, None] + col[None, :])[inside]]
    if len(lengths) and (out[np.flatnonzero(lengths), lengths[lengths > 0] - 1] == 0).any():
        raise ValueError("image ids may not end in a NUL byte (fixed-width ids would lose it)")
    return out.view(f"S{width}").reshape(len(lengths))


def id_array(ids: Sequence[str]) -> np.ndarray:
    """Python strings as a numpy 'S' array (UTF-8), the form the mapped ids are kept in."""
    return fixed_width(*string_bytes(pa.array(list(ids), pa.string())))


class ImageIds:
    """Sorted unique image ids (fixed-width bytes, memory-mapped or in RAM), then ids appended in RAM (live images).

    A sequence of str (row r's id) and an id -> row lookup by binary search: nothing per id is built at start-up."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.added: List[str] = []
        self.added_row: Dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.base) + len(self.added)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if i < len(self.base):
            return self.base[i].decode()
        return self.added[i - len(self.base)]

    def __iter__(self) -> Iterator[str]:
        for chunk in range(0, len(self.base), 65_536):
            yield from (x.decode() for x in self.base[chunk:chunk + 65_536])
        yield from self.added

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, ImageIds)) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # mutable, compared by value

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each id, -1 where unknown (the first row of an id added twice)."""
        out = np.full(len(ids), -1, np.int64)
        n, width = len(self.base), self.base.dtype.itemsize
        if n and len(ids):
            raw = [x.encode() for x in ids]
            # Longer than the widest stored id, or ending in NUL: a fixed-width cast would alias another id.
            fits = np.array([len(b) <= width and not b.endswith(b"\0") for b in raw])
            query = np.array([b if f else b"" for b, f in zip(raw, fits)], dtype=f"S{width}")
            pos = np.searchsorted(self.base, query)
            safe = np.minimum(pos, n - 1)
            hit = fits & (pos < n) & (self.base[safe] == query)
            out[hit] = safe[hit]
        if self.added_row:
            for j in np.flatnonzero(out < 0):
                out[j] = self.added_row.get(ids[j], -1)
        return out

    def get(self, image_id: str, default: Optional[int] = None) -> Optional[int]:
        """Row of one id, or `default`."""
        r = int(self.rows([image_id])[0])
        return default if r < 0 else r

    def __contains__(self, image_id) -> bool:
        return isinstance(image_id, str) and self.get(image_id) is not None

    def extend(self, ids: Sequence[str]) -> None:
        """Append ids after the last row (an id already known keeps its first row for lookups)."""
        for x in ids:
            self.added_row.setdefault(x, len(self))
            self.added.append(x)

    @property
    def nbytes(self) -> int:
        """Bytes of the fixed-width ids (mapped or in RAM); appended ids come on top."""
        return int(self.base.nbytes)


# -------------------------------------------------------------------------------------------- columns
class RowMatrix:
    """A fixed base matrix (memory-mapped or in RAM) and rows appended after it in RAM; gathered by row number."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.extra = np.empty((0,) + base.shape[1:], base.dtype)
        self.n_extra = 0

    def __len__(self) -> int:
        return len(self.base) + self.n_extra

    @property
    def shape(self) -> tuple:
        return (len(self),) + self.base.shape[1:]

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the valid rows, mapped base included."""
        return int(len(self) * self.base.dtype.itemsize * int(np.prod(self.base.shape[1:], dtype=np.int64)))

    def __getitem__(self, rows) -> np.ndarray:
        """Rows by number (an int array, in request order): a copy in RAM."""
        rows = np.asarray(rows, dtype=np.int64)
        n = len(self.base)
        if not self.n_extra or (rows < n).all():
            return self.base[rows]
        out = np.empty((len(rows),) + self.base.shape[1:], self.base.dtype)
        old = rows < n
        out[old] = self.base[rows[old]]
        out[~old] = self.extra[rows[~old] - n]
        return out

    def append(self, rows: np.ndarray) -> None:
        """Add rows after the last one; the RAM part keeps spare rows and grows by a quarter when full."""
        need = self.n_extra + len(rows)
        if need > len(self.extra):
            grown = np.empty((max(need, self.n_extra + self.n_extra // 4 + 64),) + self.base.shape[1:], self.base.dtype)
            grown[:self.n_extra] = self.extra[:self.n_extra]
            self.extra = grown
        self.extra[self.n_extra:need] = rows
        self.n_extra = need


class StringColumn:
    """Variable-width strings (offsets + bytes, memory-mapped or in RAM) then strings appended in RAM; '' is None."""

    def __init__(self, offsets: np.ndarray, data: np.ndarray):
        self.offsets, self.data = offsets, data
        self.added: List[Optional[str]] = []

    def __len__(self) -> int:
        return len(self.offsets) - 1 + len(self.added)

    def __getitem__(self, i) -> Optional[str]:
        i, n = int(i), len(self.offsets) - 1
        if i < 0:
            i += len(self)
        if i >= n:
            return self.added[i - n]
        start, stop = (int(x) for x in self.offsets[i:i + 2])
        raw = np.asarray(self.data[start:stop]).tobytes()
        return raw.decode() if raw else None

    def extend(self, values: Sequence[Optional[str]]) -> None:
        """Append strings (None where unknown)."""
        self.added.extend(values)


@dataclass
class MappedTables:
    """The sorted unique ids and the columns of some token tables, row-aligned; `folder` None when read into RAM."""

    ids: np.ndarray  # 'S' [N] (memory-mapped from the cache)
    columns: Dict[str, Union[np.ndarray, "RowFile"]]  # name -> [N, ...]; variable columns as name.offsets / .data
    folder: Optional[str] = None
    info: dict = field(default_factory=dict)

    def string_column(self, name: str) -> StringColumn:
        """A variable-width column (urls) as a StringColumn."""
        return StringColumn(self.columns[f"{name}.offsets"], self.columns[f"{name}.data"])


def column_spec(meta: TableMetadata, name: str) -> Tuple[np.dtype, tuple]:
    """dtype and row shape of a fixed-width column of tables with this metadata."""
    codec = meta.codec
    specs = {"tokens": (np.dtype(np.uint8), (codec.blob_bytes,)),
             "token_scales": (np.dtype("<f2"), (codec.num_scales,)),
             "image_embedding": (np.dtype(np.float32), (meta.embed_dim,)),
             "text_embedding": (np.dtype(np.float32), (meta.embed_dim,))}
    if name not in specs:
        raise KeyError(f"no fixed-width column {name!r} in token tables")
    return specs[name]


def column_values(name: str, array: pa.Array, spec: Tuple[np.dtype, tuple]) -> np.ndarray:
    """A batch's column as a numpy matrix of the column's spec (zero-copy where Arrow allows)."""
    dtype, shape = spec
    if name in ("tokens", "token_scales"):
        return blob_matrix(array, shape[0] * dtype.itemsize).view(dtype)
    return vector_matrix(array)


# ------------------------------------------------------------------------------------------------ plan
@dataclass
class Plan:
    """Pass 1 over the tables: the sorted unique ids, where each table row goes (-1: dropped) and string lengths."""

    ids: np.ndarray
    dest: List[np.ndarray]  # per table: output row of each table row
    lengths: Dict[str, np.ndarray] = field(default_factory=dict)  # variable column -> byte length per output row
    duplicates: int = 0


def _open(path: str):
    """A binary file object of any fsspec path."""
    return fsspec.open(path, "rb").open()


def plan_rows(paths: Sequence[str], shard: int = 0, num_shards: int = 1, variable: Sequence[str] = (),
              batch_rows: int = 65_536) -> Plan:
    """Read only the ids (and string lengths) of every table: sort, keep the first row of each id in table order,
    keep only `shard`'s ids; one table's ids in Python at a time."""
    ids, lengths, kept, sizes = [], {v: [] for v in variable}, [], []
    for p in paths:
        with _open(p) as f:
            pf = pq.ParquetFile(f)
            names = ["image_id"] + [v for v in variable if v in pf.schema_arrow.names]
            t_ids, t_len = [], {v: [] for v in variable}
            for batch in pf.iter_batches(batch_size=batch_rows, columns=names):
                t_ids.append(fixed_width(*string_bytes(batch.column(0))))
                for v in variable:
                    t_len[v].append(np.diff(string_bytes(batch.column(v))[0]) if v in names
                                    else np.zeros(batch.num_rows, np.int64))
        t = np.concatenate(t_ids) if t_ids else np.zeros(0, "S1")
        keep = np.ones(len(t), bool) if num_shards <= 1 else np.array(
            [shard_of(x.decode(), num_shards) == shard for x in t], bool)
        sizes.append(len(t))
        kept.append(np.flatnonzero(keep))
        ids.append(t[keep])
        for v in variable:
            lengths[v].append(np.concatenate(t_len[v])[keep] if t_len[v] else np.zeros(0, np.int64))
    every = np.concatenate(ids) if ids else np.zeros(0, "S1")
    order = np.argsort(every, kind="stable")  # ties keep table order: the first table's row of an id wins
    ordered = every[order]
    first = np.ones(len(ordered), bool)
    first[1:] = ordered[1:] != ordered[:-1]
    flat_dest = np.full(len(every), -1, np.int64)
    flat_dest[order[first]] = np.arange(int(first.sum()))
    dest, start = [], 0
    for size, rows in zip(sizes, kept):
        d = np.full(size, -1, np.int64)
        d[rows] = flat_dest[start:start + len(rows)]
        dest.append(d)
        start += len(rows)
    out_len = {}
    for v in variable:
        flat = np.concatenate(lengths[v]) if lengths[v] else np.zeros(0, np.int64)
        out_len[v] = flat[order[first]]
    return Plan(ordered[first], dest, out_len, int(len(every) - first.sum()))


def fill_columns(paths: Sequence[str], plan: Plan, outputs: Dict[str, np.ndarray], specs: Dict[str, tuple],
                 batch_rows: int = 65_536) -> None:
    """Pass 2: read the named columns table by table, batch by batch, and write each kept row at its output row.
    Variable columns write their bytes at `outputs[name + '.offsets']`."""
    names = sorted({n.split(".")[0] for n in outputs})
    for p, dest in zip(paths, plan.dest):
        if not (dest >= 0).any():
            continue
        with _open(p) as f:
            pf = pq.ParquetFile(f)
            present = [n for n in names if n in pf.schema_arrow.names]
            start = 0
            for batch in pf.iter_batches(batch_size=batch_rows, columns=present or ["image_id"]):
                d = dest[start:start + batch.num_rows]
                start += batch.num_rows
                keep = d >= 0
                if not keep.any():
                    continue
                for name in present:
                    if name in VARIABLE:
                        _put_strings(outputs[f"{name}.offsets"], outputs[f"{name}.data"], d, keep,
                                     *string_bytes(batch.column(name)))
                    else:
                        _put_rows(outputs[name], d, keep, column_values(name, batch.column(name), specs[name]))


def _put_rows(out: np.ndarray, d: np.ndarray, keep: np.ndarray, values: np.ndarray) -> None:
    """out[d[keep]] = values[keep], as one slice when the rows are consecutive (tables are sorted by id)."""
    rows = d[keep]
    if keep.all() and rows[-1] - rows[0] == len(rows) - 1 and (len(rows) < 2 or (np.diff(rows) == 1).all()):
        out[rows[0]:rows[-1] + 1] = values
    else:
        out[rows] = values[keep]


def _put_strings(offsets: np.ndarray, data: np.ndarray, d: np.ndarray, keep: np.ndarray, src_off: np.ndarray,
                 src: np.ndarray) -> None:
    """Copy each kept string's bytes to where its output row's offset says."""
    rows, lens = d[keep], np.diff(src_off)[keep]
    if not lens.sum():
        return
    starts = src_off[:-1][keep]
    pick = _ranges(starts, lens)
    data[pick + np.repeat(offsets[rows] - starts, lens)] = src[pick]


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated arange(s, s + n) for every (s, n), vectorised."""
    before = np.cumsum(lens) - lens  # where each range starts in the output
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - before, lens)


def read_columns(paths: Sequence[str], meta: TableMetadata, columns: Sequence[str], shard: int = 0,
                 num_shards: int = 1, batch_rows: int = 65_536) -> MappedTables:
    """The ids and columns of some tables read into RAM (any fsspec path): the same two passes as a cache build."""
    variable = [c for c in columns if c in VARIABLE]
    plan = plan_rows(paths, shard, num_shards, variable, batch_rows)
    specs = {c: column_spec(meta, c) for c in columns if c not in VARIABLE}
    outputs = {c: np.zeros((len(plan.ids),) + s[1], s[0]) for c, s in specs.items()}
    for v in variable:
        outputs[f"{v}.offsets"] = np.concatenate([[0], np.cumsum(plan.lengths[v])]).astype(np.int64)
        outputs[f"{v}.data"] = np.zeros(int(outputs[f"{v}.offsets"][-1]), np.uint8)
    fill_columns(paths, plan, outputs, specs, batch_rows)
    return MappedTables(plan.ids, outputs, None, dict(rows=len(plan.ids), duplicates=plan.duplicates))


# ----------------------------------------------------------------------------------------------- cache
def cache_key(paths: Sequence[str], meta: TableMetadata, shard: int, num_shards: int) -> str:
    """Identity of a corpus: format, shard, each table's real path, size and mtime, and the metadata."""
    files = []
    for p in paths:
        st = os.stat(local_path(p))
        files.append([local_path(p), st.st_size, st.st_mtime_ns])
    text = json.dumps([FORMAT, shard, num_shards, files, meta.to_bytes().decode()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_root(paths: Sequence[str], config: CacheConfig) -> str:
    """$EDJE_TABLE_CACHE, else .edje-cache beside the first table, else ~/.cache/edje/tables (read-only tables)."""
    root = config.root or os.environ.get(CACHE_ENV)
    if root:
        return root
    beside = os.path.join(os.path.dirname(local_path(paths[0])), CACHE_DIR_NAME)
    try:
        os.makedirs(beside, exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside
    except OSError:
        pass
    return os.path.join(os.path.expanduser("~"), ".cache", "edje", "tables")


@contextlib.contextmanager
def locked(folder: str) -> Iterator[None]:
    """An exclusive lock on a cache folder, across the processes of a node (released if the holder dies)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def map_file(path: str) -> np.ndarray:
    """A .npy file memory-mapped read-only, with random-access advice (a binary search reads its pages, not their
    neighbours); ValueError when the file is shorter than its header says."""
    arr = np.load(path, mmap_mode="r")
    raw = getattr(arr, "_mmap", None)
    if raw is not None and hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    return np.asarray(arr) if isinstance(arr, np.memmap) else arr


class RowFile:
    """Rows of a .npy matrix read on demand with pread: the page cache holds the file once for every process of
    the node, and a gather copies only its rows into the process.

    Why not index a memory mapping: on this kernel (6.18, ext4 with large folios) each fault on a cached file maps
    the whole folio, ~0.6 MB per random row measured, so a replica's RSS would grow with its traffic towards the
    file's size; a pread of the same page-cache pages maps nothing."""

    def __init__(self, path: str):
        self.path = path
        self.file = open(path, "rb", buffering=0)
        version = np.lib.format.read_magic(self.file)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(self.file)
        if fortran:
            raise ValueError(f"{path}: Fortran-ordered arrays are not row files")
        self.shape, self.dtype, self.offset = tuple(shape), np.dtype(dtype), self.file.tell()
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        size = os.fstat(self.file.fileno()).st_size
        if size < self.offset + self.shape[0] * self.row_bytes:
            raise ValueError(f"{path} is shorter ({size:,} B) than its header says: an incomplete file")

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    def __getitem__(self, key):
        """Rows by int, slice (one read) or int array (one read per run of consecutive rows), as numpy arrays."""
        n = self.shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self._runs(np.array([start]), np.array([max(start, stop)]))
            key = np.arange(start, stop, step)
        if np.ndim(key) == 0:
            return self[np.array([key])][0]
        rows = np.asarray(key, dtype=np.int64)
        rows = np.where(rows < 0, rows + n, rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"row out of range for {self.path} ({n} rows)")
        unique, back = np.unique(rows, return_inverse=True)
        cut = np.flatnonzero(np.diff(unique) != 1) + 1
        starts = np.concatenate([unique[:1], unique[cut]])
        stops = np.concatenate([unique[cut - 1] + 1, unique[-1:] + 1]) if len(unique) else starts
        return self._runs(starts, stops)[back]

    def _runs(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Rows starts[i]..stops[i]-1 of every run, concatenated."""
        total = int((stops - starts).sum())
        out = np.empty((total,) + self.shape[1:], self.dtype)
        raw = out.reshape(total, -1).view(np.uint8) if total else out
        fd, at = self.file.fileno(), 0
        for a, b in zip(starts.tolist(), stops.tolist()):
            want = (b - a) * self.row_bytes
            got = os.preadv(fd, [memoryview(raw[at:at + b - a]).cast("B")], self.offset + a * self.row_bytes)
            if got != want:
                raise OSError(f"{self.path}: short read ({got} of {want} B at row {a})")
            at += b - a
        return out

    def close(self) -> None:
        self.file.close()


def _file_names(columns: Sequence[str]) -> List[str]:
    """The files of some columns."""
    return [n for c in columns for n in ((f"{c}.offsets", f"{c}.data") if c in VARIABLE else (c,))]


def _try_open(folder: str, columns: Sequence[str]) -> Optional[MappedTables]:
    """The mapped ids and columns when every file is there and complete, else None."""
    try:
        ids = map_file(os.path.join(folder, "ids.npy"))
        mapped = {n: RowFile(os.path.join(folder, f"{n}.npy")) for n in _file_names(columns)}
    except (FileNotFoundError, ValueError, OSError):
        return None
    for n, arr in mapped.items():
        want = len(ids) + 1 if n.endswith(".offsets") else (None if n.endswith(".data") else len(ids))
        if want is not None and len(arr) != want:
            return None
    for c in columns:
        if c in VARIABLE and len(mapped[f"{c}.data"]) != int(mapped[f"{c}.offsets"][-1]):
            return None
    info = {}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(folder, "manifest.json")) as f:
            info = json.load(f)
    return MappedTables(ids, mapped, folder, info)


def open_tables(paths: Sequence[str], meta: TableMetadata, columns: Sequence[str], shard: int = 0,
                num_shards: int = 1, config: CacheConfig = CacheConfig()) -> MappedTables:
    """Memory-mapped ids and columns of local tables, built into the cache first where a file is missing."""
    folder = os.path.join(cache_root(paths, config), cache_key(paths, meta, shard, num_shards))
    got = _try_open(folder, columns)
    if got is not None:
        return got
    with locked(folder):
        got = _try_open(folder, columns)  # another process may have built it while this one waited
        if got is None:
            build(folder, paths, meta, columns, shard, num_shards, config.batch_rows)
            got = _try_open(folder, columns)
    if got is None:
        raise RuntimeError(f"table cache {folder} is incomplete right after building it")
    return got


def build(folder: str, paths: Sequence[str], meta: TableMetadata, columns: Sequence[str], shard: int,
          num_shards: int, batch_rows: int = 65_536) -> None:
    """Write the files of `columns` that are missing or incomplete (the caller holds the folder's lock)."""
    started = time.time()
    for name in os.listdir(folder):  # left by a build that died: nobody else builds while the lock is held
        if ".tmp-" in name:
            os.remove(os.path.join(folder, name))
    variable = [c for c in columns if c in VARIABLE]
    plan = plan_rows(paths, shard, num_shards, variable, batch_rows)
    n = len(plan.ids)
    ids_path = os.path.join(folder, "ids.npy")
    if _try_open(folder, []) is None or len(map_file(ids_path)) != n:
        _commit(ids_path, lambda f: np.save(f, plan.ids))
    missing = [c for c in columns if _try_open(folder, [c]) is None]
    specs = {c: column_spec(meta, c) for c in missing if c not in VARIABLE}
    outputs: Dict[str, np.ndarray] = {}
    tmp: Dict[str, str] = {}
    for c, (dtype, shape) in specs.items():
        tmp[c] = os.path.join(folder, f"{c}.npy.tmp-{os.getpid()}")
        outputs[c] = np.lib.format.open_memmap(tmp[c], mode="w+", dtype=dtype, shape=(n,) + shape)
    for v in (c for c in missing if c in VARIABLE):
        offsets = np.concatenate([[0], np.cumsum(plan.lengths[v])]).astype(np.int64)
        for part, shape, dtype in (("offsets", offsets.shape, np.int64), ("data", (int(offsets[-1]),), np.uint8)):
            name = f"{v}.{part}"
            tmp[name] = os.path.join(folder, f"{name}.npy.tmp-{os.getpid()}")
            outputs[name] = np.lib.format.open_memmap(tmp[name], mode="w+", dtype=dtype, shape=shape)
        outputs[f"{v}.offsets"][:] = offsets
    if outputs:
        fill_columns(paths, plan, outputs, specs, batch_rows)
    for arr in outputs.values():
        arr.flush()
    outputs.clear()  # unmaps the writable views: readers map the renamed files afresh
    for name, path in tmp.items():  # complete: now, and only now, under the name readers open
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(path, os.path.join(folder, f"{name}.npy"))
    info = dict(format=FORMAT, rows=n, duplicates=plan.duplicates, shard=shard, num_shards=num_shards,
                tables=[local_path(p) for p in paths], built=sorted(tmp), build_s=round(time.time() - started, 1))
    _commit(os.path.join(folder, "manifest.json"), lambda f: f.write(json.dumps(info, indent=1).encode()))
    if plan.duplicates:
        log.warning("table cache: %d duplicate image ids across %d tables kept once", plan.duplicates, len(paths))
    log.info("table cache: %s built in %.1f s (%d rows)", sorted(tmp), time.time() - started, n)


def _commit(path: str, write: Callable) -> None:
    """Write a file under a temporary name, sync it, then rename it into place."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
