"""The live log (serving/live_log.py): appends, compaction into bounded parts, crashes at every step of a
compaction, torn records, the one-table-per-image layout it replaces, two processes adding at once.

No Ray and no model: rows are random token rows of the default codec's shape (16 tokens x 128, int8).
A compaction killed at a named step runs in a child process (`EDJE_LIVE_LOG_CRASH_AT`, os._exit there);
the folder is then opened again, as a restarted replica would, and every row must be there exactly once
with the bytes it was added with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from live_log_rows import EXPECTED, META, random_rows

from edje.model.token_encoder import EncodedImages
from edje.schemas.token_table import (
    TableMetadata,
    blob_matrix,
    read_metadata,
    read_token_tables,
    vector_matrix,
    write_token_table,
)
from edje.serving.live_crash import CRASH_ENV, CRASH_EXIT, CRASH_STEPS
from edje.serving.live_images import LiveImages, embeddings_of_tables, live_rows
from edje.serving.live_log import LiveLog, LiveLogConfig, read_manifest
from edje.serving.live_log_migration import LEGACY_LOG
from edje.serving.live_record import MAGIC, LiveLogCorrupt, scan
from edje.storage.token_store import TokenStore

REPO = Path(__file__).resolve().parent.parent
def _encoded(table: pa.Table) -> EncodedImages:
    """A table's rows as the encoder gives them."""
    codec = META.codec
    return EncodedImages(blob_matrix(table.column("tokens"), codec.blob_bytes).copy(),
                         blob_matrix(table.column("token_scales"), 2 * codec.num_scales).view("<f2").copy(),
                         vector_matrix(table.column("image_embedding")))


def _add(live: LiveLog, table: pa.Table) -> None:
    """One add the way a replica commits it: under the lock, after reading what others appended."""
    with live.locked():
        live.poll_locked()
        live.append(table)


def _by_id(table: pa.Table) -> dict:
    """image_id -> (token bytes, scale bytes, embedding, url); asserts each id is there once."""
    ids = table.column("image_id").to_pylist()
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    cols = [table.column(c).to_pylist() for c in ("tokens", "token_scales", "image_embedding", "url")]
    return {i: tuple(c[k] for c in cols) for k, i in enumerate(ids)}


def _everything(live_dir) -> dict:
    """What a replica starting now over the folder reads."""
    table = LiveLog(str(live_dir), expected=EXPECTED).poll()
    return {} if table is None else _by_id(table)


def _leftovers(live_dir: Path) -> list:
    """Files no committed state names: sealed segments, temp files, parts MANIFEST does not list."""
    manifest, _ = read_manifest(str(live_dir / "MANIFEST"))
    named = {p.name for p in manifest.parts}
    parts = sorted(p.name for p in (live_dir / "parts").iterdir()) if (live_dir / "parts").is_dir() else []
    wal = sorted(p.name for p in (live_dir / "wal").iterdir()) if (live_dir / "wal").is_dir() else []
    return [n for n in parts if n not in named] + wal + [p.name for p in live_dir.iterdir() if p.name.endswith(".tmp")]


def test_appends_reach_every_reader_with_their_bytes(tmp_path):
    writer, reader = LiveLog(str(tmp_path)), LiveLog(str(tmp_path), expected=EXPECTED)
    assert reader.poll() is None and not reader.changed()
    added = random_rows([f"a{i}" for i in range(5)])
    for i in range(5):
        _add(writer, added.slice(i, 1))
    assert reader.changed()
    assert _by_id(reader.poll()) == _by_id(added)
    assert reader.poll() is None and not reader.changed()  # two stats, nothing new
    _add(writer, random_rows(["a5"], seed=1))
    assert reader.poll().column("image_id").to_pylist() == ["a5"]
    assert (tmp_path / "LOG").read_bytes()[:8] == MAGIC and not (tmp_path / "tables").exists()
    assert _everything(tmp_path).keys() == {f"a{i}" for i in range(6)}


