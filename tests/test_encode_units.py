"""Encode pipeline stages on their own: image normalisation, url-list validation, reasons, commit."""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from edje.model.image_decode import ImageRejected, decode_image, open_image, to_rgb
from edje.pipeline import reasons
from edje.pipeline.decode import PilResizer
from edje.pipeline.plan import PlanConfig, plan_input, url_image_id, with_image_ids
from edje.pipeline.url_source import ReadOptions, expand_inputs


def plan_rows(inputs, shard_size: int = 1000, **read):
    """Plan a url list without writing shards; returns (plan, kept rows with image ids, shards)."""
    shards = []
    plan = plan_input(expand_inputs(inputs), ReadOptions(**read), PlanConfig(shard_size=shard_size), None,
                      on_shard=lambda sid, rows: shards.append(with_image_ids(rows)))
    rows = pa.concat_tables(shards) if shards else None
    return plan, rows, shards


def _bytes(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _gradient(w: int = 48, h: int = 24) -> np.ndarray:
    """A non-symmetric test picture: red grows left to right, green top to bottom."""
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    return np.stack([x, y, np.full_like(x, 60)], -1).astype(np.uint8)


def test_exif_orientation_is_applied():
    upright = _gradient()
    stored = Image.fromarray(np.rot90(upright, k=1).copy())  # stored rotated 90 deg CCW ...
    exif = stored.getexif()
    exif[0x0112] = 6  # ... and tagged "rotate 90 CW to display"
    data = _bytes(stored, "PNG", exif=exif)
    out = np.asarray(to_rgb(open_image(data)))
    assert out.shape == upright.shape
    assert np.abs(out.astype(int) - upright).max() <= 1


@pytest.mark.parametrize("kind", ["cmyk", "gray", "rgba", "palette_alpha", "gray16", "rgba16", "la"])
def test_odd_modes_become_rgb(kind):
    rgb = _gradient()
    white_where_clear = rgb.copy()
    if kind == "cmyk":
        data, want = _bytes(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=98), rgb
    elif kind == "gray":
        g = np.asarray(Image.fromarray(rgb).convert("L"))
        data, want = _bytes(Image.fromarray(g), "JPEG", quality=98), np.repeat(g[..., None], 3, -1)
    elif kind == "rgba":
        a = np.full(rgb.shape[:2], 255, np.uint8)
        a[:, : rgb.shape[1] // 2] = 0  # left half fully transparent -> white
        white_where_clear[:, : rgb.shape[1] // 2] = 255
        data, want = _bytes(Image.fromarray(np.dstack([rgb, a]), "RGBA"), "PNG"), white_where_clear
    elif kind == "palette_alpha":
        im = Image.new("P", (8, 4), 0)
        im.putpalette([10, 20, 30] + [200, 100, 50] * 255)
        im.putpixel((0, 0), 1)
        data = _bytes(im, "PNG", transparency=0)
        want = np.full((4, 8, 3), 255, np.uint8)
        want[0, 0] = (200, 100, 50)
    elif kind == "gray16":
        g16 = (np.arange(48 * 24, dtype=np.uint32).reshape(24, 48) * 50).astype(np.uint16)
        data = _bytes(Image.fromarray(g16), "PNG")
        g8 = np.round(g16 / 65535 * 255).astype(np.uint8)
        want = np.repeat(g8[..., None], 3, -1)
    elif kind == "rgba16":
        import cv2  # PIL cannot write 16-bit colour PNGs; OpenCV (an img2dataset dependency) can

        a16 = np.full(rgb.shape[:2], 65535, np.uint16)
        a16[:, : rgb.shape[1] // 2] = 0
        white_where_clear[:, : rgb.shape[1] // 2] = 255
        bgra16 = np.dstack([rgb[..., ::-1].astype(np.uint16) * 257, a16])
        data, want = cv2.imencode(".png", bgra16)[1].tobytes(), white_where_clear
    else:  # "la": grayscale + alpha
        g = np.asarray(Image.fromarray(rgb).convert("L"))
        data = _bytes(Image.fromarray(np.dstack([g, np.full_like(g, 255)]), "LA"), "PNG")
        want = np.repeat(g[..., None], 3, -1)
    out = np.asarray(to_rgb(open_image(data)))
    assert out.dtype == np.uint8 and out.shape == want.shape
    tol = 12 if kind in ("cmyk", "gray") else 2  # JPEG loses a little
    assert np.abs(out.astype(int) - want.astype(int)).mean() <= tol


def test_decode_image_fits_model_size_like_open_clip():
    im = _gradient(96, 48)
    out = decode_image(_bytes(Image.fromarray(im), "PNG"), 16, "shortest")
    assert out.shape == (16, 16, 3)
    # shortest-side resize + centre crop keeps the middle: red spans ~64..191 of 255, not 0..255
    assert 40 < out[8, 0, 0] < 110 and 150 < out[8, -1, 0] < 220
    assert decode_image(_bytes(Image.fromarray(im), "PNG"), 16, "squash")[8, 0, 0] < 20


def _truncated_jpeg() -> bytes:
    rng = np.random.default_rng(0)
    data = _bytes(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)), "JPEG")
    return data[: len(data) // 2]


@pytest.mark.parametrize("data,reason", [
    (b"<html><body>404 not found</body></html>", reasons.NOT_AN_IMAGE),
    (b"", reasons.NOT_AN_IMAGE),
    (_truncated_jpeg(), reasons.TRUNCATED_IMAGE),
])
def test_bad_bodies_are_rejected_with_reason(data, reason):
    with pytest.raises(ImageRejected) as e:
        decode_image(data, 16)
    assert e.value.reason == reason


def test_decompression_bomb_rejected_before_decoding():
    bomb = _bytes(Image.new("1", (12000, 12000)), "PNG")  # 144 Mpx in ~20 kB
    assert len(bomb) < 100_000
    with pytest.raises(ImageRejected) as e:
        decode_image(bomb, 16, max_pixels=50_000_000)
    assert e.value.reason == reasons.DECOMPRESSION_BOMB
    small_limit = _bytes(Image.new("RGB", (100, 100)), "PNG")
    with pytest.raises(ImageRejected) as e:
        decode_image(small_limit, 16, max_pixels=9_999)
    assert e.value.reason == reasons.DECOMPRESSION_BOMB


def test_pil_resizer_speaks_img2dataset_protocol():
    resizer = PilResizer(32)
    img, w, h, ow, oh, err = resizer(io.BytesIO(_bytes(Image.fromarray(_gradient()), "PNG")))
    assert err is None and (w, h, ow, oh) == (32, 32, 48, 24)
    assert Image.open(io.BytesIO(img)).size == (32, 32)
    *_, err = resizer(io.BytesIO(b"not an image"))
    assert reasons.split_reason(err)[0] == reasons.NOT_AN_IMAGE


@pytest.mark.parametrize("message,reason", [
    ("HTTP Error 404: Not Found", reasons.HTTP_ERROR),
    ("HTTP Error 503: Service Unavailable", reasons.HTTP_ERROR),
    ("The read operation timed out", reasons.TIMEOUT),
    ("<urlopen error timed out>", reasons.TIMEOUT),
    ("<urlopen error [Errno 111] Connection refused>", reasons.CONNECTION_ERROR),
    ("<urlopen error [Errno -2] Name or service not known>", reasons.CONNECTION_ERROR),
    ("Remote end closed connection without response", reasons.CONNECTION_ERROR),
    ("unknown url type: 'ftp'", reasons.DOWNLOAD_ERROR),
    ("truncated_image: OSError: image file is truncated", reasons.TRUNCATED_IMAGE),
])
def test_error_messages_map_to_reasons(message, reason):
    assert reasons.split_reason(message)[0] == reason


def test_url_list_validation_tsv(tmp_path):
    lines = [
        b"url\tcaption\timage_id",
        b"http://h/1.jpg\ta red cube\tid1",
        b"http://h/2.jpg\t\tid2",  # empty caption
        b"http://h/3.jpg\t   \tid3",  # whitespace caption
        b"http://h/4.jpg\tbad \xff\xfe bytes\tid4",  # not UTF-8
        b"http://h/1.jpg\tsame url again\tid5",  # duplicate url
        b"only-one-field",  # malformed: field count
        b"no-scheme.jpg\tcaption\tid7",  # malformed: no url scheme
        b"http://h/8.jpg\tclaims id1\tid1",  # duplicate image id
        b"http://h/9.jpg\ta \"quoted\" caption\tid9",
        b"",
    ]
    path = tmp_path / "urls.tsv"
    path.write_bytes(b"\n".join(lines))
    got, rows, _ = plan_rows(str(path))
    assert rows.column("image_id").to_pylist() == ["id1", "id9"]
    assert rows.column("caption").to_pylist() == ["a red cube", 'a "quoted" caption']
    assert got.rows_in == 9
    assert got.failed == {reasons.EMPTY_CAPTION: 2, reasons.CAPTION_NOT_UTF8: 1, reasons.DUPLICATE_URL: 1,
                          reasons.MALFORMED_ROW: 2, reasons.DUPLICATE_IMAGE_ID: 1}
    assert all(got.examples[r] for r in got.failed)


def test_url_list_without_header_or_ids_and_parquet(tmp_path):
    tsv = tmp_path / "cc12m.tsv"
    tsv.write_text("http://h/a.jpg\tfirst\nhttp://h/b.jpg\tsecond\n")
    _, rows, _ = plan_rows(str(tsv))
    assert rows.column("image_id").to_pylist() == [url_image_id("http://h/a.jpg"), url_image_id("http://h/b.jpg")]
    assert url_image_id("http://h/a.jpg") == url_image_id("http://h/a.jpg") != url_image_id("http://h/b.jpg")
    pq_path = tmp_path / "urls.parquet"
    pq.write_table(pa.table({"url": ["http://h/a.jpg", "http://h/a.jpg", None],
                             "caption": ["x", "y", "z"], "image_id": ["a", "b", "c"]}), pq_path)
    got, rows, _ = plan_rows(str(pq_path))
    assert rows.column("image_id").to_pylist() == ["a"]
    assert got.failed == {reasons.DUPLICATE_URL: 1, reasons.MALFORMED_ROW: 1}


def test_plan_shards_is_deterministic(tmp_path):
    path = tmp_path / "urls.parquet"
    pq.write_table(pa.table({"image_id": [f"i{k}" for k in range(7)], "url": [f"http://h/{k}" for k in range(7)],
                             "caption": ["c"] * 7}), path)
    (a, _, sa), (b, _, _) = plan_rows(str(path), 3), plan_rows(str(path), 3)
    assert [s.num_rows for s in sa] == [3, 3, 1] and a.shards.column("rows").to_pylist() == [3, 3, 1]
    assert a.shards.equals(b.shards) and a.digest == b.digest
    assert len(set(a.shards.column("digest").to_pylist())) == 3


def test_commit_keeps_each_row_once_and_refuses_gaps(tmp_path):
    from edje.pipeline.write import IncompleteShardError, commit_shard, stats_path, write_parts
    from edje.schemas.token_table import TableMetadata, decode_tokens, read_token_table

    meta = TableMetadata(kind="compressed", backbone="b", pretrained=None, feature_layer="final", num_tokens=2,
                         width=4, quantization="int8", embed_dim=3, adapter_hash="h")
    blob, scales = meta.codec.encode(np.arange(3 * 8, dtype=np.float32).reshape(3, 2, 4))

    def batch(rows):
        return pa.table({
            "shard": pa.array([0] * len(rows), pa.int32()), "row": pa.array(rows, pa.int32()),
            "image_id": [f"id{r}" for r in rows], "url": [f"http://h/{r}" for r in rows], "caption": ["c"] * len(rows),
            "status": ["ok" if r != 1 else reasons.TIMEOUT for r in rows], "detail": [""] * len(rows),
            "tokens": pa.array([blob[r].tobytes() if r != 1 else None for r in rows], pa.binary()),
            "token_scales": pa.array([scales[r].astype("<f2").tobytes() if r != 1 else None for r in rows], pa.binary()),
            "image_embedding": pa.array([[0.0, 1.0, float(r)] if r != 1 else None for r in rows], pa.list_(pa.float32())),
            "text_embedding": pa.array([None] * len(rows), pa.list_(pa.float32())),
        })

    out = str(tmp_path / "out")
    p1 = write_parts(batch([0, 1]), out).column("part").to_pylist()
    p2 = write_parts(batch([1, 2]), out).column("part").to_pylist()  # row 1 twice: a retried write
    with pytest.raises(IncompleteShardError):
        commit_shard(out, 0, p1, 3, meta.to_bytes().decode())
    stats = commit_shard(out, 0, p1 + p2, 3, meta.to_bytes().decode())
    assert stats["images_ok"] == 2 and stats["failed"] == {reasons.TIMEOUT: 1}
    table, got = read_token_table(stats["table"], adapter_hash="h")
    assert table.column("image_id").to_pylist() == ["id0", "id2"]
    np.testing.assert_allclose(decode_tokens(table, got), meta.codec.decode(blob[[0, 2]], scales[[0, 2]]))
    assert json.loads(open(stats_path(out, 0)).read())["images_ok"] == 2


def test_iri_urls_are_percent_encoded_for_download_only():
    from edje.pipeline.download import iri_to_uri

    assert iri_to_uri("http://h:1/images/a.jpg?x=1") == "http://h:1/images/a.jpg?x=1"
    assert iri_to_uri("http://h:1/images/café b.jpg?q=é") == "http://h:1/images/caf%C3%A9%20b.jpg?q=%C3%A9"
    assert iri_to_uri("http://bücher.example/a.jpg") == "http://xn--bcher-kva.example/a.jpg"
    assert iri_to_uri("http://h/already%20quoted.jpg") == "http://h/already%20quoted.jpg"
