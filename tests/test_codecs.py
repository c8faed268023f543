"""Token codecs: round trip within half a quantization step, numpy == torch, bytes per image."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from edje.schemas.codecs import CodecError, TokenCodec, bytes_per_image
from edje.schemas.config import CodecConfig

CASES = [("int8", None), ("int4", None), ("int4", 32), ("fp16", None), ("fp32", None)]


def _tokens(b=3, n=64, d=384, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, n, d)).astype(np.float32) * rng.uniform(0.01, 5, size=(b, n, 1)).astype(np.float32)
    x[0, 0] = 0.0  # an all-zero token must survive too
    return x


@pytest.mark.parametrize("quant,group", CASES)
def test_round_trip_within_half_step(quant, group):
    codec = TokenCodec(CodecConfig(quant, group), 64, 384)
    x = _tokens()
    blob, scales = codec.encode(x)
    assert blob.shape == (3, codec.blob_bytes) and blob.dtype == np.uint8
    y = codec.decode(blob, scales)
    assert y.shape == x.shape
    if quant in ("int8", "int4"):
        step = np.repeat(scales.astype(np.float32).reshape(3, 64, -1), codec.group_size, axis=-1).reshape(x.shape)
        assert np.all(np.abs(y - x) <= step / 2 + 1e-6 * np.abs(x))
        assert scales.dtype == np.float16
    elif quant == "fp16":
        np.testing.assert_allclose(y, x.astype(np.float16).astype(np.float32))
    else:
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("quant,group", CASES)
def test_numpy_and_torch_paths_agree(quant, group):
    codec = TokenCodec(CodecConfig(quant, group), 64, 384)
    x = _tokens(seed=1)
    blob_np, sc_np = codec.encode(x)
    blob_t, sc_t = codec.encode_torch(torch.from_numpy(x))
    np.testing.assert_array_equal(blob_np, blob_t.numpy())
    if sc_np is not None:
        np.testing.assert_array_equal(sc_np, sc_t.numpy())
    np.testing.assert_array_equal(codec.decode(blob_np, sc_np),
                                  codec.decode_torch(blob_t, sc_t).numpy())


def test_bytes_per_image_of_64x384():
    assert bytes_per_image(64, 384, "fp16") == 49_152
    assert bytes_per_image(64, 384, "int8") <= 24_800
    assert bytes_per_image(64, 384, "int4") <= 12_500


def test_bytes_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "edje.schemas.codecs", "--tokens", "64", "--width", "384"],
                         capture_output=True, text=True, check=True).stdout
    assert "49,152" in out and "24,704" in out and "12,416" in out


def test_bad_input_is_named():
    codec = TokenCodec(CodecConfig("int8"), 64, 384)
    with pytest.raises(CodecError, match=r"\[B, 64, 384\]"):
        codec.encode(np.zeros((2, 32, 384), np.float32))
    with pytest.raises(CodecError, match="floating point"):
        codec.encode(np.zeros((2, 64, 384), np.int32))
    blob, scales = codec.encode(_tokens())
    with pytest.raises(CodecError, match="needs scales"):
        codec.decode(blob)
    with pytest.raises(CodecError, match="blob must be"):
        codec.decode(blob[:, :-1], scales)
    with pytest.raises(CodecError, match="group_size 100 does not divide"):
        TokenCodec(CodecConfig("int4", 100), 64, 384)
    with pytest.raises(ValueError, match="group_size applies to int4"):
        CodecConfig("int8", 32)
