"""The same 64 images into the encode job five ways: a url list (downloaded from the sample world's loopback
server), webdataset shards that img2dataset itself wrote, an image folder with sidecar captions, Parquet with
image bytes (the Hugging Face datasets layout), and those three again from moto's S3. Every way gives the same
table: ids, captions, tokens within the codec's bound (raw tables stored as fp32 here, so the bound is float
noise and any difference in the pixels would show). Each way holds a corrupt image, an empty caption and an
unreadable file, counted by reason, and nothing else is lost; LAION's similarity and punsafe arrive with their
types. `edje compress` on the url path's raw tables gives its compressed int8 tables within the two tables'
half steps. One Ray instance serves the module."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edje.pipeline import reasons
from edje.sampleworld.server import serve_directory
from edje.sampleworld.world import WorldConfig, generate, url_rows
from edje.schemas.shipped import DEFAULT_BACKBONE, DEFAULT_RERANKER

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
CORRUPT = b"<html><body>this is not an image</body></html>"
BAD = {reasons.NOT_AN_IMAGE: 1, reasons.EMPTY_CAPTION: 1, reasons.UNREADABLE_FILE: 1}
KEEP = ("similarity", "punsafe")


def encode(ray_local, input, output, **kw):
    """run_encode_job on the module's Ray instance (the job attaches to it and leaves it running)."""
    from edje.pipeline.job import run_encode_job
    from edje.schemas.encode_job import EncodeJobConfig
    from edje.schemas.weights import find_weights

    if "adapter" not in kw:  # the shipped weights, as the command line finds them; an adapter names its own
        kw.update(pretrained=find_weights(backbone=DEFAULT_BACKBONE), quant="fp32")
    return run_encode_job(EncodeJobConfig(input=input, output=str(output), shard_size=32, batch_size=32,
                                          keep_columns=KEEP, timeout=5, retries=0, **kw))


def tables(summary, **fs):
    from edje.schemas.token_table import read_token_tables

    return read_token_tables(summary["tables"], **fs)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """64 images of the sample world at the backbone's 64 px, their rows, LAION-style scores, and the bad inputs."""
    root = tmp_path_factory.mktemp("inputs")
    generate(WorldConfig(seed=46, n_train=48, n_val=8, n_test=8, image_size=64), root / "world")
    (root / "world" / "bad").mkdir()
    (root / "world" / "bad" / "corrupt.jpg").write_bytes(CORRUPT)
    rows = url_rows(root / "world", "http://placeholder")
    rng = np.random.default_rng(46)
    for r in rows:
        r["file"] = r["url"][len("http://placeholder/"):]
        r["similarity"], r["punsafe"] = float(rng.uniform(0.28, 0.4)), float(np.float32(rng.uniform(0, 0.1)))
    empty = dict(rows[0], image_id="bad_empty", caption="")  # a good image under an empty caption
    corrupt = dict(rows[0], image_id="bad_corrupt", caption="a page, not a picture", file="bad/corrupt.jpg")
    return root, rows, empty, corrupt


@pytest.fixture(scope="module")
def url_path(world, ray_local):
    """The reference: the url list, downloaded from loopback (a 404 is its unreadable file); raw and compressed."""
    root, rows, empty, corrupt = world
    with serve_directory(root / "world") as server:
        listed = [dict(r, url=server.url(r["file"])) for r in rows + [empty, corrupt]]
        listed.append(dict(rows[1], image_id="bad_missing", caption="gone", url=server.url("no/such.jpg")))
        columns = ("url", "caption", "image_id", "similarity", "punsafe")
        table = pa.table({c: [r[c] for r in listed] for c in columns}).set_column(
            4, "punsafe", pa.array([r["punsafe"] for r in listed], pa.float32()))
        pq.write_table(table, root / "urls.parquet")
        raw = encode(ray_local, str(root / "urls.parquet"), root / "out-urls")
        compressed = encode(ray_local, str(root / "urls.parquet"), root / "out-urls-c16",
                            adapter=str(ROOT / DEFAULT_RERANKER), quant="int8")
        i2d = _img2dataset_shards(root, listed)
    return raw, compressed, i2d


