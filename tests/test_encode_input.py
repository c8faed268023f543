"""Streaming --input: several files, folders, globs, LAION parquet parts; duplicates across the whole
list; plans that do not depend on how the list is split or bucketed; memory that does not grow with rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edje.pipeline import dedupe, reasons
from edje.pipeline.plan import PlanConfig, plan_input, read_shard_input, url_image_id, with_image_ids
from edje.pipeline.url_source import ReadOptions, expand_inputs

ROOT = Path(__file__).resolve().parent.parent


def _plan(inputs, shard_size=4, bucket_rows=400_000, output=None, **read):
    shards = []
    plan = plan_input(expand_inputs(inputs), ReadOptions(**read), PlanConfig(shard_size, bucket_rows=bucket_rows),
                      output, on_shard=lambda sid, rows: shards.append(with_image_ids(rows)))
    return plan, (pa.concat_tables(shards) if shards else None)


def _laion_parts(folder: Path, n_parts: int = 3, rows: int = 10) -> list:
    """LAION-style parts (URL, TEXT): part k repeats a url of part k-1 and holds one empty caption."""
    folder.mkdir()
    expected = []
    for k in range(n_parts):
        urls = [f"http://h/{k}/{i}.jpg" for i in range(rows)]
        texts = [f"picture {k}.{i}" for i in range(rows)]
        if k:
            urls[3] = f"http://h/{k - 1}/5.jpg"  # a duplicate across files: the earlier file's row is kept
        texts[7] = " "
        pq.write_table(pa.table({"URL": urls, "TEXT": texts, "similarity": [0.3] * rows}), folder / f"part-{k:05d}.parquet")
        expected += [u for i, u in enumerate(urls) if i != 7 and not (k and i == 3)]
    (folder / "_SUCCESS").write_text("")  # markers next to the parts are not url lists
    return expected


def test_folder_glob_and_file_list_give_the_same_plan_across_files(tmp_path):
    expected = _laion_parts(tmp_path / "laion")
    cols = dict(url_col="URL", caption_col="TEXT")
    by_folder, rows = _plan(str(tmp_path / "laion"), **cols)
    by_glob, _ = _plan(str(tmp_path / "laion" / "part-*.parquet"), **cols)
    by_list, _ = _plan([str(p) for p in sorted((tmp_path / "laion").glob("part-*"))], **cols)
    assert rows.column("url").to_pylist() == expected  # input order across files, first occurrence kept
    assert by_folder.failed == {reasons.DUPLICATE_URL: 2, reasons.EMPTY_CAPTION: 3}
    assert by_folder.rows_in == 30 and by_folder.rows_kept == 25
    assert by_folder.examples[reasons.DUPLICATE_URL][0].startswith("row 13: 'http://h/0/5.jpg'")
    # shards are runs of 4 kept rows that cross file boundaries; the three spellings plan the same shards
    assert by_folder.shards.column("rows").to_pylist() == [4] * 6 + [1]
    assert by_folder.digest == by_glob.digest == by_list.digest
    assert by_folder.shards.equals(by_list.shards)
    assert rows.column("image_id").to_pylist() == [url_image_id(u) for u in expected]


def test_duplicate_ids_across_mixed_formats_and_the_result_does_not_depend_on_buckets(tmp_path):
    (tmp_path / "a.tsv").write_text("url\tcaption\timage_id\nhttp://h/1.jpg\tone\tid1\nhttp://h/2.jpg\ttwo\tid2\n"
                                    "http://h/3.jpg\tthree\tid3\n")
    (tmp_path / "b.csv").write_text('url,caption,image_id\nhttp://h/4.jpg,"four, quoted",id4\n'
                                    "http://h/2.jpg,two again,id9\nhttp://h/5.jpg,claims id1,id1\n")
    pq.write_table(pa.table({"url": ["http://h/6.jpg", "http://h/4.jpg", "http://h/7.jpg"],
                             "caption": ["six", "four again", "seven"], "image_id": ["id6", "id8", "id4"]}),
                   tmp_path / "c.parquet")
    inputs = [str(tmp_path / n) for n in ("a.tsv", "b.csv", "c.parquet")]
    one, rows = _plan(inputs, shard_size=2)
    many, _ = _plan(inputs, shard_size=2, bucket_rows=1)  # one bucket per row of the estimate
    assert rows.column("image_id").to_pylist() == ["id1", "id2", "id3", "id4", "id6"]
    assert rows.column("caption").to_pylist()[3] == "four, quoted"
    # url duplicates first (id9, id8 reuse urls), then ids claimed by a second url (id1, id4)
    assert one.failed == {reasons.DUPLICATE_URL: 2, reasons.DUPLICATE_IMAGE_ID: 2}
    assert one.digest == many.digest and one.failed == many.failed and one.examples == many.examples


def test_the_bucket_hash_depends_only_on_the_bytes_and_dedupe_is_exact_when_every_hash_collides(tmp_path, monkeypatch):
    values = ["", "a", "a\0", "12345678", "123456789", "é" * 9, "http://h/" + "x" * 300, "http://h/1.jpg"] * 2
    h = dedupe.string_hash(pa.array(values))
    assert len(set(h[:8].tolist())) == 8 and (h[:8] == h[8:]).all()
    for same in (pa.array(["pad"] + values).slice(1), pa.chunked_array([values[:3], values[3:]]),
                 pa.array(values, pa.large_string()), pa.array([v.encode() for v in values], pa.binary())):
        assert (dedupe.string_hash(same) == h).all()
    (tmp_path / "a.tsv").write_text("url\tcaption\timage_id\n" + "".join(
        f"http://h/{i % 7}.jpg\tc{i}\tid{i % 5}\n" for i in range(40)))
    honest, _ = _plan(str(tmp_path / "a.tsv"), shard_size=3, bucket_rows=8)
    monkeypatch.setattr(dedupe, "string_hash", lambda values: np.zeros(len(values), np.uint64))
    colliding, rows = _plan(str(tmp_path / "a.tsv"), shard_size=3, bucket_rows=8)
    assert rows.column("url").to_pylist() == [f"http://h/{i}.jpg" for i in range(5)]  # id i%5 repeats from row 5
    assert colliding.digest == honest.digest and colliding.failed == honest.failed
    assert colliding.examples == honest.examples


def test_shards_written_as_row_groups_read_back_and_files_without_ids_are_refused_with_files_with(tmp_path):
    _laion_parts(tmp_path / "laion", n_parts=2, rows=50)
    out = tmp_path / "out"
    plan = plan_input(expand_inputs(str(tmp_path / "laion")), ReadOptions(url_col="URL", caption_col="TEXT"),
                      PlanConfig(shard_size=7, shards_per_file=3), str(out))
    files = sorted(p.name for p in (out / "_input").iterdir())
    assert plan.shards.num_rows == 14 and files == [f"{i:05d}.parquet" for i in range(5)]  # 3 shards a file
    _, rows = _plan(str(tmp_path / "laion"), shard_size=7, url_col="URL", caption_col="TEXT")
    back = pa.concat_tables([read_shard_input(str(out / "_input" / f"{s // 3:05d}.parquet"), s % 3) for s in range(14)])
    assert back.equals(rows)
    pq.write_table(pa.table({"URL": ["http://h/x.jpg"], "TEXT": ["x"], "image_id": ["x"]}),
                   tmp_path / "laion" / "part-00009.parquet")
    with pytest.raises(ValueError, match="image id column"):
        _plan(str(tmp_path / "laion"), url_col="URL", caption_col="TEXT")


_MEMORY_PROBE = """
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from edje.pipeline.plan import PlanConfig, plan_input
from edje.pipeline.url_source import ReadOptions, expand_inputs
folder, n, write = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "write"
if write:  # a separate process writes the list, so its buffers do not count
    for k, start in enumerate(range(0, n, 50_000)):
        i = np.arange(start, min(n, start + 50_000))
        pq.write_table(pa.table({"url": pa.array([f"http://h/{j}/{j * 7919 % 10007}.jpg" for j in i]),
                                 "caption": pa.array([f"caption number {j} of a long list" for j in i])}),
                       f"{folder}/part-{k:05d}.parquet")
    sys.exit(0)
plan = plan_input(expand_inputs(folder), ReadOptions(batch_rows=10_000), PlanConfig(500, bucket_rows=25_000), None)
print(json.dumps({"rows": plan.rows_kept, "peak": pa.default_memory_pool().max_memory()}))
"""


def test_planning_memory_does_not_grow_with_the_number_of_rows(tmp_path):
    peaks = {}
    for n in (50_000, 400_000):
        folder = tmp_path / f"list{n}"
        folder.mkdir()
        subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(folder), str(n), "write"], cwd=ROOT, check=True)
        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(folder), str(n), "plan"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["rows"] == n
        peaks[n] = got["peak"]
    print(peaks)
    assert peaks[50_000] > 0
    # 8x the rows, the same peak Arrow memory (bounded by batch_rows and bucket_rows), not 8x
    assert peaks[400_000] < 1.5 * peaks[50_000], peaks