def test_compaction_writes_bounded_parts_in_the_tables_format(tmp_path):
    live = LiveLog(str(tmp_path), LiveLogConfig(part_rows=4))
    added = random_rows([f"c{i:02d}" for i in range(10)])
    for i in range(10):
        _add(live, added.slice(i, 1))
    done = live.compact()
    assert [p["rows"] for p in done["parts"]] == [4, 4, 2] and done["through"] == 10
    assert live.files() == dict(log=1, segments=0, parts=3, manifest=1, corrupt=0) and _leftovers(tmp_path) == []
    parts = sorted(str(p) for p in (tmp_path / "parts").glob("*.parquet"))
    assert all(read_metadata(p) == META for p in parts)  # the served tables' metadata, read by the usual reader
    table, _ = read_token_tables(parts, **EXPECTED)
    assert _by_id(table) == _by_id(added) == _everything(tmp_path)
    # More rows fill the small last part first (merged, then dropped), so parts stay near the bound.
    more = random_rows([f"c{i:02d}" for i in range(10, 13)], seed=2)
    for i in range(3):
        _add(live, more.slice(i, 1))
    done = live.compact()
    assert done["merged"] and [p["rows"] for p in done["parts"]] == [4, 1]
    assert [p.rows for p in read_manifest(str(tmp_path / "MANIFEST"))[0].parts] == [4, 4, 4, 1]
    assert _leftovers(tmp_path) == [] and len(list((tmp_path / "parts").iterdir())) == 4
    assert _everything(tmp_path) == {**_by_id(added), **_by_id(more)}
    # A byte bound smaller than four rows cuts parts by bytes instead.
    small = LiveLog(str(tmp_path / "b"), LiveLogConfig(part_rows=100, part_bytes=3 * added.slice(0, 4).nbytes // 4))
    for i in range(10):
        _add(small, added.slice(i, 1))
    assert [p["rows"] for p in small.compact()["parts"]] == [3, 3, 3, 1]


def test_replicas_adding_and_compacting_each_hold_every_image_once(tmp_path):
    base = str(tmp_path / "base.parquet")
    write_token_table(random_rows(["base-0"], seed=9), base)
    live_dir = tmp_path / "live"

    def replica():
        return LiveImages(TokenStore.load([base]), None, torch.device("cpu"), str(live_dir), 10 ** 6, 4,
                          LiveLogConfig(part_rows=4, compact_rows=3, background=False))

    a, b = replica(), replica()
    added = random_rows([f"r{i}" for i in range(11)], seed=3)
    for i in range(11):
        rows = _encoded(added.slice(i, 1))
        got = (a if i % 2 else b).add_encoded(f"r{i}", rows, f"http://x/r{i}", data=b"png bytes")
        assert got.status == 200, got.detail
        if i % 3 == 0:
            a.sync(), b.sync()
    assert a.compactions and b.compactions  # both replicas filled LOG at some point and compacted it
    a.sync(), b.sync()
    for replica_ in (a, b):
        assert len(replica_.store) == 12
        got = replica_.store.gather_blobs([f"r{i}" for i in range(11)])
        np.testing.assert_array_equal(got.blob, _encoded(added).blob)
        np.testing.assert_array_equal(got.scales, _encoded(added).scales)
    assert a.add_encoded("r4", rows).status == 409  # taken, although added by the other replica before a compaction
    assert _everything(live_dir) == _by_id(added)
    assert live_rows(str(live_dir)).num_rows == 11


@pytest.mark.parametrize("step", [s for s in CRASH_STEPS if s != "legacy_appended"])
def test_a_compaction_killed_at_any_step_loses_nothing(tmp_path, step):
    live = LiveLog(str(tmp_path), LiveLogConfig(part_rows=4))
    first, second = random_rows([f"k{i:02d}" for i in range(6)]), random_rows([f"k{i:02d}" for i in range(6, 13)], seed=4)
    for i in range(6):
        _add(live, first.slice(i, 1))
    live.compact()  # parts of 4 and 2 rows: the next compaction merges the small one (every step is reached)
    for i in range(7):
        _add(live, second.slice(i, 1))
    cmd = [sys.executable, "-m", "edje.serving.live_log", "compact", str(tmp_path), "--part-rows", "4"]
    out = subprocess.run(cmd, env={**os.environ, CRASH_ENV: step}, capture_output=True, text=True, timeout=300)
    assert out.returncode == CRASH_EXIT, (step, out.returncode, out.stderr[-2000:])  # it died where it was told to

    want = {**_by_id(first), **_by_id(second)}
    assert _everything(tmp_path) == want  # the restarted replica's view: each image once, the same bytes
    after = random_rows(["k13", "k14"], seed=5)
    writer = LiveLog(str(tmp_path), LiveLogConfig(part_rows=4))
    for i in range(2):
        _add(writer, after.slice(i, 1))  # adds go on over the interrupted compaction
    assert _everything(tmp_path) == {**want, **_by_id(after)}
    writer.compact()  # the next compaction finishes the job and leaves nothing behind
    assert _leftovers(tmp_path) == [] and writer.files()["segments"] == 0
    assert _everything(tmp_path) == {**want, **_by_id(after)}
    assert all(p.rows <= 4 for p in read_manifest(str(tmp_path / "MANIFEST"))[0].parts)


def _log_end_of_records(path: Path) -> list:
    """Byte offsets where LOG's records end (after the header)."""
    data = memoryview(path.read_bytes())
    from edje.serving.live_record import parse_header
    _, _, start = parse_header(data, str(path))
    recs, _, _ = scan(data, start, str(path))
    return [b + (-(b - a) % 8) for _, a, b in recs]


@pytest.mark.parametrize("cut", ["mid_payload", "mid_header", "zero_tail"])
def test_a_torn_last_record_is_skipped_with_a_warning_then_cut_off(tmp_path, cut):
    writer, running = LiveLog(str(tmp_path)), LiveLog(str(tmp_path))
    added = random_rows([f"t{i}" for i in range(5)])
    for i in range(5):
        _add(writer, added.slice(i, 1))
        if i == 3:
            running.poll()  # a replica that was running when the last add died
    log_path = tmp_path / "LOG"
    ends = _log_end_of_records(log_path)
    if cut == "mid_payload":  # the last add died while writing its rows
        os.truncate(log_path, ends[-1] - 700)
        kept, good_end = 4, ends[-2]
    elif cut == "mid_header":  # ... while writing the record's first bytes
        os.truncate(log_path, ends[-2] + 7)
        kept, good_end = 4, ends[-2]
    else:  # a file system that grew the file before writing the data (zeros)
        with open(log_path, "ab") as f:
            f.write(b"\0" * 3000)
        kept, good_end = 5, ends[-1]

    size = log_path.stat().st_size
    running.poll()  # not a start-up poll, no lock: it never cuts (for all it knows, a write is in flight)
    assert log_path.stat().st_size == size and running.repairs == []
    reader = LiveLog(str(tmp_path), expected=EXPECTED)
    assert _by_id(reader.poll()) == _by_id(added.slice(0, kept))  # a start-up poll: no crash ...
    assert len(reader.repairs) == 1 and "cut short" in reader.repairs[0]  # ... a warning ...
    assert log_path.stat().st_size == good_end  # ... and the torn bytes are gone
    later = random_rows(["t9"], seed=6)
    _add(LiveLog(str(tmp_path)), later)  # appends go on after the last whole record
    assert _everything(tmp_path) == {**_by_id(added.slice(0, kept)), **_by_id(later)}
    assert reader.poll().column("image_id").to_pylist() == ["t9"]


def test_a_damaged_record_with_records_after_it_is_an_error_not_a_silent_loss(tmp_path):
    writer = LiveLog(str(tmp_path))
    added = random_rows([f"d{i}" for i in range(3)])
    for i in range(3):
        _add(writer, added.slice(i, 1))
    ends = _log_end_of_records(tmp_path / "LOG")
    data = bytearray((tmp_path / "LOG").read_bytes())
    data[ends[0] + 100] ^= 0xFF  # a flipped bit in the second of three records
    (tmp_path / "LOG").write_bytes(bytes(data))
    with pytest.raises(LiveLogCorrupt, match="checksum"):
        LiveLog(str(tmp_path)).poll()


def test_the_first_stage_interface_reads_rows_once(tmp_path):
    writer, first_stage = LiveLog(str(tmp_path)), LiveLog(str(tmp_path))
    offset = 0
    assert first_stage.size() != offset
    got, offset = first_stage.read(offset)
    assert got == [] and first_stage.size() == offset
    added = random_rows(["f0", "f1"])
    _add(writer, added)
    assert first_stage.size() != offset
    got, offset = first_stage.read(offset)
    ids, vectors = embeddings_of_tables(got)
    assert ids == ["f0", "f1"] and first_stage.size() == offset
    np.testing.assert_array_equal(vectors, np.array(added.column("image_embedding").to_pylist(), np.float32))
    writer.compact()
    assert first_stage.size() != offset  # a compaction changes MANIFEST: the reader looks, finds nothing new
    got, offset = first_stage.read(offset)
    assert got == [] and first_stage.size() == offset


def _legacy_folder(live_dir: Path, table: pa.Table) -> None:
    """The layout before the log: one token table per image under tables/, one line per table in a text LOG."""
    (live_dir / "tables").mkdir(parents=True)
    lines = []
    for i in range(table.num_rows):
        name = f"{i * 30:012d}-{i:016x}.parquet"
        write_token_table(table.slice(i, 1), str(live_dir / "tables" / name))
        lines.append(name + "\n")
    (live_dir / "LOG").write_text("".join(lines))


def test_a_folder_of_one_table_per_image_moves_into_the_log_once(tmp_path):
    legacy = random_rows([f"old{i}" for i in range(4)])
    _legacy_folder(tmp_path, legacy)
    cmd = [sys.executable, "-m", "edje.serving.live_log", "files", str(tmp_path)]
    out = subprocess.run(cmd, env={**os.environ, CRASH_ENV: "legacy_appended"}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == CRASH_EXIT, out.stderr[-2000:]  # rows appended, LOG.v1 and the tables still there
    assert (tmp_path / LEGACY_LOG).exists() and len(list((tmp_path / "tables").iterdir())) == 4
    assert _everything(tmp_path) == _by_id(legacy)  # opening again finishes the move without doubling a row
    assert not (tmp_path / LEGACY_LOG).exists() and not (tmp_path / "tables").exists()
    _add(LiveLog(str(tmp_path)), random_rows(["new0"], seed=7))
    assert _everything(tmp_path).keys() == {"old0", "old1", "old2", "old3", "new0"}


# -- interleavings of two replicas over one folder, forced --------------------------------------------------------
# A cursor once named LOG by its inode number; ext4 hands a freed number to the next new file at once, so a replica
# could take a LOG written two compactions later for the one it had read, and read it from the wrong byte. Each
# test below builds one such interleaving on purpose, under two namings of files: `renumbered` stands in for the
# file system (every file the module stats has inode number 1); `reused` makes the real file system hand the freed
# number back (files are created until one gets it, and that one becomes the next LOG.tmp).


class _OneInode:
    """`os` as the live log sees it, except that every file has inode number 1."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def _renumber(st):
        return SimpleNamespace(**{**{k: getattr(st, k) for k in dir(st) if k.startswith("st_")}, "st_ino": 1})

    def stat(self, path, *args, **kwargs):
        return self._renumber(os.stat(path, *args, **kwargs))

    def fstat(self, fd):
        return self._renumber(os.fstat(fd))


def _hand_back_inode(folder: Path, ino: int) -> None:
    """Make `ino` the inode of folder/LOG.tmp, which the next compaction truncates and renames to LOG."""
    made = []
    try:
        for i in range(20_000):
            path = folder / f"probe-{i}"
            path.touch()
            made.append(path)
            if path.stat().st_ino == ino:
                os.rename(path, folder / "LOG.tmp")
                made.pop()
                return
        pytest.skip(f"this file system ({folder}) did not hand inode {ino} back in 20,000 new files")
    finally:
        for path in made:
            path.unlink()


@pytest.fixture(params=["renumbered", "reused"])
def naming(request, monkeypatch):
    """How the test makes a new LOG take the inode number of one a replica read earlier."""
    if request.param == "renumbered":
        import edje.serving.live_log as live_log

        monkeypatch.setattr(live_log, "os", _OneInode())
    return request.param


def _replica(live_dir: Path) -> LiveImages:
    """A replica over a one-row base table; it compacts only when told to."""
    base = live_dir.parent / "base.parquet"
    if not base.exists():
        write_token_table(random_rows(["base-0"], seed=9), str(base))
    return LiveImages(TokenStore.load([str(base)]), None, torch.device("cpu"), str(live_dir), 10 ** 6, 4,
                      LiveLogConfig(compact_rows=10 ** 9, compact_bytes=1 << 62, background=False))


def _acked(replica: LiveImages, table: pa.Table, want: int = 200) -> None:
    """Add each row of `table` through a replica, as POST /v1/images does; each must answer `want`."""
    for i in range(table.num_rows):
        row = table.slice(i, 1)
        image_id = row.column("image_id")[0].as_py()
        got = replica.add_encoded(image_id, _encoded(row), row.column("url")[0].as_py())
        assert got.status == want, (image_id, got.status, got.detail)


@pytest.mark.parametrize("where", ["past_the_end", "on_a_record_boundary", "inside_a_record"])
def test_a_new_log_that_takes_a_read_logs_inode_number_is_read_from_its_header(tmp_path, naming, where):
    live_dir = tmp_path / "live"
    a, b = _replica(live_dir), _replica(live_dir)
    first = random_rows(["a0", "a1", "a2"], seed=1)
    _acked(a, first)  # A's cursor: LOG (inode X), after three records
    x = (live_dir / "LOG").stat().st_ino
    _acked(b, random_rows(["b0"], seed=2))
    assert b.compact()["rows"] == 4  # LOG sealed and dropped: inode X is free
    _acked(b, random_rows(["b1"], seed=3))
    if naming == "reused":
        _hand_back_inode(live_dir, x)
    b.compact()  # a LOG with only a header replaces the one holding b1
    if naming == "reused":
        assert (live_dir / "LOG").stat().st_ino == x
    end_of_a = _log_end_of_records(tmp_path / "live" / "LOG") or [0]
    a_end = a.log.cursor.log_off
    later = {}
    if where == "on_a_record_boundary":  # records as long as A's: byte a_end falls between two of them
        later = random_rows(["b2", "b3", "b4", "b5"], seed=4)
        _acked(b, later)
        assert a_end in _log_end_of_records(live_dir / "LOG") and (live_dir / "LOG").stat().st_size > a_end
    elif where == "inside_a_record":  # records of two rows each: byte a_end falls inside one
        later = random_rows(["b2", "b3", "b4", "b5"], seed=4)
        for i in (0, 2):
            _add(b.log, later.slice(i, 2))
        ends = _log_end_of_records(live_dir / "LOG")
        assert a_end not in ends and ends[0] < a_end < ends[-1], (a_end, ends)
    else:
        assert (live_dir / "LOG").stat().st_size < a_end, end_of_a
    b_rows = {**_by_id(random_rows(["b0"], seed=2)), **_by_id(random_rows(["b1"], seed=3)), **(_by_id(later) if later else {})}

    # A adds an image B added while A was not looking (refused), then a new one (acknowledged, never raised).
    theirs = random_rows(["b3" if later else "b1"], seed=5)
    _acked(a, theirs, want=409)
    mine = random_rows(["a3"], seed=6)
    _acked(a, mine)
    assert a.log.repairs == [] and a.log.corruptions == []
    want = {**_by_id(first), **b_rows, **_by_id(mine)}
    assert _everything(live_dir) == want  # each acknowledged image once, with the bytes it was added with
    a.sync()
    assert len(a.store) == 1 + len(want)
    c = _replica(live_dir)  # a replica starting now, after one more compaction
    c.compact()
    assert len(c.store) == 1 + len(want) and _everything(live_dir) == want


def test_a_complete_last_record_that_fails_its_checksum_is_kept_aside_and_reported(tmp_path):
    writer = LiveLog(str(tmp_path))
    added = random_rows([f"d{i}" for i in range(3)])
    for i in range(3):
        _add(writer, added.slice(i, 1))
    log_path = tmp_path / "LOG"
    ends = _log_end_of_records(log_path)
    data = bytearray(log_path.read_bytes())
    data[ends[1] + 100] ^= 0xFF  # a flipped bit in the last record: whole, so no torn write left it
    damaged = bytes(data[ends[1]:])
    log_path.write_bytes(bytes(data))
    reader = LiveLog(str(tmp_path), expected=EXPECTED)
    assert _by_id(reader.poll()) == _by_id(added.slice(0, 2))
    assert reader.repairs == [] and len(reader.corruptions) == 1 and "fails its checksum" in reader.corruptions[0]
    kept = list((tmp_path / "corrupt").iterdir())
    assert [p.read_bytes() for p in kept] == [damaged] and reader.files()["corrupt"] == 1
    assert log_path.stat().st_size == ends[1]
    _add(LiveLog(str(tmp_path)), random_rows(["d9"], seed=6))
    assert _everything(tmp_path).keys() == {"d0", "d1", "d9"}


def test_an_append_whose_fsync_fails_is_cut_off_before_the_error_and_no_reader_applies_it(tmp_path, monkeypatch):
    writer, reader = LiveLog(str(tmp_path)), LiveLog(str(tmp_path), expected=EXPECTED)
    _add(writer, random_rows(["s0"]))
    assert reader.poll().num_rows == 1
    size = (tmp_path / "LOG").stat().st_size
    seen = []

    def failing_fdatasync(fd):
        seen.append(os.fstat(fd).st_size)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(OSError, match="Input/output"):
        _add(writer, random_rows(["s1"], seed=1))
    assert seen and seen[0] > size  # the record was written, then ...
    assert (tmp_path / "LOG").stat().st_size == size and reader.poll() is None  # ... cut off before the error
    monkeypatch.undo()
    _add(writer, random_rows(["s2"], seed=2))  # the writer goes on from where the log stands
    assert _everything(tmp_path).keys() == {"s0", "s2"}
    assert reader.poll().column("image_id").to_pylist() == ["s2"]

    # When even the cut fails, the writer refuses to append again (a restart rescans the log).
    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(OSError):
        _add(writer, random_rows(["s3"], seed=3))
    monkeypatch.undo()
    with pytest.raises(LiveLogCorrupt, match="could not be cut off"):
        _add(writer, random_rows(["s4"], seed=4))


# -- many processes at once ---------------------------------------------------------------------------------------


def _stress(tmp_path: Path, processes: int, adds: int, seed: int, budget_s: float) -> dict:
    """Run tests/live_log_stress.py in `processes` children over one folder; check every id; returns counts."""
    live_dir, out_dir = tmp_path / "live", tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # the children import this module's helpers
    cmd = [sys.executable, str(REPO / "tests" / "live_log_stress.py"), str(live_dir), str(out_dir), str(adds),
           str(seed), str(budget_s), str(processes)]
    procs = [subprocess.Popen(cmd + [str(k)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(processes)]
    outs = [p.communicate(timeout=budget_s + 120) for p in procs]
    if any(p.returncode for p in procs):  # pytest.fail prints all of it: an assertion's message is cut short
        pytest.fail(f"seed {seed}: " + "\n".join(
            f"process {k} exited {p.returncode}, its result {'written' if (out_dir / f'{k}.json').exists() else 'missing'}:"
            f"\n{err[-4000:]}" for k, (p, (_, err)) in enumerate(zip(procs, outs)) if p.returncode))
    results = [json.loads((out_dir / f"{k}.json").read_text()) for k in range(processes)]
    try:
        on_disk = _everything(live_dir)  # asserts each id is there once
    except Exception as e:
        raise AssertionError(f"seed {seed}: the folder cannot be read: {e}") from e
    acked: dict = {}
    for k, res in enumerate(results):
        table = _stress_rows(k, adds)
        rows = _by_id(table)
        for image_id, outcome in res["outcomes"].items():
            if outcome == "ok":
                assert image_id not in acked, (f"seed {seed}", image_id, "acknowledged twice", acked[image_id], k)
                acked[image_id] = rows[image_id]
            else:  # refused (taken, or its write failed): no row of this process's bytes
                assert on_disk.get(image_id) != rows[image_id], (f"seed {seed}", image_id, outcome, "yet on disk")
        # What this process's unlocked reader applied, poll by poll, is what is on disk at the end.
        assert res["reader"] == sorted(on_disk), (f"seed {seed}", k, "reader", set(on_disk) ^ set(res["reader"]))
    assert on_disk.keys() == acked.keys(), (f"seed {seed}", set(on_disk) ^ set(acked))
    assert all(on_disk[i] == acked[i] for i in acked), f"seed {seed}: bytes differ"
    outcomes = [o for r in results for o in r["outcomes"].values()]
    return dict(seed=seed, ok=outcomes.count("ok"), taken=outcomes.count("taken"), failed=outcomes.count("failed"),
                compactions=sum(r["compactions"] for r in results), polls=sum(r["polls"] for r in results))


def _stress_rows(k: int, adds: int) -> pa.Table:
    """Process k's rows: its own ids, then ids every process tries (each with this process's bytes)."""
    from live_log_stress import ids_of

    return random_rows(ids_of(k, adds), seed=100 + k)


def test_four_processes_adding_compacting_and_polling_keep_every_acknowledged_row_once(tmp_path):
    seed = int(os.environ.get("EDJE_STRESS_SEED", np.random.SeedSequence().entropy % 10 ** 6))
    got = _stress(tmp_path, processes=4, adds=150, seed=seed, budget_s=240)
    assert got["ok"] and got["taken"] and got["compactions"], got


@pytest.mark.slow
def test_four_processes_adding_two_thousand_images_each_keep_every_acknowledged_row_once(tmp_path):
    seed = int(os.environ.get("EDJE_STRESS_SEED", np.random.SeedSequence().entropy % 10 ** 6))
    got = _stress(tmp_path, processes=4, adds=2000, seed=seed, budget_s=900)
    print(got)
    assert got["ok"] >= 0.95 * 8000 and got["taken"] and got["failed"] and got["compactions"] >= 4, got


def _as_an_older_release_wrote_it(table: pa.Table) -> pa.Table:
    """The table with EDJE metadata that lacks every field whose value is its default (a release before them)."""
    import dataclasses

    from edje.schemas.token_table import METADATA_KEY

    raw = json.loads(table.schema.metadata[METADATA_KEY])
    defaults = {f.name: f.default for f in dataclasses.fields(TableMetadata) if f.default is not dataclasses.MISSING}
    older = {k: v for k, v in raw.items() if not (k in defaults and defaults[k] == v and k != "schema_version")}
    assert len(older) < len(raw)
    return table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(older).encode()})


def test_a_folder_an_older_release_wrote_is_read_and_appended_to(tmp_path):
    import pyarrow.parquet as pq

    from edje.serving.live_record import record, segment_header

    older = _as_an_older_release_wrote_it(random_rows(["o0", "o1", "o2"]))
    (tmp_path / "parts").mkdir()
    part = "0000000000000001-0000000000000002.parquet"
    pq.write_table(older.slice(0, 2), tmp_path / "parts" / part)
    (tmp_path / "MANIFEST").write_text(json.dumps(dict(through=2, parts=[dict(name=part, first=1, last=2, rows=2,
                                                                               bytes=1)])))
    (tmp_path / "LOG").write_bytes(segment_header(older.schema, 3) + record(3, older.slice(2, 1).to_batches()[0]))
    replica = LiveLog(str(tmp_path), LiveLogConfig(part_rows=2), expected=EXPECTED)
    assert replica.poll().column("image_id").to_pylist() == ["o0", "o1", "o2"]
    new = random_rows(["n0"], seed=1)
    _add(replica, new)  # this release's metadata bytes after the older ones
    replica.compact()
    assert _everything(tmp_path) == {**_by_id(older), **_by_id(new)}
