"""Training tables with mirrored images (`--augment hflip`): each image's mirror is its own row, encoded from the
mirrored pixels; training sets those rows apart and finds them by the image's id; serving tables never carry them."""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

from edje.pipeline.encode import EncodeBatch, EncoderSpec, describe_model
from edje.pipeline.write import commit_shard, write_parts
from edje.schemas.config import BackboneConfig
from edje.schemas.encode_job import EncodeJobConfig
from edje.schemas.token_table import TableMetadata, decode_tokens, read_token_table
from edje.training.batches import MirrorLookup, drop_augmented

BACKBONE = BackboneConfig("edje-tiny-clip", random_weights=True)


def _batch(size: int) -> dict:
    rng = np.random.default_rng(0)
    n = 3
    return {"status": np.array(["ok", "timeout", "ok"], dtype=object),
            "image": rng.integers(0, 256, (n, size, size, 3), np.uint8),
            "caption": np.array(["a red circle left of a blue square", "x", "a cat above a dog"], dtype=object),
            "shard": np.zeros(n, np.int32), "row": np.arange(n, dtype=np.int32),
            "image_id": np.array(["img0", "img1", "img2"], dtype=object),
            "url": np.array(["u0", "u1", "u2"], dtype=object), "detail": np.array(["", "slow", ""], dtype=object)}


def test_mirrored_rows_hold_the_tokens_of_the_mirrored_pixels(tmp_path):
    spec = EncoderSpec(BACKBONE, None, "fp16", None, torch_threads=1, augment="hflip")
    info = describe_model(spec)
    assert info.meta.augment == "hflip"
    torch.manual_seed(0)
    actor = EncodeBatch(spec)
    batch = _batch(info.image_size)
    out = str(tmp_path / "out")
    parts = write_parts(actor(batch), out).column("part").to_pylist()
    stats = commit_shard(out, 0, parts, 3, info.meta.to_bytes().decode())
    assert stats["images_ok"] == 2 and stats["augmented_rows"] == 2
    table, meta = read_token_table(stats["table"], kind="raw", augment="hflip")
    ids = table.column("image_id").to_pylist()
    assert ids == ["img0", "img0#hflip", "img2", "img2#hflip"]
    assert table.column("source_image_id").to_pylist() == [None, "img0", None, "img2"]
    assert table.column("augment").to_pylist() == [None, "hflip", None, "hflip"]
    assert table.column("caption").to_pylist()[1] == "a red circle left of a blue square"  # the source's, as written

    tokens = decode_tokens(table, meta)
    ok = batch["image"][[0, 2]]
    mirrored = actor.encoder.encode(np.ascontiguousarray(ok[:, :, ::-1])).blob
    plain = actor.encoder.encode(ok).blob
    as_stored = meta.codec.decode(mirrored, None)
    np.testing.assert_allclose(tokens[[1, 3]], as_stored, rtol=0, atol=2e-3 * np.abs(as_stored).max())
    np.testing.assert_allclose(tokens[[0, 2]], meta.codec.decode(plain, None), rtol=0, atol=2e-3 * np.abs(as_stored).max())
    assert np.abs(tokens[1] - tokens[0]).max() > 0.1 * np.abs(tokens[0]).max()  # a mirror, not a copy

    # Training: the mirrored rows are no training rows; each image finds its mirror by id.
    assert drop_augmented(table).column("image_id").to_pylist() == ["img0", "img2"]
    mirrors = MirrorLookup([stats["table"]])
    got, found = mirrors.get(["img2", "img1", "img0"])
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(got[[0, 2]].numpy(), tokens[[3, 1]].astype(np.float16).astype(np.float32))
    assert not got[1].any()


def test_serving_tables_never_hold_augmented_rows(tmp_path):
    with pytest.raises(ValueError, match="serving"):
        EncodeJobConfig(output=str(tmp_path), adapter="some/checkpoint", augment="hflip")
    with pytest.raises(ValueError, match="training rows"):
        EncoderSpec(BACKBONE, "some/checkpoint", "int8", None, augment="hflip")
    with pytest.raises(ValueError, match="raw"):
        TableMetadata(kind="compressed", backbone="b", pretrained=None, feature_layer="final", num_tokens=2, width=4,
                      quantization="int8", embed_dim=3, augment="hflip")
    with pytest.raises(ValueError, match="augment"):
        EncodeJobConfig(output=str(tmp_path), augment="vflip")

    from edje.pipeline.compress_job import same_metadata
    from edje.schemas.token_table import build_table, write_token_table
    meta = TableMetadata(kind="raw", backbone="b", pretrained=None, feature_layer="final", num_tokens=2, width=4,
                         quantization="fp16", embed_dim=3, augment="hflip")
    table = build_table(meta, ["a", "a#hflip"], np.zeros((2, 2, 4), np.float32), np.zeros((2, 3), np.float32),
                        captions=["c", "c"], text_embeddings=np.zeros((2, 3), np.float32), sources=[None, "a"])
    path = str(tmp_path / "raw.parquet")
    write_token_table(table, path)
    with pytest.raises(ValueError, match="serving tables never carry"):
        same_metadata([path])
    assert pc.count(table.column("augment")).as_py() == 1  # nulls are not counted: one mirrored row
