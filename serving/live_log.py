"""The live log: token rows of added images in an append log, compacted into Parquet parts of bounded size.

A live folder (``live_dir``; one per shard) holds:

- ``LOG``: the open segment: a header naming its schema and first sequence number, then one checksummed record
  per add (the bytes: serving/live_record.py). Appended under an exclusive ``flock`` on ``LOCK`` and fsync'd
  before the add answers.
- ``wal/<first seq>.wal``: sealed segments: LOG as it was when a compaction began (hard-linked, then a fresh
  LOG with only a header replaces it, so LOG never disappears).
- ``parts/<first>-<last>.parquet``: compacted rows, at most ``part_rows`` rows and about ``part_bytes`` each,
  written by ``write_token_table`` like any token table (same schema and metadata as the served tables).
- ``MANIFEST``: JSON naming the parts, ``through`` (the last sequence number they hold) and ``generation`` (one
  more at every commit); replaced atomically. It is the commit point of a compaction: a part it does not name is
  not read (and is removed by the next compaction), a record numbered at or below ``through`` is skipped (its
  row is in a part).
- ``corrupt/``: the bytes of a complete record whose checksum failed (damage on disk, never a crash), kept aside.

**Generations.** A LOG is named by the first sequence number in its header, as SQLite's WAL salt, LevelDB's
manifest number and Kafka's base offset name theirs: by what the file holds, never by where it sits. A new LOG
starts after the last record of the one it replaces, so the number only grows. A reader's cursor holds the
generation and the byte it read up to; a LOG of another generation is read from its header after the parts and
sealed segments (a catch-up). Inode numbers, sizes and times never identify a file: a freed inode number is handed
to the next new file at once (ext4), and NFS clients do not share them.

**What an acknowledged add survives.** Every replica may append (under the exclusive lock, after reading every
record there is, so duplicate ids are refused across replicas). An add answers only after its record is
fsync'd; when the write or the fsync fails, the record is cut off again before the error is returned. Readers
read under the shared lock, so none applies a record before it is durable. An acknowledged record survives a
crash of any process at any step, compactions included, and a restart of every replica.

Compaction (``LiveLog.compact``): seal LOG; write each new part to a temp name, fsync, rename, fsync the
folder; write MANIFEST (temp, fsync, rename, fsync); only then drop the sealed segments and a small part it
merged. A process that dies at any step loses nothing and counts nothing twice: before MANIFEST the
segments still hold every row, after it ``through`` hides their records. A record cut short at the end of
LOG (a writer that died mid-append) is skipped by readers and cut off, with a warning, by the next process
that opens the folder or appends to it; the cut point is found by scanning LOG from its header under the
exclusive lock. Legacy folders (a text ``LOG`` naming one Parquet table per image under ``tables/``) are folded
into the log on first open (serving/live_log_migration.py).

``python -m edje.serving.live_log compact|files LIVE_DIR`` compacts a folder by hand, or counts its files.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from edje.schemas.token_table import METADATA_KEY, TableMetadata, table_schema, write_token_table
from edje.serving.durable_files import FileLock, NoLock, fsync_dir, fsync_file, write_atomic
from edje.serving.live_crash import crash_point
from edje.serving.live_log_migration import legacy_pending, migrate_legacy
from edje.serving.live_record import (
    BAD_LAST_RECORD,
    LiveLogCorrupt,
    decode,
    first_of_each_id,
    generation_of,
    parse_header,
    record,
    scan,
    segment_header,
)

log = logging.getLogger("ray.serve")

LOG_NAME, LOCK_NAME, COMPACT_LOCK_NAME, MANIFEST_NAME = "LOG", "LOCK", "COMPACT.lock", "MANIFEST"
WAL_DIR, PARTS_DIR, CORRUPT_DIR = "wal", "parts", "corrupt"


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
    generation: int = 0  # one more at every commit


@dataclass
class Cursor:
    """How far one reader has read: the sequence number, and where in LOG (which generation, which byte).

    A LOG generation is named by the first sequence number its header holds, never by where the file sits (an
    inode number is handed to the next new file as soon as it is free, and NFS clients do not share them)."""

    seq: int = 0
    log_gen: int = -1  # first_seq in the header of the LOG read last; 0: there was no LOG; -1: not read yet
    log_off: int = 0  # bytes of that LOG read (header and whole records)
    log_rows: int = 0  # rows in LOG up to log_off (what triggers a compaction)
    schema: Optional[pa.Schema] = None


def log_state(path: str) -> Tuple[int, int]:
    """(generation, size) of LOG; (0, 0) when there is none. One open, one 24-byte read, one fstat."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0, 0
    with f:
        return generation_of(f.fileno(), path), os.fstat(f.fileno()).st_size


