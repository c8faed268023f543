"""The memory-mapped token store and first-stage index (storage/table_cache.py): the same rows as the in-RAM store,
no token bytes read at start-up, no half-built cache ever used, other models' tables refused, and a saved IVF-PQ
index read back with IO_FLAG_MMAP answering like the one built in RAM."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import faiss
import numpy as np
import pytest

from edje.model.edje import read_checkpoint_config
from edje.schemas.token_table import TableMismatchError, build_table_from_blobs, write_token_table
from edje.serving.random_corpus import (
    SyntheticRows,
    synthetic_ids,
    synthetic_metadata,
    synthetic_rows,
    write_random_corpus,
    write_synthetic_tables,
)
from edje.storage.embedding_index import EmbeddingIndex, mapped_index
from edje.storage.table_cache import CacheConfig, ImageIds, RowFile, open_tables
from edje.storage.token_store import TokenStore

faiss.omp_set_num_threads(1)  # OpenMP threads spinning on a shared 2-core machine cost more than they give
BIG_ROWS = 40_000  # 40,000 x 2,080 B = 83 MB of token rows: start-up must not read them


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_edje_config):
    return write_random_corpus(str(tmp_path_factory.mktemp("mmap-corpus")), tiny_edje_config, num_images=40,
                               num_tables=3)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Synthetic int8 16 x 128 tables (the shipped codec's rows) and their metadata."""
    meta = synthetic_metadata()
    paths = write_synthetic_tables(str(tmp_path_factory.mktemp("mmap-big")), meta, BIG_ROWS,
                                   SyntheticRows(rows_per_table=15_000))
    return paths, meta


def _same_rows(a: TokenStore, b: TokenStore, ids) -> None:
    ga, gb = a.gather_blobs(ids, with_urls=True), b.gather_blobs(ids, with_urls=True)
    assert not ga.missing and not gb.missing
    np.testing.assert_array_equal(ga.blob, gb.blob)
    np.testing.assert_array_equal(ga.scales, gb.scales)
    assert ga.urls == gb.urls
    np.testing.assert_array_equal(a.embeddings_of(ids), b.embeddings_of(ids))


def test_mapped_store_returns_the_rows_of_the_in_ram_store(corpus):
    ckpt = read_checkpoint_config(corpus.checkpoint)
    mapped = TokenStore.load(corpus.compressed_tables, ckpt)
    ram = TokenStore.load(corpus.compressed_tables, ckpt, mapped=False)
    assert mapped.info()["memory_mapped"] and not ram.info()["memory_mapped"]
    assert isinstance(mapped.blob.base, RowFile) and mapped.blob.base.path.startswith(mapped.folder)  # read on demand
    assert len(mapped) == len(ram) == 40 and mapped.image_ids == ram.image_ids == sorted(corpus.image_ids)
    ids = list(np.random.default_rng(0).permutation(corpus.image_ids)) + corpus.image_ids[:3]  # any order, repeats
    _same_rows(mapped, ram, ids)
    np.testing.assert_array_equal(mapped.gather(ids), ram.gather(ids))
    assert mapped.gather_blobs(["nope", ids[0], "nope", "img_0000"]).missing == ["nope", "img_0000"]
    assert mapped.memory_bytes == ram.memory_bytes and "img_00003" in mapped.row and "img_0003" not in mapped.row
    # A live image goes after the mapped rows, in RAM; both kinds of row come back in request order.
    table = build_table_from_blobs(mapped.meta, ["live-1"], ram.blob[[0]], ram.scales[[0]], ram.embeddings[[0]],
                                   urls=["http://x/live-1.jpg"])
    for store in (mapped, ram):
        store.add_table(table)
    _same_rows(mapped, ram, ["live-1", ids[5], "live-1"])
    assert mapped.image_ids[40] == "live-1" and mapped.row.get("live-1") == 40
    with pytest.raises(ValueError, match="already"):
        mapped.add_table(table)
    # The shards of a mapped corpus are those of the in-RAM one, and together the whole corpus.
    seen = []
    for s in range(3):
        m = TokenStore.load(corpus.compressed_tables, ckpt, shard=s, num_shards=3)
        r = TokenStore.load(corpus.compressed_tables, ckpt, shard=s, num_shards=3, mapped=False)
        assert m.image_ids == r.image_ids and m.folder != mapped.folder
        _same_rows(m, r, list(m.image_ids))
        seen += list(m.image_ids)
    assert sorted(seen) == sorted(corpus.image_ids)


