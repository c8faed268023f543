"""The live log: token rows of added images in an append log, compacted into Parquet parts of bounded size.

A live folder (``live_dir``; one per shard) holds:

- ``LOG``: the open segment. A header (magic ``EDJELOG1``, the Arrow schema of the served token tables with
  their EDJE metadata, the segment's first sequence number), then one record per add: u32 payload length,
  u32 crc32 of (sequence number + payload), u64 sequence number, the rows as one Arrow IPC record batch,
  padded to 8 bytes. Appended under an exclusive ``flock`` on ``LOCK`` and fsync'd before the add answers.
- ``wal/<first seq>.wal``: sealed segments: LOG as it was when a compaction began (hard-linked, then a fresh
  LOG with only a header replaces it, so LOG never disappears).
- ``parts/<first>-<last>.parquet``: compacted rows, at most ``part_rows`` rows and about ``part_bytes`` each,
  written by ``write_token_table`` like any token table (same schema and metadata as the served tables).
- ``MANIFEST``: JSON naming the parts and ``through``, the last sequence number they hold; replaced
  atomically. It is the commit point of a compaction: a part it does not name is not read (and is removed
  by the next compaction), a record numbered at or below ``through`` is skipped (its row is in a part).

Compaction (``LiveLog.compact``): seal LOG; write each new part to a temp name, fsync, rename, fsync the
folder; write MANIFEST (temp, fsync, rename, fsync); only then drop the sealed segments and a small part it
merged. A process that dies at any step loses nothing and counts nothing twice: before MANIFEST the
segments still hold every row, after it ``through`` hides their records. A record cut short at the end of
LOG (a writer that died mid-append) is skipped by readers and cut off, with a warning, by the next process
that opens the folder or appends to it. Legacy folders (a text ``LOG`` naming one Parquet table per image
under ``tables/``) are folded into the log on first open.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import struct
import zlib
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from edje.schemas.token_table import METADATA_KEY, TableMetadata, read_token_tables, table_schema, write_token_table

log = logging.getLogger("ray.serve")

LOG_NAME, LOCK_NAME, COMPACT_LOCK_NAME, MANIFEST_NAME = "LOG", "LOCK", "COMPACT.lock", "MANIFEST"
WAL_DIR, PARTS_DIR = "wal", "parts"
LEGACY_LOG, LEGACY_TABLES = "LOG.v1", "tables"  # the one-table-per-image layout this log replaces
MAGIC = b"EDJELOG1"
HEAD = struct.Struct("<8sIIQ")  # magic, schema length, crc32 of the schema, first sequence number
REC = struct.Struct("<IIQ")  # payload length, crc32 of (sequence number + payload), sequence number
# Names the step a compaction dies at (os._exit(CRASH_EXIT)); set only by tests/test_live_log.py.
CRASH_ENV, CRASH_EXIT = "EDJE_LIVE_LOG_CRASH_AT", 86
CRASH_STEPS = ("linked", "rotated", "part_tmp", "part_renamed", "manifest_written", "segment_dropped",
               "legacy_appended")


class LiveLogCorrupt(RuntimeError):
    """Bytes of the live log that no crash can leave (a bad header, a bad record followed by good ones)."""


@dataclass(frozen=True)
class LiveLogConfig:
    """Part sizes and when an adding replica compacts."""

    part_rows: int = 10_000  # rows per Parquet part at most
    part_bytes: int = 64 << 20  # Arrow bytes per part at most (the Parquet file is smaller: zstd)
    compact_rows: int = 10_000  # LOG holding this many rows ...
    compact_bytes: int = 64 << 20  # ... or this many bytes is compacted by the replica that appended last
    background: bool = True  # compact in a thread (an add never waits for a part to be written)


@dataclass
class PartInfo:
    """One compacted part as MANIFEST names it."""

    name: str
    first: int  # lowest and highest sequence number of the records whose rows it holds
    last: int
    rows: int
    bytes: int


@dataclass
class Manifest:
    """The committed parts and the last sequence number they hold."""

    through: int = 0
    parts: List[PartInfo] = field(default_factory=list)


@dataclass
class Cursor:
    """How far one reader has read: the sequence number, and where in LOG (which file, which byte)."""

    seq: int = 0
    log_ino: int = 0  # 0: LOG not read yet
    log_off: int = 0  # bytes of LOG read (header and whole records)
    log_rows: int = 0  # rows in LOG up to log_off (what triggers a compaction)
    manifest: tuple = (0, 0, 0)  # (inode, size, mtime_ns) of MANIFEST when last read
    schema: Optional[pa.Schema] = None


def _crash_point(step: str) -> None:
    """Die here when the test names this step (no cleanup: what a kill -9 leaves)."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(CRASH_EXIT)