def _img2dataset_shards(root: Path, listed) -> Path:
    """Webdataset shards written by img2dataset's own `download` (images stored as served, its json carrying
    the id and the scores), plus one tar of ours cut short inside its only image: the unreadable file."""
    import img2dataset

    out = root / "wds"
    pq.write_table(pa.Table.from_pylist(listed), root / "urls-i2d.parquet")
    img2dataset.download(url_list=str(root / "urls-i2d.parquet"), input_format="parquet", url_col="url",
                         caption_col="caption", save_additional_columns=["image_id", *KEEP], output_folder=str(out),
                         output_format="webdataset", processes_count=1, thread_count=8, number_sample_per_shard=32,
                         resize_mode="no", disable_all_reencoding=True, compute_hash=None, timeout=5, retries=0,
                         enable_wandb=False)
    data = (root / "world" / listed[2]["file"]).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("cut.txt", b"a picture cut short"), ("cut.json", json.dumps({"image_id": "bad_cut"}).encode()),
                           ("cut.jpg", data)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    (out / "99999.tar").write_bytes(buf.getvalue()[: 5 * 512 + len(data) // 2])  # inside cut.jpg, after two members
    return out


def _folder(root: Path, rows, empty, corrupt) -> Path:
    """Images named by id, sidecar .txt captions and .json scores; a dangling link is the unreadable file."""
    folder = root / "folder"
    folder.mkdir()
    for r in rows + [empty, corrupt]:
        shutil.copy(root / "world" / r["file"], folder / f"{r['image_id']}.jpg")
        (folder / f"{r['image_id']}.txt").write_text(r["caption"])
        (folder / f"{r['image_id']}.json").write_text(json.dumps({k: r[k] for k in KEEP}))
    os.symlink(root / "nowhere.jpg", folder / "bad_gone.jpg")
    (folder / "bad_gone.txt").write_text("a link to nothing")
    return folder


def _parquet(root: Path, rows, empty, corrupt) -> Path:
    """The Hugging Face datasets layout: image struct {bytes, path}; a row whose path names no file is unreadable."""
    folder = root / "parquet"
    folder.mkdir()
    cells = [{"bytes": (root / "world" / r["file"]).read_bytes(), "path": f"{r['image_id']}.jpg"}
             for r in rows + [empty, corrupt]] + [{"bytes": None, "path": "missing.jpg"}]
    every = rows + [empty, corrupt, dict(rows[3], image_id="bad_missing", caption="not there")]
    table = pa.table({"image": pa.array(cells), "caption": [r["caption"] for r in every],
                      "image_id": [r["image_id"] for r in every], "similarity": [r["similarity"] for r in every],
                      "punsafe": pa.array([r["punsafe"] for r in every], pa.float32())})
    pq.write_table(table.slice(0, 40), folder / "part-0.parquet", row_group_size=16)
    pq.write_table(table.slice(40), folder / "part-1.parquet", row_group_size=16)
    return folder


@pytest.fixture(scope="module")
def file_inputs(world, url_path):
    root, rows, empty, corrupt = world
    return {"webdataset": url_path[2], "image-folder": _folder(root, rows, empty, corrupt),
            "image-parquet": _parquet(root, rows, empty, corrupt)}


def assert_same_table(got, want, want_meta, keep_types):
    """Same ids and captions; tokens equal up to float noise (fp32 storage); same embeddings."""
    from edje.schemas.token_table import decode_tokens

    table, meta = got
    assert table.column("image_id").to_pylist() == want.column("image_id").to_pylist()
    assert table.column("caption").to_pylist() == want.column("caption").to_pylist()
    assert (meta.backbone, meta.num_tokens, meta.width, meta.quantization) == \
        (want_meta.backbone, want_meta.num_tokens, want_meta.width, want_meta.quantization)
    a, b = decode_tokens(table, meta), decode_tokens(want, want_meta)
    # Batches of another size take other BLAS paths: fp32 noise scales with an image's largest activation, so a
    # near-zero entry may differ by more than 1e-5 of itself.
    scale = np.abs(b).max(axis=(1, 2), keepdims=True)
    worst = (np.abs(a - b) / scale).max()
    assert worst <= 1e-5, f"worst token difference {worst:.3g} of the image's largest token value"
    from edje.schemas.token_table import vector_matrix
    got_vectors, want_vectors = (vector_matrix(t.column("image_embedding")) for t in (table, want))
    np.testing.assert_allclose(got_vectors, want_vectors, rtol=1e-5, atol=1e-5 * np.abs(want_vectors).max())
    for name, t in keep_types.items():
        assert table.schema.field(name).type == t, name
        np.testing.assert_allclose(np.asarray(table.column(name).to_pylist(), np.float64),
                                   np.asarray(want.column(name).to_pylist(), np.float64), rtol=1e-6)


def test_url_path_counts_its_bad_rows_and_keeps_typed_columns(world, url_path):
    _, rows, _, _ = world
    raw = url_path[0]
    assert raw["complete"] and raw["images_ok"] == 64
    assert raw["failed"] == {reasons.NOT_AN_IMAGE: 1, reasons.EMPTY_CAPTION: 1, reasons.HTTP_ERROR: 1}
    table, meta = tables(raw)
    assert sorted(table.column("image_id").to_pylist()) == sorted(r["image_id"] for r in rows)
    from edje.training.batches import decode_batch  # training reads the columns it uses, the kept ones beside them
    assert len(decode_batch(table.slice(0, 8), meta)) == 8
    assert table.schema.field("similarity").type == pa.float64() and table.schema.field("punsafe").type == pa.float32()
    by_id = {r["image_id"]: r for r in rows}
    assert all(abs(s - by_id[i]["similarity"]) < 1e-12 for i, s in zip(table.column("image_id").to_pylist(),
                                                                       table.column("similarity").to_pylist()))


@pytest.mark.parametrize("fmt", ["webdataset", "image-folder", "image-parquet"])
def test_images_already_held_give_the_url_paths_table(fmt, world, url_path, file_inputs, ray_local, tmp_path):
    root = world[0]
    summary = encode(ray_local, str(file_inputs[fmt]), tmp_path / "out")
    assert summary["complete"] and summary["images_ok"] == 64 and summary["failed"] == BAD, summary["failed_examples"]
    assert "_downloads" not in os.listdir(tmp_path / "out")  # nothing downloaded
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["read_options"]["fmt"] == fmt  # detected
    want, want_meta = tables(url_path[0])
    json_types = {"similarity": pa.float64(), "punsafe": pa.float64()}  # JSON has one number type
    typed = {"similarity": pa.float64(), "punsafe": pa.float32()}
    assert_same_table(tables(summary), want, want_meta, typed if fmt == "image-parquet" else json_types)
    # a rerun finds every shard committed and reads nothing again
    again = encode(ray_local, str(file_inputs[fmt]), tmp_path / "out")
    assert again["run"]["shards_committed"] == [] and again["images_ok"] == 64
    assert root.exists()


@contextlib.contextmanager
def moto_s3():
    """moto's S3 server on loopback with a bucket; yields (endpoint, s3fs filesystem); restores the environment."""
    import boto3
    import fsspec
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = dict(os.environ)
    saved_conf = json.dumps(fsspec.config.conf)
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1"})
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="held")
        yield endpoint, s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint})
    finally:
        os.environ.clear()
        os.environ.update(saved)
        fsspec.config.conf.clear()
        fsspec.config.conf.update(json.loads(saved_conf))
        server.stop()