def _measure_load(paths, mapped: bool, cache_root: str) -> dict:
    """RSS and bytes read by a fresh process around TokenStore.load (and a gather of 100 rows)."""
    code = f"""
import json, sys
def status():
    d = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)
    io = dict(l.split(':', 1) for l in open('/proc/self/io'))
    return int(d['VmRSS'].split()[0]) * 1024, int(io['rchar']), int(io['read_bytes'])
from edje.storage.table_cache import CacheConfig
from edje.storage.token_store import TokenStore
import numpy as np
before = status()
store = TokenStore.load({list(paths)!r}, mapped={mapped}, cache=CacheConfig(root={cache_root!r}))
loaded = status()
ids = [store.image_ids[int(i)] for i in np.random.default_rng(0).choice(len(store), 100, replace=False)]
got = store.gather_blobs(ids)
gathered = status()
print(json.dumps(dict(rss=loaded[0] - before[0], rchar=loaded[1] - before[1], rss_gather=gathered[0] - loaded[0],
                      rows=len(store), blob_sum=int(got.blob.sum()))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_startup_of_a_mapped_store_reads_no_token_bytes(big, tmp_path):
    paths, meta = big
    root = str(tmp_path / "cache")
    open_tables(paths, meta, ["tokens", "token_scales", "image_embedding", "url"], config=CacheConfig(root=root))
    blob_bytes = BIG_ROWS * meta.codec.bytes_per_image
    mapped = _measure_load(paths, True, root)
    ram = _measure_load(paths, False, root)
    assert mapped["rows"] == ram["rows"] == BIG_ROWS and mapped["blob_sum"] == ram["blob_sum"]
    # In RAM the rows are resident and were read; mapped, start-up touched neither (ids: 40,000 x 13 B).
    assert ram["rss"] > blob_bytes and ram["rchar"] > blob_bytes
    assert mapped["rss"] < blob_bytes / 10 and mapped["rchar"] < blob_bytes / 10, (mapped, blob_bytes)
    assert mapped["rss_gather"] < blob_bytes / 10  # 100 rows are copied in, not their file's pages mapped


def test_a_half_built_cache_is_never_used(big, tmp_path):
    paths, meta = big
    root = str(tmp_path / "cache")
    code = f"""
from edje.storage.table_cache import CacheConfig, open_tables
from edje.schemas.token_table import read_metadata
paths = {list(paths)!r}
open_tables(paths, read_metadata(paths[0]), ["tokens", "token_scales", "image_embedding", "url"],
            config=CacheConfig(root={root!r}, batch_rows=16))