def _pad8(n: int) -> int:
    """n rounded up to a multiple of 8 (records and batches stay 8-byte aligned for Arrow)."""
    return (n + 7) & ~7


def _sig(path: str) -> tuple:
    """(inode, size, mtime_ns) of a file, zeros when absent."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _fsync_dir(path: str) -> None:
    """Make a rename or unlink in a folder durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    """Make a file's bytes durable (a part written by write_token_table, before its rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    """Write a whole file under its final name: temp file, fsync, rename, fsync the folder."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def segment_header(schema: pa.Schema, first_seq: int) -> bytes:
    """The bytes a segment starts with."""
    raw = schema.serialize().to_pybytes()
    return HEAD.pack(MAGIC, len(raw), zlib.crc32(raw), first_seq) + raw + b"\0" * (_pad8(len(raw)) - len(raw))


def parse_header(data: memoryview, where: str) -> Tuple[pa.Schema, int, int]:
    """(schema, first sequence number, offset of the first record) of a segment's bytes."""
    if len(data) < HEAD.size or bytes(data[:8]) != MAGIC:
        raise LiveLogCorrupt(f"{where}: not a live log segment (no {MAGIC.decode()} header)")
    _, n, crc, first = HEAD.unpack_from(data, 0)
    raw = data[HEAD.size:HEAD.size + n]
    if len(raw) < n or zlib.crc32(raw) != crc:  # headers are written whole (temp + rename): never torn
        raise LiveLogCorrupt(f"{where}: damaged segment header")
    return pa.ipc.read_schema(pa.py_buffer(bytes(raw))), first, HEAD.size + _pad8(n)


def record(seq: int, batch: pa.RecordBatch) -> bytes:
    """One log record holding a batch of rows."""
    payload = batch.serialize().to_pybytes()
    seq_bytes = struct.pack("<Q", seq)
    head = REC.pack(len(payload), zlib.crc32(payload, zlib.crc32(seq_bytes)), seq)
    return head + payload + b"\0" * (_pad8(len(payload)) - len(payload))


def scan(data: memoryview, start: int, where: str) -> Tuple[List[Tuple[int, int, int]], int, str]:
    """Whole records from byte `start`: [(seq, payload start, payload end)], the offset after the last one, and
    why the bytes after it are no record ('' when there are none: a write in progress or a torn one)."""
    out, pos, n = [], start, len(data)
    while pos < n:
        if n - pos < REC.size:
            return out, pos, f"{n - pos} bytes of a record header"
        length, crc, seq = REC.unpack_from(data, pos)
        body = pos + REC.size
        end = body + _pad8(length)
        if end > n:  # a garbage length lands here too: past the end
            return out, pos, f"a record of {length} bytes cut at {n - body}"
        if zlib.crc32(data[pos + 8:body + length]) != crc:
            if bytes(data[pos:]).count(0) == n - pos:
                return out, pos, f"{n - pos} zero bytes (a size written before its data)"
            if end == n:
                return out, pos, "a last record whose checksum does not match"
            raise LiveLogCorrupt(f"{where}: record at byte {pos} fails its checksum and records follow it")
        out.append((seq, body, body + length))
        pos = end
    return out, pos, ""


