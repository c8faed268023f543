"""The live log's bytes: a segment's header and its records, encoded, checksummed, scanned and decoded.

A segment (the open ``LOG`` or a sealed ``wal/<first seq>.wal``) starts with a header: magic ``EDJELOG1``, the
Arrow schema of the served token tables with their EDJE metadata (length and crc32), and the segment's first
sequence number, which names its generation. One record per add follows: u32 payload length, u32 crc32 of
(sequence number + payload), u64 sequence number, the rows as one Arrow IPC record batch, padded to 8 bytes.
A scan tells a write cut short at the end (skipped, then cut off) from a complete record that fails its checksum.
Decoded rows are kept once per image id, the first time it comes (``first_of_each_id``), wherever they are folded.
"""
from __future__ import annotations

import os
import struct
import zlib
from typing import List, Sequence, Tuple

import pyarrow as pa

MAGIC = b"EDJELOG1"
HEAD = struct.Struct("<8sIIQ")  # magic, schema length, crc32 of the schema, first sequence number
REC = struct.Struct("<IIQ")  # payload length, crc32 of (sequence number + payload), sequence number
BAD_LAST_RECORD = "a complete last record whose checksum does not match"


class LiveLogCorrupt(RuntimeError):
    """Bytes of the live log that no crash can leave (a bad header, a bad record followed by good ones)."""


def _pad8(n: int) -> int:
    """n rounded up to a multiple of 8 (records and batches stay 8-byte aligned for Arrow)."""
    return (n + 7) & ~7


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


def generation_of(fd: int, where: str) -> int:
    """The generation (first sequence number) a segment's header names, read from an open file."""
    head = os.pread(fd, HEAD.size, 0)
    if len(head) < HEAD.size or head[:8] != MAGIC:
        raise LiveLogCorrupt(f"{where}: not a live log segment (no {MAGIC.decode()} header)")
    return HEAD.unpack(head)[3]


def record(seq: int, batch: pa.RecordBatch) -> bytes:
    """One log record holding a batch of rows."""
    payload = batch.serialize().to_pybytes()
    seq_bytes = struct.pack("<Q", seq)
    head = REC.pack(len(payload), zlib.crc32(payload, zlib.crc32(seq_bytes)), seq)
    return head + payload + b"\0" * (_pad8(len(payload)) - len(payload))


def scan(data: memoryview, start: int, where: str) -> Tuple[List[Tuple[int, int, int]], int, str]:
    """Whole records from byte `start`: [(seq, payload start, payload end)], the offset after the last one, and
    why the bytes after it are no record ('' when there are none; BAD_LAST_RECORD for a complete last record
    whose checksum fails, which no torn write leaves)."""
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
                return out, pos, BAD_LAST_RECORD
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


def first_of_each_id(table: pa.Table, lo: List[int], hi: List[int], known: frozenset = frozenset()):
    """Rows whose id is not in `known` nor earlier in the table, with their sequence ranges."""
    seen, keep = set(known), []
    for i, image_id in enumerate(table.column("image_id").to_pylist()):
        if image_id not in seen:
            seen.add(image_id)
            keep.append(i)
    if len(keep) == table.num_rows:
        return table, lo, hi
    return table.take(pa.array(keep, pa.int64())), [lo[i] for i in keep], [hi[i] for i in keep]
