"""Images a user already holds, planned and read without Ray: format detection, webdataset shards, image folders
and caption tables, Parquet with image bytes, kept columns and their types, where each image lies and why one
cannot be read; the adapter + codec step the compress job shares with the encoder."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from edje.pipeline import reasons
from edje.pipeline.input_source import expand, resolve_format
from edje.pipeline.plan import PlanConfig, plan_input
from edje.pipeline.read_files import fetch_images
from edje.pipeline.url_source import ReadOptions
from edje.schemas.encode_job import EncodeJobConfig


def jpeg(seed: int, size: int = 24) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def plan(entry, **read):
    """(plan, all planned rows in order) of an input, its format resolved as the job resolves it."""
    opts = ReadOptions(**read)
    opts = dataclasses.replace(opts, fmt=resolve_format(entry, opts))
    shards = []
    p = plan_input(expand(entry, opts), opts, PlanConfig(shard_size=3), None, on_shard=lambda s, t: shards.append(t))
    return p, (pa.concat_tables(shards) if shards else None), opts.fmt


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_the_format_is_found_from_names_and_columns_and_ambiguity_is_refused(tmp_path):
    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "00000.tar", "w") as t:
        add(t, "a.jpg", jpeg(0))
    (tmp_path / "imgs" / "sub").mkdir(parents=True)
    (tmp_path / "imgs" / "sub" / "x.png").write_bytes(jpeg(1))
    image = pa.array([{"bytes": jpeg(2), "path": None}])
    pq.write_table(pa.table({"image": image, "caption": ["c"]}), tmp_path / "hf.parquet")
    pq.write_table(pa.table({"url": ["http://h/a.jpg"], "caption": ["c"]}), tmp_path / "urls.parquet")
    (tmp_path / "paths.csv").write_text("path,caption\nimgs/sub/x.png,a thing\n")
    pq.write_table(pa.table({"url": ["http://h/a"], "jpg": pa.array([b"x"]), "caption": ["c"]}), tmp_path / "i2d.parquet")
    (tmp_path / "both.csv").write_text("url,path,caption\nhttp://h/a,a.jpg,c\n")
    opts = ReadOptions()
    assert resolve_format(str(tmp_path / "wds"), opts) == "webdataset"
    assert resolve_format(str(tmp_path / "imgs"), opts) == "image-folder"
    assert resolve_format(str(tmp_path / "hf.parquet"), opts) == "image-parquet"
    assert resolve_format(str(tmp_path / "urls.parquet"), opts) == "auto"  # a url list, per-file tsv/csv/parquet
    assert resolve_format(str(tmp_path / "paths.csv"), opts) == "image-folder"
    assert resolve_format(str(tmp_path / "i2d.parquet"), opts) == "image-parquet"  # the url is provenance
    with pytest.raises(ValueError, match="--input-format"):
        resolve_format(str(tmp_path / "both.csv"), opts)
    with pytest.raises(ValueError, match="different kinds"):
        resolve_format([str(tmp_path / "wds"), str(tmp_path / "imgs")], opts)
    assert resolve_format(str(tmp_path / "both.csv"), ReadOptions(fmt="image-folder")) == "image-folder"


def test_webdataset_shards_planned_from_one_pass_and_read_by_range(tmp_path):
    (tmp_path / "wds").mkdir()
    images = {k: jpeg(i) for i, k in enumerate(["s/a", "s/b", "s/c", "s/d", "s/e"])}
    with tarfile.open(tmp_path / "wds" / "00000.tar", "w") as t:
        add(t, "s/a.jpg", images["s/a"])
        add(t, "s/a.txt", b"a red star")
        add(t, "s/a.json", json.dumps({"image_id": "img-a", "url": "http://h/a.jpg", "similarity": 0.31}).encode())
        add(t, "s/b.txt", b"a blue ring")  # caption first, image second: grouped by key all the same
        add(t, "s/b.png", images["s/b"])
        add(t, "s/c.txt", b"no picture at all")
        add(t, "s/d.jpg", images["s/d"])
        add(t, "s/d.txt", b"   ")
        add(t, "__meta__.json", b"{}")
    with tarfile.open(tmp_path / "wds" / "00001.tar", "w") as t:
        add(t, "s/e.txt", b"cut in the middle")
        add(t, "s/e.jpg", images["s/e"])
    whole = (tmp_path / "wds" / "00001.tar").read_bytes()
    (tmp_path / "wds" / "00001.tar").write_bytes(whole[: 512 * 3 + len(images["s/e"]) // 2])  # inside e.jpg
    p, rows, fmt = plan(str(tmp_path / "wds"), keep_columns=("similarity",))
    assert fmt == "webdataset"
    assert p.rows_in == 5 and p.failed == {reasons.EMPTY_CAPTION: 1, reasons.MALFORMED_ROW: 1}
    assert rows.column("image_id").to_pylist() == ["img-a", "s/b", "s/e"]
    assert rows.column("caption").to_pylist() == ["a red star", "a blue ring", "cut in the middle"]
    assert rows.column("url").to_pylist()[0] == "http://h/a.jpg"
    assert rows.schema.field("similarity").type == pa.float64() and rows.column("similarity").to_pylist()[:2] == [0.31, None]
    got = fetch_images(rows)
    assert got[0] == (images["s/a"], "") and got[1] == (images["s/b"], "")
    assert got[2][0] is None and "cut short" in got[2][1]


def test_image_folder_with_sidecars_and_a_table_of_paths(tmp_path):
    root = tmp_path / "photos"
    (root / "2020").mkdir(parents=True)
    (root / "_tmp").mkdir()
    (root / "2020" / "beach.day.jpg").write_bytes(jpeg(0))
    (root / "2020" / "beach.day.txt").write_text("sand and sea")
    (root / "cat.png").write_bytes(jpeg(1))
    (root / "cat.json").write_text(json.dumps({"caption": "a cat", "image_id": "c1", "punsafe": 0.5}))
    (root / "blank.jpg").write_bytes(jpeg(2))  # no caption anywhere
    (root / "_tmp" / "skip.jpg").write_bytes(jpeg(3))
    os.symlink(tmp_path / "nowhere.jpg", root / "gone.jpg")
    (root / "gone.txt").write_text("a file that is not there")
    p, rows, fmt = plan(str(root), keep_columns=("punsafe",))
    assert fmt == "image-folder" and p.failed == {reasons.EMPTY_CAPTION: 1} and p.rows_in == 4
    assert rows.column("image_id").to_pylist() == ["2020/beach.day", "c1", "gone"]
    assert rows.column("caption").to_pylist() == ["sand and sea", "a cat", "a file that is not there"]
    assert rows.column("punsafe").to_pylist() == [None, 0.5, None]
    got = fetch_images(rows)
    assert got[0][0] == jpeg(0) and got[1][0] == jpeg(1)
    assert got[2][0] is None and "FileNotFoundError" in got[2][1]
    # the same images named by a table: relative paths from the table's folder, an id column, typed kept columns
    pq.write_table(pa.table({"file_name": ["photos/cat.png", str(root / "2020" / "beach.day.jpg"), ""],
                             "caption": ["a cat", "sand", "no path"], "similarity": pa.array([0.1, 0.2, 0.3], pa.float32())}),
                   tmp_path / "meta.parquet")
    p, rows, fmt = plan(str(tmp_path / "meta.parquet"), path_col="file_name", keep_columns=("similarity",))
    assert fmt == "image-folder" and p.failed == {reasons.MALFORMED_ROW: 1}
    assert rows.column("image_id").to_pylist() == ["photos/cat", str(root / "2020" / "beach.day")]
    assert rows.schema.field("similarity").type == pa.float32()
    assert [g[0] for g in fetch_images(rows)] == [jpeg(1), jpeg(0)]


def test_parquet_of_images_hf_struct_binary_and_img2dataset_status(tmp_path):
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq" / "linked.jpg").write_bytes(jpeg(9))
    image = pa.array([{"bytes": jpeg(0), "path": "a.jpg"}, {"bytes": None, "path": "linked.jpg"},
                      {"bytes": None, "path": "missing.jpg"}, {"bytes": None, "path": None}, {"bytes": jpeg(4), "path": None}])
    pq.write_table(pa.table({"image": image, "caption": ["a", "b", "c", "d", "e"],
                             "punsafe": pa.array([0.0, 0.1, 0.2, 0.3, 0.4], pa.float32())}),
                   tmp_path / "pq" / "hf.parquet", row_group_size=2)  # cells read across row groups
    p, rows, fmt = plan(str(tmp_path / "pq" / "hf.parquet"), keep_columns=("punsafe",))
    assert fmt == "image-parquet" and p.rows_kept == 5 and rows.schema.field("punsafe").type == pa.float32()
    ids = rows.column("image_id").to_pylist()
    assert len(set(ids)) == 5 and all(i.startswith("p") for i in ids)  # a hash of the path and row
    got = fetch_images(rows)
    assert got[0][0] == jpeg(0) and got[1][0] == jpeg(9) and got[4][0] == jpeg(4)
    assert "FileNotFoundError" in got[2][1] and "no image bytes" in got[3][1]
    # img2dataset's own Parquet output: image `jpg`, caption `txt`, its key, failed rows with their error
    pq.write_table(pa.table({"key": ["000", "001"], "jpg": pa.array([jpeg(5), None]), "txt": ["x", None],
                             "url": ["http://h/0", "http://h/1"], "status": ["success", "failed_to_download"],
                             "error_message": [None, "HTTP Error 404: Not Found"]}), tmp_path / "i2d.parquet")
    p, rows, _ = plan(str(tmp_path / "i2d.parquet"))
    assert p.failed == {reasons.HTTP_ERROR: 1} and rows.column("image_id").to_pylist() == ["000"]
    assert fetch_images(rows)[0][0] == jpeg(5)


def test_kept_columns_of_url_lists_keep_parquet_types_and_are_text_in_tsv(tmp_path):
    pq.write_table(pa.table({"url": ["http://h/a", "http://h/b"], "caption": ["a", "b"],
                             "similarity": [0.3, 0.4], "punsafe": pa.array([0.01, 0.02], pa.float32()),
                             "width": pa.array([640, 480], pa.int32())}), tmp_path / "laion.parquet")
    _, rows, _ = plan(str(tmp_path / "laion.parquet"), keep_columns=("similarity", "punsafe", "width"))
    types = {f.name: f.type for f in rows.schema}
    assert (types["similarity"], types["punsafe"], types["width"]) == (pa.float64(), pa.float32(), pa.int32())
    (tmp_path / "urls.tsv").write_text("url\tcaption\tsimilarity\nhttp://h/a\ta\t0.3\n")
    _, rows, _ = plan(str(tmp_path / "urls.tsv"), keep_columns=("similarity",))
    assert rows.column("similarity").to_pylist() == ["0.3"]
    with pytest.raises(ValueError, match="no 'nsfw' column"):
        plan(str(tmp_path / "laion.parquet"), keep_columns=("nsfw",))


def test_kept_columns_may_not_replace_token_table_columns():
    assert EncodeJobConfig(output="o", keep_columns="similarity, punsafe").keep_columns == ("similarity", "punsafe")
    with pytest.raises(ValueError, match="caption"):
        EncodeJobConfig(output="o", keep_columns=("caption",))
    with pytest.raises(ValueError, match="input_format"):
        EncodeJobConfig(output="o", input_format="zip")


def test_compressor_gives_the_encoders_bytes_from_the_backbone_tokens(tiny_edje_config):
    import torch

    from edje.model.backbone import VisionBackbone
    from edje.model.edje import EDJEModel
    from edje.model.token_encoder import TokenCompressor, TokenEncoder
    from edje.schemas.config import CodecConfig

    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config).eval()
    backbone = VisionBackbone.create(tiny_edje_config.backbone)
    pixels = np.random.default_rng(0).integers(0, 255, (3, backbone.preprocess.size, backbone.preprocess.size, 3),
                                               dtype=np.uint8)
    codec = CodecConfig("int8")
    encoded = TokenEncoder(backbone, model.adapter, codec, torch.device("cpu")).encode(pixels)
    with torch.no_grad():
        tokens, _ = backbone.encode(torch.from_numpy(pixels))
    blob, scales = TokenCompressor(model.adapter, codec, backbone.token_shape[0]).encode(tokens.float().numpy())
    assert np.array_equal(blob, encoded.blob) and np.array_equal(scales, encoded.scales)


def test_compressed_metadata_comes_from_the_raw_tables_and_a_foreign_adapter_is_refused():
    from edje.model.edje import read_checkpoint_config
    from edje.pipeline.compress import check_adapter_fits, compressed_metadata
    from edje.schemas.shipped import DEFAULT_RERANKER
    from edje.schemas.token_table import TableMetadata

    weights = read_checkpoint_config(DEFAULT_RERANKER)["config"]["backbone"]["weights_sha256"]
    raw = TableMetadata(kind="raw", backbone="edje-tiny-convvit", pretrained="w.safetensors", feature_layer="final",
                        num_tokens=64, width=128, quantization="fp16", embed_dim=128, pretrained_sha256=weights)
    adapter = check_adapter_fits(raw, DEFAULT_RERANKER)
    meta = compressed_metadata(raw, adapter, "h", "int8", None, "fp32")
    assert (meta.kind, meta.num_tokens, meta.width, meta.quantization, meta.adapter_hash) == \
        ("compressed", adapter.num_queries, adapter.output_dim, "int8", "h")
    assert (meta.backbone, meta.pretrained, meta.embed_dim) == (raw.backbone, raw.pretrained, raw.embed_dim)
    with pytest.raises(ValueError, match="trained on"):
        check_adapter_fits(dataclasses.replace(raw, backbone="edje-tiny-clip"), DEFAULT_RERANKER)
    with pytest.raises(ValueError, match="weights"):
        check_adapter_fits(dataclasses.replace(raw, pretrained=None, pretrained_sha256=None), DEFAULT_RERANKER)
    with pytest.raises(ValueError, match="raw token tables"):
        check_adapter_fits(dataclasses.replace(raw, kind="compressed"), DEFAULT_RERANKER)


def test_the_img2dataset_worker_call_fits_the_pinned_version():
    import inspect
    import re
    from importlib.metadata import version
    from pathlib import Path

    import tomllib
    from img2dataset.downloader import Downloader

    from edje.pipeline.download import DownloadConfig, downloader_options

    deps = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(re.fullmatch(r"img2dataset==([\w.]+)", d).group(1) for d in deps if d.startswith("img2dataset"))
    assert version("img2dataset") == pinned
    inspect.signature(Downloader).bind(**downloader_options(DownloadConfig(downloads="d", image_size=64), 10))