def decode(data: memoryview, recs: Sequence[Tuple[int, int, int]], schema: pa.Schema, after: int
           ) -> Tuple[List[Tuple[int, pa.RecordBatch]], int]:
    """(seq, batch) of the records numbered above `after` (each number once), and the last number seen."""
    out = []
    for seq, a, b in recs:
        if seq > after:
            out.append((seq, pa.ipc.read_record_batch(pa.py_buffer(data[a:b]), schema)))
            after = seq
    return out, after


def read_manifest(path: str) -> Tuple[Manifest, tuple]:
    """MANIFEST and its signature (empty when there is none)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = json.loads(f.read())
    except FileNotFoundError:
        return Manifest(), (0, 0, 0)
    parts = [PartInfo(**p) for p in raw["parts"]]
    return Manifest(raw["through"], parts), (st.st_ino, st.st_size, st.st_mtime_ns)


class _FileLock:
    """flock on a file: exclusive or shared, blocking or not (`acquired` says)."""

    def __init__(self, path: str, exclusive: bool = True, blocking: bool = True):
        self.path, self.mode = path, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        self.acquired = False

    def __enter__(self):
        self.f = open(self.path, "a")
        try:
            fcntl.flock(self.f.fileno(), self.mode)
            self.acquired = True
        except BlockingIOError:
            pass
        return self

    def __exit__(self, *exc):
        if self.acquired:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
        self.f.close()


@dataclass
class _Opened:
    """Files a catch-up reads, opened under the shared lock (open files outlive an unlink)."""

    manifest: Manifest
    manifest_sig: tuple
    parts: List[Tuple[PartInfo, object]]
    segments: List[Tuple[str, object]]
    log: Optional[object]

    def close(self) -> None:
        for f in [f for _, f in self.parts] + [f for _, f in self.segments] + [self.log]:
            if f is not None:
                f.close()


class LiveLog:
    """One reader (and writer) of a live folder: `poll` returns the rows committed since its last poll."""

    def __init__(self, live_dir: str, config: Optional[LiveLogConfig] = None, expected: Optional[dict] = None,
                 recover: bool = True):
        self.dir = os.path.abspath(live_dir)
        self.config = config or LiveLogConfig()
        self.expected = dict(expected or {})  # TableMetadata fields the rows must have (the served tables')
        self.path = os.path.join(self.dir, LOG_NAME)
        self.lock_path = os.path.join(self.dir, LOCK_NAME)
        self.manifest_path = os.path.join(self.dir, MANIFEST_NAME)
        self.wal_dir, self.parts_dir = os.path.join(self.dir, WAL_DIR), os.path.join(self.dir, PARTS_DIR)
        os.makedirs(self.dir, exist_ok=True)
        open(self.lock_path, "a").close()
        self.cursor = Cursor()
        self.repairs: List[str] = []  # torn tails this object cut off (each also logged as a warning)
        if recover and self._legacy_pending():
            with self.locked():
                self._migrate_legacy()

    # -- reading --------------------------------------------------------------------------------------

    def changed(self) -> bool:
        """Whether anything was committed (or compacted) since the last poll: two stats."""
        ino, size, _ = _sig(self.path)
        return (ino, size) != (self.cursor.log_ino, self.cursor.log_off) or _sig(self.manifest_path) != self.cursor.manifest

    def poll(self) -> Optional[pa.Table]:
        """Rows committed since the last poll, oldest first, or None. Right after a compaction, rows this reader
        already had may come again (the part that holds them): skip ids you know. The first poll (start-up)
        also cuts off a torn LOG tail, with a warning."""
        if not self.changed():
            return None
        return self._poll(locked=False, repair=not self.cursor.log_ino)

    def poll_locked(self) -> Optional[pa.Table]:
        """`poll` for a caller holding `locked()` (a writer, before its duplicate check and its append)."""
        if not self.changed():
            return None
        return self._poll(locked=True, repair=True)

    def _poll(self, locked: bool, repair: bool) -> Optional[pa.Table]:
        if self.cursor.log_ino and _sig(self.manifest_path) == self.cursor.manifest:
            got = self._tail(locked, repair)
            if got is not False:
                return got
        return self._catch_up(locked, repair)

    def _tail(self, locked: bool, repair: bool):
        """New records of the LOG this reader is in (no lock: appends are whole records); False when LOG was replaced."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return False
        with f:
            if os.fstat(f.fileno()).st_ino != self.cursor.log_ino:
                return False
            f.seek(self.cursor.log_off)
            data = memoryview(f.read())
        return self._table(self._read_log_bytes(data, 0, self.cursor.log_off, locked, repair))

    def _read_log_bytes(self, data: memoryview, start: int, base: int, locked: bool, repair: bool
                        ) -> List[pa.RecordBatch]:
        """Decode LOG's records in `data` (byte 0 of it is byte `base` of LOG) and move the cursor past them."""
        recs, end, torn = scan(data, start, self.path)
        got, self.cursor.seq = decode(data, recs, self.cursor.schema, self.cursor.seq)
        self.cursor.log_off = base + end
        self.cursor.log_rows += sum(b.num_rows for _, b in got)
        if torn and repair:
            self._cut_torn_tail(self.cursor.log_ino, self.cursor.log_off, torn, locked)
        return [b for _, b in got]

    def _cut_torn_tail(self, ino: int, end: int, why: str, locked: bool) -> None:
        """Under the exclusive lock no append is in flight: bytes after LOG's last whole record are a torn write."""
        with (_nolock() if locked else self.locked()):
            with open(self.path, "r+b") as f:
                if os.fstat(f.fileno()).st_ino != ino:
                    return  # replaced meanwhile: whoever sealed it cut it
                f.seek(end)
                rest = memoryview(f.read())
                if not rest or scan(rest, 0, self.path)[0]:
                    return  # a write in flight when this reader looked, finished since
                msg = f"live log {self.path}: ignoring {len(rest)} bytes after byte {end} ({why}): a write cut short"
                log.warning(msg)
                self.repairs.append(msg)
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def _open_all(self) -> _Opened:
        """Open what a catch-up reads; call under the lock (shared is enough: compactions commit under exclusive)."""
        manifest, sig = read_manifest(self.manifest_path)
        parts = [(p, open(os.path.join(self.parts_dir, p.name), "rb")) for p in manifest.parts if p.last > self.cursor.seq]
        segments = [(p, open(p, "rb")) for p in self._segments()]
        try:
            log_f = open(self.path, "rb")
        except FileNotFoundError:
            log_f = None
        return _Opened(manifest, sig, parts, segments, log_f)

    def _segments(self) -> List[str]:
        """Sealed segments, oldest first."""
        if not os.path.isdir(self.wal_dir):
            return []
        return [os.path.join(self.wal_dir, n) for n in sorted(os.listdir(self.wal_dir)) if n.endswith(".wal")]

    def _catch_up(self, locked: bool, repair: bool) -> Optional[pa.Table]:
        """Parts, sealed segments and LOG after this reader's sequence number (start-up, after a compaction)."""
        if locked:
            opened = self._open_all()
        else:
            with _FileLock(self.lock_path, exclusive=False):
                opened = self._open_all()
        try:
            pieces = [self._read_part(p, f) for p, f in opened.parts]
            self.cursor.seq = max(self.cursor.seq, opened.manifest.through)
            batches = []
            for path, f in opened.segments:
                batches += [b for _, b in self._read_segment(path, f)]
            if opened.log is not None:
                batches += self._read_log(opened.log, locked, repair)
            self.cursor.manifest = opened.manifest_sig
        finally:
            opened.close()
        return self._table(pieces + ([pa.Table.from_batches(batches)] if batches else []))

    def _read_part(self, part: PartInfo, f) -> pa.Table:
        """A committed part, checked against the expected metadata, in the log's schema."""
        table = pq.read_table(f)
        self._adopt(table.schema, os.path.join(self.parts_dir, part.name))
        return table.cast(self.cursor.schema)

    def _read_segment(self, path: str, f) -> List[Tuple[int, pa.RecordBatch]]:
        """Records of a sealed segment numbered above the cursor (from where this reader stopped, if it was its LOG)."""
        if os.fstat(f.fileno()).st_ino == self.cursor.log_ino and self.cursor.schema is not None:
            f.seek(self.cursor.log_off)
            data, start = memoryview(f.read()), 0
        else:
            data = memoryview(f.read())
            schema, _, start = parse_header(data, path)
            self._adopt(schema, path)
        recs, _, torn = scan(data, start, path)
        if torn:  # sealed after a repair: only a torn write after an interrupted rotation ends up here
            log.warning("live log %s: ignoring a torn tail (%s)", path, torn)
        got, self.cursor.seq = decode(data, recs, self.cursor.schema, self.cursor.seq)
        return got

    def _read_log(self, f, locked: bool, repair: bool) -> List[pa.RecordBatch]:
        """Records of LOG: from where this reader stopped when it is the same file, else from its header."""
        ino = os.fstat(f.fileno()).st_ino
        if ino == self.cursor.log_ino:
            f.seek(self.cursor.log_off)
            return self._read_log_bytes(memoryview(f.read()), 0, self.cursor.log_off, locked, repair)
        data = memoryview(f.read())
        schema, _, start = parse_header(data, self.path)
        self._adopt(schema, self.path)
        self.cursor.log_ino, self.cursor.log_rows = ino, 0
        return self._read_log_bytes(data, start, 0, locked, repair)

    def _adopt(self, schema: pa.Schema, where: str) -> None:
        """Check a segment's or part's schema against the expected metadata and against the rest of the log."""
        raw = (schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            raise LiveLogCorrupt(f"{where}: no EDJE table metadata")
        meta = TableMetadata.from_bytes(raw)
        meta.check(where, **self.expected)
        if self.cursor.schema is None:
            # The canonical schema of these rows (a Parquet round trip renames list children).
            self.cursor.schema = table_schema(meta, with_text=False)
        if not _same_layout(schema, self.cursor.schema):
            raise LiveLogCorrupt(f"{where}: rows of another table layout than the rest of the live log")

    @staticmethod
    def _table(pieces: List) -> Optional[pa.Table]:
        """One table of batches or tables (chunked: each consumer combines only the columns it reads), None when empty."""
        if pieces and isinstance(pieces[0], pa.RecordBatch):
            pieces = [pa.Table.from_batches(pieces)]
        if not pieces:
            return None
        table = pa.concat_tables(pieces)
        return table if table.num_rows else None

    # -- writing --------------------------------------------------------------------------------------

    def locked(self) -> _FileLock:
        """The exclusive lock over appends, rotations and commits, across processes (flock on LOCK)."""
        return _FileLock(self.lock_path)

    def append(self, table: pa.Table) -> int:
        """Append a table's rows as one record and fsync it; returns its sequence number. Call under `locked()`
        after `poll_locked()`: the record must follow every record there is."""
        if table.num_rows == 0:
            raise ValueError("nothing to append")
        if self.cursor.schema is None:
            self._adopt(table.schema, "the appended rows")
        elif not _same_layout(table.schema, self.cursor.schema):
            raise ValueError("rows of another table layout than the live log's")
        ino, size, _ = _sig(self.path)
        if not ino and not self.cursor.log_ino:
            self._create_log(self.cursor.seq + 1)
            ino, size, _ = _sig(self.path)
        if (ino, size) != (self.cursor.log_ino, self.cursor.log_off) or _sig(self.manifest_path) != self.cursor.manifest:
            raise RuntimeError("the live log moved since this reader's last poll: poll_locked() under the lock first")
        seq = self.cursor.seq + 1
        data = record(seq, table.combine_chunks().to_batches()[0])  # a batch holds no names: no cast needed
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(f"short write to {self.path}")  # a torn tail: the next writer cuts it off
            os.fdatasync(fd)  # an add answers only once its record is on disk
        finally:
            os.close(fd)
        self.cursor.seq, self.cursor.log_off = seq, self.cursor.log_off + len(data)
        self.cursor.log_rows += table.num_rows
        return seq

    def _create_log(self, first_seq: int) -> None:
        """A LOG with only its header, under its final name at once (the first append to a folder)."""
        _write_atomic(self.path, segment_header(self.cursor.schema, first_seq))
        ino, size, _ = _sig(self.path)
        self.cursor.log_ino, self.cursor.log_off, self.cursor.log_rows = ino, size, 0

    def wants_compaction(self) -> bool:
        """Whether LOG, as this reader last saw it, holds enough to compact."""
        return self.cursor.log_rows >= self.config.compact_rows or self.cursor.log_off >= self.config.compact_bytes

    # -- compaction -----------------------------------------------------------------------------------

    def compact(self) -> Optional[dict]:
        """Fold LOG into parts (the module docstring); None when another process is compacting this folder.
        Never call it holding `locked()`."""
        with _FileLock(os.path.join(self.dir, COMPACT_LOCK_NAME), blocking=False) as lock:
            if not lock.acquired:
                return None
            self._rotate()
            return self._fold()

    def _rotate(self) -> None:
        """Seal LOG as wal/<first seq>.wal and start a fresh LOG, under the exclusive lock (appends wait)."""
        with self.locked():
            try:
                with open(self.path, "rb") as f:
                    ino, data = os.fstat(f.fileno()).st_ino, memoryview(f.read())
            except FileNotFoundError:
                return
            schema, first, start = parse_header(data, self.path)
            recs, end, torn = scan(data, start, self.path)
            if torn:
                self._cut_torn_tail(ino, end, torn, locked=True)
            if not recs:
                return
            os.makedirs(self.wal_dir, exist_ok=True)
            sealed = os.path.join(self.wal_dir, f"{first:016d}.wal")
            if not (os.path.exists(sealed) and os.path.samefile(sealed, self.path)):  # else: a rotation cut short
                os.link(self.path, sealed)
                _fsync_dir(self.wal_dir)
            _crash_point("linked")
            _write_atomic(self.path, segment_header(schema, recs[-1][0] + 1))
            _crash_point("rotated")

    def _fold(self) -> Optional[dict]:
        """Sealed segments (and a small last part) -> new parts; commit MANIFEST; drop what it made redundant."""
        manifest, _ = read_manifest(self.manifest_path)
        self._drop_orphans(manifest)
        segments = self._segments()
        reader = LiveLog(self.dir, self.config, self.expected, recover=False)
        reader.cursor.seq = manifest.through
        got = []
        for path in segments:
            with open(path, "rb") as f:
                got += reader._read_segment(path, f)
        if not got:
            self._commit(manifest, None, segments, [])
            return None
        new = pa.Table.from_batches([b for _, b in got])
        lo = [seq for seq, b in got for _ in range(b.num_rows)]
        hi = list(lo)
        merged = self._mergeable(manifest, new)
        if merged is not None:
            with open(os.path.join(self.parts_dir, merged.name), "rb") as f:
                old = reader._read_part(merged, f)
            new = pa.concat_tables([old, new])
            lo, hi = [merged.first] * old.num_rows + lo, [merged.last] * old.num_rows + hi
        new, lo, hi = _first_of_each_id(new, lo, hi)
        if merged is not None and new.num_rows == merged.rows:
            merged, parts = None, []  # every new row repeated an id of that part: nothing to write
        else:
            parts = self._write_parts(new, lo, hi)
        kept = [p for p in manifest.parts if merged is None or p.name != merged.name]
        committed = Manifest(reader.cursor.seq, kept + parts)
        self._commit(manifest, committed, segments, [merged] if merged else [])
        return dict(parts=[asdict(p) for p in parts], merged=merged.name if merged else None,
                    segments=len(segments), rows=new.num_rows, through=committed.through)

    def _mergeable(self, manifest: Manifest, new: pa.Table) -> Optional[PartInfo]:
        """The last part when it is small enough to take new rows (parts stay near their bound)."""
        if not manifest.parts:
            return None
        last = manifest.parts[-1]
        return last if last.rows < self._rows_per_part(new) else None

    def _rows_per_part(self, table: pa.Table) -> int:
        """Rows per part under both bounds (rows; bytes at this table's Arrow bytes per row)."""
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        return max(1, min(self.config.part_rows, self.config.part_bytes // per_row))

    def _write_parts(self, table: pa.Table, lo: List[int], hi: List[int]) -> List[PartInfo]:
        """Bounded parts of `table`, each durable under its final name (not yet committed)."""
        os.makedirs(self.parts_dir, exist_ok=True)
        step, out = self._rows_per_part(table), []
        for i in range(0, table.num_rows, step):
            chunk = table.slice(i, step)
            first, last = min(lo[i:i + step]), max(hi[i:i + step])
            name = f"{first:016d}-{last:016d}.parquet"
            tmp = os.path.join(self.parts_dir, f".{name}.tmp")
            nbytes = write_token_table(chunk, tmp)
            _crash_point("part_tmp")
            _fsync_file(tmp)
            os.replace(tmp, os.path.join(self.parts_dir, name))
            _crash_point("part_renamed")
            out.append(PartInfo(name, first, last, chunk.num_rows, nbytes))
        _fsync_dir(self.parts_dir)
        return out

    def _commit(self, old: Manifest, new: Optional[Manifest], segments: Sequence[str],
                replaced: Sequence[PartInfo]) -> None:
        """Write MANIFEST (the commit), then drop the segments and the part it made redundant."""
        with self.locked():  # readers open their files under the shared lock: never half a compaction
            if new is not None:
                raw = json.dumps(dict(through=new.through, parts=[asdict(p) for p in new.parts]), indent=1)
                _write_atomic(self.manifest_path, raw.encode())
                _crash_point("manifest_written")
            for path in segments:
                os.unlink(path)
                _crash_point("segment_dropped")
            for part in replaced:
                os.unlink(os.path.join(self.parts_dir, part.name))
            for d in (self.wal_dir, self.parts_dir):
                if os.path.isdir(d):
                    _fsync_dir(d)

    def _drop_orphans(self, manifest: Manifest) -> None:
        """Remove parts MANIFEST does not name: the temp and renamed parts of a compaction that died before its
        commit (their rows are still in the segments). Call holding the compaction lock."""
        if not os.path.isdir(self.parts_dir):
            return
        named = {p.name for p in manifest.parts}
        for n in os.listdir(self.parts_dir):
            if n not in named:
                os.unlink(os.path.join(self.parts_dir, n))

    # -- the one-table-per-image layout ---------------------------------------------------------------

    def _legacy_pending(self) -> bool:
        """A text LOG of the one-table-per-image layout, or a move into the log that has not finished."""
        if os.path.exists(os.path.join(self.dir, LEGACY_LOG)):
            return True
        try:
            with open(self.path, "rb") as f:
                return f.read(len(MAGIC)) != MAGIC
        except FileNotFoundError:
            return False

    def _migrate_legacy(self) -> None:
        """Append the legacy tables' rows the log lacks, then drop LOG.v1 and the tables (idempotent); under the lock."""
        legacy = os.path.join(self.dir, LEGACY_LOG)
        try:
            with open(self.path, "rb") as f:
                is_text = f.read(len(MAGIC)) != MAGIC
            if is_text:
                os.replace(self.path, legacy)  # LOG is the new log's name from here on
                _fsync_dir(self.dir)
        except FileNotFoundError:
            pass
        if not os.path.exists(legacy):
            return
        with open(legacy) as f:
            names = [line.split("\t")[0] for line in f.read().split("\n") if line]
        tables = os.path.join(self.dir, LEGACY_TABLES)
        paths = [os.path.join(tables, n) for n in names]
        if paths:
            writer = LiveLog(self.dir, self.config, self.expected, recover=False)
            have = writer._poll(locked=True, repair=True)
            known = set(have.column("image_id").to_pylist()) if have is not None else set()
            table, _ = read_token_tables(paths)
            table, _, _ = _first_of_each_id(table, [0] * table.num_rows, [0] * table.num_rows, known)
            for i in range(0, table.num_rows, 1000):
                writer.append(table.slice(i, 1000))
            log.warning("live log %s: %d images of the one-table-per-image layout moved into the log",
                        self.dir, table.num_rows)
        _crash_point("legacy_appended")
        os.unlink(legacy)
        _fsync_dir(self.dir)
        for p in paths + ([os.path.join(tables, n) for n in os.listdir(tables)] if os.path.isdir(tables) else []):
            if os.path.exists(p) and (p in paths or p.endswith(".tmp")):
                os.unlink(p)
        if os.path.isdir(tables) and not os.listdir(tables):
            os.rmdir(tables)

    # -- the first stage's interface (serving/first_stage.py): size() and read() -----------------------

    def size(self) -> int:
        """A number that changes whenever the log does, equal to what `read` last returned while nothing changed."""
        ino, size, _ = _sig(self.path)
        return hash((ino, size, _sig(self.manifest_path)))

    def read(self, offset: int = 0) -> Tuple[List[pa.Table], int]:
        """([rows committed since this object's last read] or [], `size()` as of that read). `offset` is
        ignored: the object keeps its own place (its cursor)."""
        table = self.poll()
        c = self.cursor
        return ([table] if table is not None else []), hash((c.log_ino, c.log_off, c.manifest))

    def files(self) -> dict:
        """How many files of each kind the live log has (benchmarks, reports)."""
        return dict(log=int(os.path.exists(self.path)), segments=len(self._segments()),
                    parts=_count(self.parts_dir, ".parquet"), manifest=int(os.path.exists(self.manifest_path)))


class _nolock:
    """A stand-in for _FileLock when the caller already holds it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _same_layout(a: pa.Schema, b: pa.Schema) -> bool:
    """Same columns and types, same EDJE metadata."""
    return a.equals(b) and (a.metadata or {}).get(METADATA_KEY) == (b.metadata or {}).get(METADATA_KEY)


def _count(folder: str, suffix: str) -> int:
    """Files of a folder whose names end with `suffix` (0 when there is no folder)."""
    return len([n for n in os.listdir(folder) if n.endswith(suffix)]) if os.path.isdir(folder) else 0


def _first_of_each_id(table: pa.Table, lo: List[int], hi: List[int], known: frozenset = frozenset()):
    """Rows whose id is not in `known` nor earlier in the table, with their sequence ranges."""
    seen, keep = set(known), []
    for i, image_id in enumerate(table.column("image_id").to_pylist()):
        if image_id not in seen:
            seen.add(image_id)
            keep.append(i)
    if len(keep) == table.num_rows:
        return table, lo, hi
    return table.take(pa.array(keep, pa.int64())), [lo[i] for i in keep], [hi[i] for i in keep]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """python -m edje.serving.live_log compact|files LIVE_DIR: compact a live folder now, or count its files."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("command", choices=["compact", "files"])
    p.add_argument("live_dir")
    p.add_argument("--part-rows", type=int, default=LiveLogConfig.part_rows)
    p.add_argument("--part-bytes", type=int, default=LiveLogConfig.part_bytes)
    a = p.parse_args(argv)
    live = LiveLog(a.live_dir, LiveLogConfig(part_rows=a.part_rows, part_bytes=a.part_bytes))
    print(json.dumps(live.compact() if a.command == "compact" else live.files()), flush=True)


if __name__ == "__main__":
    main()