def read_manifest(path: str) -> Tuple[Manifest, int]:
    """MANIFEST and its generation (an empty manifest, generation 0, when there is none)."""
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        return Manifest(), 0
    parts = [PartInfo(**p) for p in raw["parts"]]
    generation = raw.get("generation", 0)  # folders written before MANIFEST carried one
    return Manifest(raw["through"], parts, generation), generation


@dataclass
class _Snapshot:
    """What one poll reads, taken under the lock: LOG's new bytes (same generation), or everything (catch-up).
    Parts stay open files and are read after the lock is released (open files outlive an unlink)."""

    log_gen: int  # 0: no LOG
    log_data: memoryview  # LOG's bytes from `log_base` on
    log_base: int
    manifest: Optional[Manifest] = None  # None: a tail read (LOG is the generation the cursor is in)
    parts: List[Tuple[PartInfo, object]] = field(default_factory=list)
    segments: List[Tuple[str, memoryview]] = field(default_factory=list)

    def close(self) -> None:
        for _, f in self.parts:
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
        self.corrupt_dir = os.path.join(self.dir, CORRUPT_DIR)
        os.makedirs(self.dir, exist_ok=True)
        open(self.lock_path, "a").close()
        self.cursor = Cursor()
        self.repairs: List[str] = []  # torn tails this object cut off (each also logged as a warning)
        self.corruptions: List[str] = []  # damaged records this object moved aside (each also logged as an error)
        self._broken: Optional[str] = None  # why appends are refused: a failed write could not be undone
        if recover and legacy_pending(self.dir, self.path):
            with self.locked():
                migrate_legacy(self)

    # -- reading --------------------------------------------------------------------------------------

    def changed(self) -> bool:
        """Whether anything was committed (or compacted) since the last poll: LOG's generation and size."""
        return log_state(self.path) != (self.cursor.log_gen, self.cursor.log_off)

    def poll(self) -> Optional[pa.Table]:
        """Rows committed since the last poll, oldest first, or None. Right after a compaction, rows this reader
        already had may come again (the part that holds them): skip ids you know. The first poll (start-up)
        also cuts off a torn LOG tail, with a warning."""
        if not self.changed():
            return None
        return self._poll(locked=False, repair=self.cursor.log_gen < 0)

    def poll_locked(self) -> Optional[pa.Table]:
        """`poll` for a caller holding `locked()` (a writer, before its duplicate check and its append): it catches
        up whatever happened since, compactions included, and cuts a torn tail."""
        if not self.changed():
            return None
        return self._poll(locked=True, repair=True)

    def _poll(self, locked: bool, repair: bool) -> Optional[pa.Table]:
        # Reads happen under the lock (shared for readers): a writer holds it exclusively from its write through its
        # fsync, so a reader never sees a record before it is durable, nor bytes of a write in flight.
        with (NoLock() if locked else FileLock(self.lock_path, exclusive=False)):
            snap = self._snapshot()
        try:
            got, torn = self._read(snap)
        finally:
            snap.close()
        if torn and repair:
            self._repair(locked)
        return got

    def _snapshot(self) -> _Snapshot:
        """LOG's bytes past the cursor when it is still the generation the cursor is in; else everything there is."""
        try:
            log_f = open(self.path, "rb")
        except FileNotFoundError:
            log_f = None
        with (log_f or NoLock()):
            gen = generation_of(log_f.fileno(), self.path) if log_f is not None else 0
            if gen == self.cursor.log_gen and self.cursor.schema is not None:
                log_f.seek(self.cursor.log_off)
                return _Snapshot(gen, memoryview(log_f.read()), self.cursor.log_off)
            manifest, _ = read_manifest(self.manifest_path)
            parts = []
            try:
                for p in manifest.parts:
                    if p.last > self.cursor.seq:
                        parts.append((p, open(os.path.join(self.parts_dir, p.name), "rb")))
            except BaseException:
                for _, f in parts:
                    f.close()
                raise
            segments = []
            for path in self._segments():
                with open(path, "rb") as f:
                    segments.append((path, memoryview(f.read())))
            data = memoryview(log_f.read()) if log_f is not None else memoryview(b"")
            return _Snapshot(gen, data, 0, manifest, parts, segments)

    def _read(self, snap: _Snapshot) -> Tuple[Optional[pa.Table], str]:
        """Decode a snapshot and move the cursor past it: (rows, why LOG's last bytes are no record or '')."""
        c, pieces, batches = self.cursor, [], []
        if snap.manifest is not None:
            pieces = [self._read_part(p, f) for p, f in snap.parts]
            c.seq = max(c.seq, snap.manifest.through)
            for path, data in snap.segments:
                batches += [b for _, b in self._read_segment(path, data)]
        torn = ""
        if snap.log_gen == 0:
            c.log_gen, c.log_off, c.log_rows = 0, 0, 0
        else:
            start = 0
            if snap.manifest is not None:  # a LOG read from its header
                schema, first, start = parse_header(snap.log_data, self.path)
                self._adopt(schema, self.path)
                c.log_gen, c.log_rows = first, 0
                c.seq = max(c.seq, first - 1)  # every record before this LOG's first is in a part or a segment
            recs, end, torn = scan(snap.log_data, start, self.path)
            got, c.seq = decode(snap.log_data, recs, c.schema, c.seq)
            c.log_off = snap.log_base + end
            c.log_rows += sum(b.num_rows for _, b in got)
            batches += [b for _, b in got]
        return self._table(pieces + ([pa.Table.from_batches(batches)] if batches else [])), torn

    def _repair(self, locked: bool) -> None:
        """Cut what follows LOG's last whole record, found by scanning LOG from its header under the exclusive lock
        (never from a reader's offset: it may belong to a LOG that was replaced since). A torn write is cut with a
        warning; a complete record that fails its checksum is corruption: moved aside, counted, logged as an error."""
        with (NoLock() if locked else self.locked()):
            try:
                f = open(self.path, "r+b")
            except FileNotFoundError:
                return
            with f:
                data = memoryview(f.read())
                _, _, start = parse_header(data, self.path)
                _, end, why = scan(data, start, self.path)
                if not why:
                    return  # cut already, by whoever held the lock before
                rest = bytes(data[end:])
                if why == BAD_LAST_RECORD:
                    os.makedirs(self.corrupt_dir, exist_ok=True)
                    kept = os.path.join(self.corrupt_dir, f"LOG-{generation_of(f.fileno(), self.path):016d}-at-{end}.bin")
                    write_atomic(kept, rest)
                    msg = (f"live log {self.path}: the record at byte {end} ({len(rest)} bytes) fails its checksum: "
                           f"damaged on disk; moved to {kept}")
                    log.error(msg)
                    self.corruptions.append(msg)
                else:
                    msg = f"live log {self.path}: ignoring {len(rest)} bytes after byte {end} ({why}): a write cut short"
                    log.warning(msg)
                    self.repairs.append(msg)
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def _segments(self) -> List[str]:
        """Sealed segments, oldest first."""
        if not os.path.isdir(self.wal_dir):
            return []
        return [os.path.join(self.wal_dir, n) for n in sorted(os.listdir(self.wal_dir)) if n.endswith(".wal")]

    def _read_part(self, part: PartInfo, f) -> pa.Table:
        """A committed part, checked against the expected metadata, in the log's schema."""
        table = pq.read_table(f)
        self._adopt(table.schema, os.path.join(self.parts_dir, part.name))
        return table.cast(self.cursor.schema)

    def _read_segment(self, path: str, data: memoryview) -> List[Tuple[int, pa.RecordBatch]]:
        """Records of a sealed segment numbered above the cursor (from where this reader stopped, if it was its LOG)."""
        schema, first, start = parse_header(data, path)
        self._adopt(schema, path)
        if first == self.cursor.log_gen:
            start = max(start, self.cursor.log_off)
        recs, _, torn = scan(data, start, path)
        if torn:  # sealed after a repair: only a torn write after an interrupted rotation ends up here
            log.warning("live log %s: ignoring a torn tail (%s)", path, torn)
        got, self.cursor.seq = decode(data, recs, self.cursor.schema, self.cursor.seq)
        return got

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
        """One table of tables (chunked: each consumer combines only the columns it reads), None when empty."""
        if not pieces:
            return None
        table = pa.concat_tables(pieces)
        return table if table.num_rows else None

    # -- writing --------------------------------------------------------------------------------------

    def locked(self) -> FileLock:
        """The exclusive lock over appends, rotations and commits, across processes (flock on LOCK)."""
        return FileLock(self.lock_path)

    def append(self, table: pa.Table) -> int:
        """Append a table's rows as one record and fsync it; returns its sequence number. Call under `locked()`
        after `poll_locked()`: the record must follow every record there is. When the write or its fsync fails,
        the record is cut off again before the error is raised (readers, who read under the lock, never saw it)."""
        if table.num_rows == 0:
            raise ValueError("nothing to append")
        if self._broken:
            raise LiveLogCorrupt(self._broken)
        if self.cursor.schema is None:
            self._adopt(table.schema, "the appended rows")
        elif not _same_layout(table.schema, self.cursor.schema):
            raise ValueError("rows of another table layout than the live log's")
        seq = self.cursor.seq + 1
        data = record(seq, table.combine_chunks().to_batches()[0])  # a batch holds no names: no cast needed
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            if self.cursor.log_gen > 0:
                raise  # LOG never disappears once made: a writer that read one must not start another
            self._create_log(seq)  # the first append to this folder
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        try:
            state = (generation_of(fd, self.path), os.fstat(fd).st_size)
            if state != (self.cursor.log_gen, self.cursor.log_off):
                raise RuntimeError(f"the live log is at generation/byte {state}, this writer at "
                                   f"{(self.cursor.log_gen, self.cursor.log_off)}: append under locked() right after "
                                   "poll_locked()")
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(f"short write to {self.path}")
                os.fdatasync(fd)  # an add answers only once its record is on disk
            except OSError:
                self._undo(fd, state[1])
                raise
        finally:
            os.close(fd)
        self.cursor.seq, self.cursor.log_off = seq, self.cursor.log_off + len(data)
        self.cursor.log_rows += table.num_rows
        return seq

    def _undo(self, fd: int, size: int) -> None:
        """Cut a record whose write or fsync failed, so that no reader ever applies a row its client saw refused."""
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as e:
            # Whether the record is on disk is unknown: refuse further appends here; a restart rescans the log.
            self._broken = f"live log {self.path}: a failed append could not be cut off ({e}); restart this replica"
            log.error(self._broken)

    def _create_log(self, first_seq: int) -> None:
        """A LOG with only its header, under its final name at once (the first append to a folder)."""
        header = segment_header(self.cursor.schema, first_seq)
        write_atomic(self.path, header)
        self.cursor.log_gen, self.cursor.log_off, self.cursor.log_rows = first_seq, len(header), 0

    def wants_compaction(self) -> bool:
        """Whether LOG, as this reader last saw it, holds enough to compact."""
        return self.cursor.log_rows >= self.config.compact_rows or self.cursor.log_off >= self.config.compact_bytes

    # -- compaction -----------------------------------------------------------------------------------

    def compact(self) -> Optional[dict]:
        """Fold LOG into parts (the module docstring); None when another process is compacting this folder.
        Never call it holding `locked()`."""
        with FileLock(os.path.join(self.dir, COMPACT_LOCK_NAME), blocking=False) as lock:
            if not lock.acquired:
                return None
            self._rotate()
            return self._fold()

    def _rotate(self) -> None:
        """Seal LOG as wal/<first seq>.wal and start a fresh LOG, under the exclusive lock (appends wait)."""
        with self.locked():
            self._repair(locked=True)
            try:
                with open(self.path, "rb") as f:
                    data = memoryview(f.read())
            except FileNotFoundError:
                return
            schema, first, start = parse_header(data, self.path)
            recs, _, _ = scan(data, start, self.path)
            if not recs:
                return
            os.makedirs(self.wal_dir, exist_ok=True)
            sealed = os.path.join(self.wal_dir, f"{first:016d}.wal")
            if not os.path.exists(sealed):  # else: a rotation cut short after its link (the name is the generation)
                os.link(self.path, sealed)
                fsync_dir(self.wal_dir)
            crash_point("linked")
            write_atomic(self.path, segment_header(schema, recs[-1][0] + 1))
            crash_point("rotated")

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
                got += reader._read_segment(path, memoryview(f.read()))
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
        new, lo, hi = first_of_each_id(new, lo, hi)
        if merged is not None and new.num_rows == merged.rows:
            merged, parts = None, []  # every new row repeated an id of that part: nothing to write
        else:
            parts = self._write_parts(new, lo, hi)
        kept = [p for p in manifest.parts if merged is None or p.name != merged.name]
        committed = Manifest(reader.cursor.seq, kept + parts, manifest.generation + 1)
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
            crash_point("part_tmp")
            fsync_file(tmp)
            os.replace(tmp, os.path.join(self.parts_dir, name))
            crash_point("part_renamed")
            out.append(PartInfo(name, first, last, chunk.num_rows, nbytes))
        fsync_dir(self.parts_dir)
        return out

    def _commit(self, old: Manifest, new: Optional[Manifest], segments: Sequence[str],
                replaced: Sequence[PartInfo]) -> None:
        """Write MANIFEST (the commit), then drop the segments and the part it made redundant."""
        with self.locked():  # readers open their files under the shared lock: never half a compaction
            if new is not None:
                raw = json.dumps(dict(generation=new.generation, through=new.through,
                                      parts=[asdict(p) for p in new.parts]), indent=1)
                write_atomic(self.manifest_path, raw.encode())
                crash_point("manifest_written")
            for path in segments:
                os.unlink(path)
                crash_point("segment_dropped")
            for part in replaced:
                os.unlink(os.path.join(self.parts_dir, part.name))
            for d in (self.wal_dir, self.parts_dir):
                if os.path.isdir(d):
                    fsync_dir(d)

    def _drop_orphans(self, manifest: Manifest) -> None:
        """Remove parts MANIFEST does not name: the temp and renamed parts of a compaction that died before its
        commit (their rows are still in the segments). Call holding the compaction lock."""
        if not os.path.isdir(self.parts_dir):
            return
        named = {p.name for p in manifest.parts}
        for n in os.listdir(self.parts_dir):
            if n not in named:
                os.unlink(os.path.join(self.parts_dir, n))

    # -- the first stage's interface (serving/first_stage.py): size() and read() -----------------------

    def size(self) -> int:
        """A number that changes whenever the log does, equal to what `read` last returned while nothing changed."""
        return hash(log_state(self.path))

    def read(self, offset: int = 0) -> Tuple[List[pa.Table], int]:
        """([rows committed since this object's last read] or [], `size()` as of that read). `offset` is
        ignored: the object keeps its own place (its cursor)."""
        table = self.poll()
        return ([table] if table is not None else []), hash((self.cursor.log_gen, self.cursor.log_off))

    def files(self) -> dict:
        """How many files of each kind the live log has (benchmarks, reports)."""
        return dict(log=int(os.path.exists(self.path)), segments=len(self._segments()),
                    parts=_count(self.parts_dir, ".parquet"), manifest=int(os.path.exists(self.manifest_path)),
                    corrupt=_count(self.corrupt_dir, ".bin"))


def _same_layout(a: pa.Schema, b: pa.Schema) -> bool:
    """Same columns and types, same EDJE metadata (compared as metadata, not as bytes: a release that adds a field
    with a default writes other bytes for the same table, and a folder must outlive an upgrade)."""
    if not a.equals(b):
        return False
    raw_a, raw_b = (a.metadata or {}).get(METADATA_KEY), (b.metadata or {}).get(METADATA_KEY)
    return raw_a == raw_b or (None not in (raw_a, raw_b) and _metadata(raw_a) == _metadata(raw_b))


@functools.lru_cache(maxsize=64)
def _metadata(raw: bytes) -> TableMetadata:
    """Parsed table metadata (cached: every append compares its rows' metadata with the log's)."""
    return TableMetadata.from_bytes(raw)


def _count(folder: str, suffix: str) -> int:
    """Files of a folder whose names end with `suffix` (0 when there is no folder)."""
    return len([n for n in os.listdir(folder) if n.endswith(suffix)]) if os.path.isdir(folder) else 0


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