def test_the_same_inputs_from_s3(world, url_path, file_inputs, ray_local, tmp_path):
    want, want_meta = tables(url_path[0])
    with moto_s3() as (endpoint, fs):
        for fmt, local in file_inputs.items():
            for path in sorted(Path(local).rglob("*")):
                if path.is_file() and not path.is_symlink():  # S3 holds no links: the folder's unreadable one stays
                    fs.pipe(f"held/{fmt}/{path.relative_to(local)}", path.read_bytes())
        fs.invalidate_cache()
        for fmt in file_inputs:
            summary = encode(ray_local, f"s3://held/{fmt}", tmp_path / fmt, s3_endpoint=endpoint)
            bad = dict(BAD)
            if fmt == "image-folder":
                del bad[reasons.UNREADABLE_FILE]
            assert summary["complete"] and summary["images_ok"] == 64 and summary["failed"] == bad, fmt
            assert_same_table(tables(summary), want, want_meta, {})


def test_compress_raw_tables_equals_encoding_with_the_adapter(url_path, ray_local, tmp_path):
    from edje.model.edje import read_checkpoint_config
    from edje.pipeline.compress_job import run_compress_job
    from edje.schemas.compress_job import CompressJobConfig
    from edje.schemas.token_table import decode_tokens, read_lineage, vector_matrix

    raw, encoded, _ = url_path
    adapter = str(ROOT / DEFAULT_RERANKER)
    out = tmp_path / "c16"
    summary = run_compress_job(CompressJobConfig(tables=str(Path(raw["output"]) / "tables"), adapter=adapter,
                                                 output=str(out), quant="int8", batch_size=32))
    assert summary["complete"] and summary["images_ok"] == 64 and summary["failed"] == {}
    got, got_meta = tables(summary)
    want, want_meta = tables(encoded, kind="compressed", quantization="int8")
    assert got.column("image_id").to_pylist() == want.column("image_id").to_pylist()
    assert got_meta.adapter_hash == want_meta.adapter_hash == read_checkpoint_config(adapter)["adapter_hash"]
    assert (got_meta.kind, got_meta.num_tokens, got_meta.width) == ("compressed", want_meta.num_tokens, want_meta.width)
    assert "caption" not in got.column_names
    a, b = decode_tokens(got, got_meta), decode_tokens(want, want_meta)
    # Each table is within half its own int8 step of (nearly) the same floats; a token's step is its absmax / 127
    # (a decoded token's absmax is that of its floats, to the fp16 scale's rounding up), plus float noise.
    absmax_a, absmax_b = np.abs(a).max(-1, keepdims=True), np.abs(b).max(-1, keepdims=True)
    bound = (absmax_a + absmax_b) / 127 / 2 * (1 + 2 ** -10) + 1e-5 * np.maximum(absmax_a, absmax_b)
    assert (np.abs(a - b) <= bound).all(), f"worst {float((np.abs(a - b) / bound).max()):.3f} of the bound"
    np.testing.assert_allclose(vector_matrix(got.column("image_embedding")),
                               vector_matrix(want.column("image_embedding")), rtol=1e-5, atol=1e-6)
    # the raw tables' kept columns come along with their types; each table names where it came from
    assert got.schema.field("punsafe").type == pa.float32() and got.schema.field("similarity").type == pa.float64()
    from edje.storage.token_store import TokenStore  # serving, likewise

    store = TokenStore.load(summary["tables"], mapped=False)
    assert len(store) == 64 and store.gather(got.column("image_id").to_pylist()[:2]).shape == (2, 16, got_meta.width)
    lineage = read_lineage(summary["tables"][0])
    assert lineage["adapter_hash"] == got_meta.adapter_hash and lineage["source_table"] in raw["tables"]
    again = run_compress_job(CompressJobConfig(tables=str(Path(raw["output"]) / "tables"), adapter=adapter,
                                               output=str(out), quant="int8"))
    assert again["run"]["shards_committed"] == [] and again["complete"]
