"""Token tables: round trip, sorted blobs, metadata checks that name the mismatching field."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from edje.schemas.token_table import (
    TableMetadata,
    TableMismatchError,
    build_table,
    decode_tokens,
    read_metadata,
    read_token_table,
    read_token_tables,
    vector_matrix,
    write_token_table,
)


def _meta(**kw):
    base = dict(kind="compressed", backbone="edje-tiny-clip", pretrained=None, feature_layer="final",
                num_tokens=16, width=64, quantization="int8", embed_dim=32, adapter_hash="abc123")
    return TableMetadata(**{**base, **kw})


def _rows(n=10, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"img_{i:03d}" for i in rng.permutation(n)]
    return ids, rng.standard_normal((n, 16, 64)).astype(np.float32), rng.standard_normal((n, 32)).astype(np.float32)


@pytest.mark.parametrize("quant", ["fp16", "int8", "int4"])
def test_round_trip_sorted(tmp_path, quant):
    meta = _meta(quantization=quant)
    ids, tokens, emb = _rows()
    path = str(tmp_path / "t.parquet")
    write_token_table(build_table(meta, ids, tokens, emb, urls=[f"http://x/{i}" for i in ids]), path)
    table, got = read_token_table(path, backbone="edje-tiny-clip", num_tokens=16)
    assert got == meta
    assert table.column("image_id").to_pylist() == sorted(ids)
    order = np.argsort(ids)
    dec = decode_tokens(table, meta)
    tol = {"fp16": 1e-2, "int8": 0.05, "int4": 0.8}[quant]
    assert np.abs(dec - tokens[order]).max() < tol
    np.testing.assert_array_equal(vector_matrix(table.column("image_embedding")), emb[order])
    # the token matrix is one fixed-size binary blob, not a list column
    schema = pq.read_schema(path)
    assert str(schema.field("tokens").type).startswith("fixed_size_binary")
    assert pq.ParquetFile(path).metadata.row_group(0).num_rows <= 128


def test_training_table_carries_caption_and_text_embedding(tmp_path):
    meta = _meta(kind="raw", quantization="fp16", adapter_hash=None)
    ids, tokens, emb = _rows(4)
    caps = [f"caption {i}" for i in ids]
    path = str(tmp_path / "raw.parquet")
    write_token_table(build_table(meta, ids, tokens, emb, captions=caps, text_embeddings=emb * 2), path)
    table, _ = read_token_table(path, kind="raw")
    assert table.column("caption").to_pylist() == sorted(caps)
    # Each row's text embedding is its own caption's, exactly as given (float32, sorted with the row).
    # That the encode job writes the backbone's encode_text(caption) there is checked on its tables in
    # tests/test_train_ray.py::test_training_tables_hold_the_backbones_text_embedding_of_each_caption.
    order = np.argsort(ids)
    np.testing.assert_array_equal(vector_matrix(table.column("text_embedding")), (emb * 2)[order])


def test_reader_rejects_a_table_from_another_model(tmp_path):
    ids, tokens, emb = _rows(3)
    p1 = str(tmp_path / "a.parquet")
    write_token_table(build_table(_meta(), ids, tokens, emb), p1)
    with pytest.raises(TableMismatchError, match="backbone is 'edje-tiny-clip', expected 'ViT-B-16-SigLIP2'") as e:
        read_token_table(p1, backbone="ViT-B-16-SigLIP2")
    assert e.value.field == "backbone"
    with pytest.raises(TableMismatchError, match="adapter_hash"):
        read_token_table(p1, adapter_hash="other")
    p2 = str(tmp_path / "b.parquet")
    write_token_table(build_table(_meta(num_tokens=16, feature_layer="penultimate"), ids, tokens, emb), p2)
    with pytest.raises(TableMismatchError, match="feature_layer"):
        read_token_tables([p1, p2])
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(pq.read_table(p1).replace_schema_metadata(None), plain)
    with pytest.raises(TableMismatchError, match="metadata"):
        read_metadata(plain)


def test_bad_shapes_are_named():
    ids, tokens, emb = _rows(3)
    with pytest.raises(Exception, match=r"\[B, 16, 64\]"):
        build_table(_meta(), ids, tokens[:, :8], emb)
    with pytest.raises(ValueError, match="image_embedding must have shape"):
        build_table(_meta(), ids, tokens, emb[:, :5])


def test_expand_paths_takes_files_folders_and_globs(tmp_path):
    from edje.schemas.token_table import expand_paths
    ids, tokens, emb = _rows(3)
    for i in range(2):
        write_token_table(build_table(_meta(), ids, tokens, emb), str(tmp_path / f"part-{i}.parquet"))
    (tmp_path / "notes.txt").write_text("not a table")
    both = [str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")]
    assert expand_paths([str(tmp_path)]) == both
    assert expand_paths([str(tmp_path / "part-*.parquet")]) == both
    assert expand_paths([both[1]]) == [both[1]]
    with pytest.raises(FileNotFoundError, match="matches no files"):
        expand_paths([str(tmp_path / "zz-*.parquet")])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        expand_paths([str(tmp_path / "missing.parquet")])