"""
    builder = subprocess.Popen([sys.executable, "-c", code])
    deadline, tmp = time.time() + 120, []
    while time.time() < deadline and not tmp and builder.poll() is None:
        tmp = glob.glob(os.path.join(root, "*", "tokens.npy.tmp-*"))
        time.sleep(0.005)
    builder.send_signal(signal.SIGKILL)  # a crash in the middle of writing the token rows
    builder.wait()
    assert tmp, "the build ended before it could be killed mid-way"
    folder = os.path.dirname(tmp[0])
    assert not os.path.exists(os.path.join(folder, "tokens.npy"))  # never under the name readers open
    store = TokenStore.load(paths, cache=CacheConfig(root=root))
    assert store.folder == folder and not glob.glob(os.path.join(folder, "*.tmp-*"))  # rebuilt, leftovers gone
    ram = TokenStore.load(paths, mapped=False)
    ids = synthetic_ids(0, BIG_ROWS)[::997]
    _same_rows(store, ram, ids)
    # A column file cut short (a disk that filled up) is not mapped either: it is rebuilt.
    with open(os.path.join(folder, "tokens.npy"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    _same_rows(TokenStore.load(paths, cache=CacheConfig(root=root)), ram, ids)


def test_tables_of_another_model_are_refused_before_any_cache_is_built(big, tmp_path):
    paths, meta = big
    other = synthetic_metadata(adapter_hash="0123456789abcdef")
    bad = str(tmp_path / "other.parquet")
    blob, scales, emb = synthetic_rows(other, 0, 4)
    write_token_table(build_table_from_blobs(other, synthetic_ids(0, 4), blob, scales, emb), bad)
    root = str(tmp_path / "cache")
    with pytest.raises(TableMismatchError, match="adapter_hash") as err:
        TokenStore.load([paths[0], bad], cache=CacheConfig(root=root), adapter_hash=meta.adapter_hash)
    assert err.value.field == "adapter_hash" and not os.path.exists(root)
    with pytest.raises(TableMismatchError, match="adapter_hash"):  # a mismatch with the first table, unasked
        TokenStore.load([paths[0], bad], cache=CacheConfig(root=root))


def test_a_rewritten_table_is_served_from_a_new_cache(tmp_path):
    meta = synthetic_metadata(width=32)
    path = str(tmp_path / "t.parquet")
    root = CacheConfig(root=str(tmp_path / "cache"))
    blob, scales, emb = synthetic_rows(meta, 0, 50)
    write_token_table(build_table_from_blobs(meta, synthetic_ids(0, 50), blob, scales, emb), path)
    first = TokenStore.load([path], cache=root)
    np.testing.assert_array_equal(first.gather_blobs(["img_000000007"]).blob, blob[[7]])
    time.sleep(0.01)
    write_token_table(build_table_from_blobs(meta, synthetic_ids(0, 50), 255 - blob, scales, emb), path)
    again = TokenStore.load([path], cache=root)
    assert again.folder != first.folder
    np.testing.assert_array_equal(again.gather_blobs(["img_000000007"]).blob, 255 - blob[[7]])


def test_ivf_pq_saved_and_mapped_answers_like_the_index_built_in_ram(tmp_path):
    meta = synthetic_metadata(width=32, embed_dim=32)
    paths = write_synthetic_tables(str(tmp_path / "tables"), meta, 6000, SyntheticRows(rows_per_table=2500, clusters=50))
    cache = CacheConfig(root=str(tmp_path / "cache"))
    index, got_meta = mapped_index(paths, "IVF32,PQ8x4", "nprobe=8", cache=cache)
    assert got_meta == meta and os.path.exists(index.index_path) and index.build_info["rows"] == 6000
    assert isinstance(index.copy, RowFile)  # the exact vectors stay in the cache file: nothing copied into the replica
    vectors = index.copy[:]
    ram = EmbeddingIndex(list(index.ids), vectors, "IVF32,PQ8x4", search_params="nprobe=8")
    queries = vectors[::300] + 0.01
    s1, r1 = index.search(queries, 10)
    s2, r2 = ram.search(queries, 10)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_allclose(s1, s2, rtol=1e-6)
    # What the build measured is what the in-RAM index measures on the same 1,000 stored vectors.
    assert index.build_info["recall_at_10_vs_exact"] == pytest.approx(ram.recall_vs_exact(10), abs=1e-3)
    assert 0 < index.build_info["recall_at_10_vs_exact"] < 1 and index.nbytes() == os.path.getsize(index.index_path)
    # Opened again: the saved file is mapped as it is, not rebuilt.
    stamp = os.stat(index.index_path).st_mtime_ns
    again, _ = mapped_index(paths, "IVF32,PQ8x4", "nprobe=8", cache=cache)
    assert os.stat(again.index_path).st_mtime_ns == stamp
    np.testing.assert_array_equal(again.search(queries, 10)[1], r1)
    # Image queries read the exact stored vector; a live row (the mapped index is read-only) is found beside it.
    want = index.ids[123]
    v, missing = again.vectors([want])
    assert not missing and np.array_equal(v[0], vectors[123])
    new = vectors[123] * -1.0
    again.add(["live-x"], new[None])
    scores, rows = again.search(new[None], 3)
    assert again.ids[int(rows[0, 0])] == "live-x" and len(again) == 6001
    assert again.rows_of(["live-x", "nope"])[1] == ["nope"]
    np.testing.assert_array_equal(again.vectors(["live-x"])[0][0], new)
    _, rows = again.search(new[None], 3, exclude=["live-x"])
    assert "live-x" not in [again.ids[int(r)] for r in rows[0]]


def test_first_stage_serves_ivf_pq_from_the_mapped_files(corpus):
    from edje.serving.first_stage import FirstStage

    stage = FirstStage(corpus.compressed_tables, "IVF4,PQ8x4", index_search_params="nprobe=4", device="cpu")
    assert stage.index.index_path is not None and isinstance(stage.index.ids, ImageIds)
    hits = stage.search(corpus.captions[0], 5)
    assert len(hits) == 5 and all(h[0] in corpus.image_ids for h in hits)
    found = stage.search_image(corpus.image_ids[3], None, 1.0, 5)
    assert not found.missing and corpus.image_ids[3] not in [h[0] for h in found.hits]


def test_image_ids_lookup_cannot_alias_other_ids():
    ids = ImageIds(np.array(sorted([b"a", b"ab", b"b\xc3\xa9", b"zz"]), dtype="S3"))
    assert list(ids.rows(["ab", "abc", "a\0", "", "bé", "zz", "zzz"])) == [1, -1, -1, -1, 2, 3, -1]
    assert list(ids) == ["a", "ab", "bé", "zz"] and ids[-1] == "zz" and "bé" in ids
    ids.extend(["new", "a"])
    assert ids.get("new") == 4 and ids.get("a") == 0 and len(ids) == 6 and ids[5] == "a"
    with pytest.raises(ValueError, match="NUL"):
        from edje.storage.table_cache import id_array

        id_array(["ok", "bad\0"])
