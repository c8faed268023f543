"""The encode job's guards and less-travelled paths, each through the real job on a local Ray:
an http(s):// url list, compressed int4 (grouped) and fp16 tables, a folder reused with another
model or input (ManifestMismatchError), a job that cannot finish (IncompleteJobError) and its
rerun, and a timm-tower backbone."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_encode_e2e import serve  # the loopback HTTP server of the end-to-end tests

from edje.sampleworld.world import WorldConfig, generate, url_rows

pytestmark = pytest.mark.slow


def _world(tmp_path: Path, seed: int, n: int = 16) -> Path:
    world = tmp_path / "world"
    generate(WorldConfig(seed=seed, n_train=n - 8, n_val=4, n_test=4), world)
    return world


def _tsv(rows) -> str:
    return "url\tcaption\timage_id\n" + "".join(f"{r['url']}\t{r['caption']}\t{r['image_id']}\n" for r in rows)


def _cfg(**kw):
    from edje.schemas.encode_job import EncodeJobConfig
    return EncodeJobConfig(**{"shard_size": 8, "batch_size": 8, "download_threads": 4, **kw})


def test_http_list_int4_and_fp16_tables_and_reuse_with_another_model_or_input(tmp_path, ray_local, tiny_edje_config):
    from edje.model.edje import EDJEModel, save_checkpoint
    from edje.pipeline.job import run_encode_job
    from edje.pipeline.manifest import ManifestMismatchError
    from edje.schemas.config import BackboneConfig
    from edje.schemas.token_table import decode_tokens, read_token_tables

    # Fixed backbone weights (the shipped small backbone): two runs must see the same backbone tokens.
    weights = str(Path(__file__).resolve().parent.parent / "checkpoints" / "edje-tiny-clip-sw.safetensors")
    model = EDJEModel(dataclasses.replace(tiny_edje_config, backbone=BackboneConfig("edje-tiny-clip", weights)))
    save_checkpoint(model, str(tmp_path / "ckpt"))
    world = _world(tmp_path, seed=21)
    with serve(world) as base:
        rows = url_rows(world, base)
        (world / "urls.tsv").write_text(_tsv(rows))
        url_list = f"{base}/urls.tsv"  # the list itself comes over http
        out = {q: str(tmp_path / f"out-{q}") for q in ("int4", "fp16")}
        s4 = run_encode_job(_cfg(input=url_list, output=out["int4"], adapter=str(tmp_path / "ckpt"), quant="int4",
                                 group_size=32))
        s16 = run_encode_job(_cfg(input=url_list, output=out["fp16"], adapter=str(tmp_path / "ckpt"), quant="fp16"))
        for s in (s4, s16):
            assert s["complete"] and s["images_ok"] == len(rows) and s["failed"] == {}
        t4, m4 = read_token_tables(s4["tables"], kind="compressed", quantization="int4")
        t16, m16 = read_token_tables(s16["tables"], kind="compressed", quantization="fp16")
        assert (m4.codec.group_size, s4["bytes_per_image"], s16["bytes_per_image"]) == (32, 16 * 64 // 2 + 16 * 2 * 2,
                                                                                        16 * 64 * 2)
        ids = t16.column("image_id").to_pylist()
        assert t4.column("image_id").to_pylist() == ids and sorted(ids) == sorted(r["image_id"] for r in rows)
        ref, q4 = decode_tokens(t16, m16), decode_tokens(t4, m4)  # same images, same adapter: fp16 is the input
        groups = np.abs(ref).reshape(len(ids), 16, 2, 32).max(-1, keepdims=True)
        # int4 error <= half a step of the group's absmax / 7 (fp16 scale rounded up: one fp16 ulp of slack);
        # the fp16 reference itself is off the float adapter output by <= 2^-11 of each value
        bound = groups / 7 / 2 * (1 + 2 ** -10) + groups * 2 ** -10
        err = np.abs(q4 - ref).reshape(len(ids), 16, 2, 32)
        assert (err <= bound).all(), float((err - bound).max())
        assert err.max() > 0.25 * (groups / 7 / 2).min()  # a real int4 round trip, not a copy of the fp16 values

        # The fp16 folder again, with the int4 model: refused before any list is read.
        with pytest.raises(ManifestMismatchError, match="table_metadata"):
            run_encode_job(_cfg(input=url_list, output=out["fp16"], adapter=str(tmp_path / "ckpt"), quant="int4",
                                group_size=32))
        # The fp16 folder again, with another input (one row fewer): re-planned, refused, nothing overwritten.
        (world / "other.tsv").write_text(_tsv(rows[:-1]))
        before = sorted(p.stat().st_mtime_ns for p in (Path(out["fp16"]) / "_input").iterdir())
        with pytest.raises(ManifestMismatchError, match="rows_in was 16, now 15"):
            run_encode_job(_cfg(input=f"{base}/other.tsv", output=out["fp16"], adapter=str(tmp_path / "ckpt"),
                                quant="fp16"))
        assert sorted(p.stat().st_mtime_ns for p in (Path(out["fp16"]) / "_input").iterdir()) == before
        # Same count, another row: the plan digest names the first shard that differs.
        swapped = rows[:-1] + [{**rows[-1], "caption": rows[-1]["caption"] + " (edited)"}]
        (world / "edited.tsv").write_text(_tsv(swapped))
        with pytest.raises(ManifestMismatchError, match=r"plan_digest .* \(input shard 1 differs first\)"):
            run_encode_job(_cfg(input=f"{base}/edited.tsv", output=out["fp16"], adapter=str(tmp_path / "ckpt"),
                                quant="fp16"))


def test_a_shard_that_cannot_be_written_makes_the_job_incomplete_and_a_rerun_finishes_it(tmp_path, ray_local):
    import json

    from edje.pipeline.job import IncompleteJobError, run_encode_job

    world = _world(tmp_path, seed=22)
    out = tmp_path / "out"
    blocker = out / "_downloads" / "00001.tar"  # img2dataset cannot create shard 1's tar: a directory is there
    blocker.mkdir(parents=True)
    with serve(world) as base:
        rows = url_rows(world, base)
        (tmp_path / "urls.tsv").write_text(_tsv(rows))
        cfg = _cfg(input=str(tmp_path / "urls.tsv"), output=str(out))
        with pytest.raises(IncompleteJobError, match=r"shards not committed .*IsADirectoryError.*run the same command"):
            run_encode_job(cfg)
        # Ray Data aborts the whole dataset on the failed task: shard 1 is pending, shard 0 may be too
        summary = json.loads((out / "summary.json").read_text())
        assert not summary["complete"] and 1 in summary["pending_shards"] and summary["run"]["errors"]
        assert summary["images_ok"] == 8 * (2 - len(summary["pending_shards"]))
        shutil.rmtree(blocker)
        again = run_encode_job(cfg)
    assert again["complete"] and again["images_ok"] == len(rows)
    assert again["run"]["shards_committed"] == summary["pending_shards"]  # the rerun did exactly what was left


def test_timm_tower_backbone_through_the_pipeline(tmp_path, ray_local):
    from edje.model.backbone import VisionBackbone
    from edje.pipeline.job import run_encode_job
    from edje.schemas.config import BackboneConfig
    from edje.schemas.token_table import decode_tokens, read_token_tables

    world = _world(tmp_path, seed=23)
    with serve(world) as base:
        rows = url_rows(world, base)
        twin = {**rows[0], "url": rows[0]["url"] + "?copy", "image_id": "twin_of_first"}  # the same picture again
        (tmp_path / "urls.tsv").write_text(_tsv(rows + [twin]))
        summary = run_encode_job(_cfg(input=str(tmp_path / "urls.tsv"), output=str(tmp_path / "out"),
                                      backbone="edje-tiny-timm"))
    assert summary["complete"] and summary["images_ok"] == len(rows) + 1
    table, meta = read_token_tables(summary["tables"], kind="raw", backbone="edje-tiny-timm")
    backbone = VisionBackbone.create(BackboneConfig("edje-tiny-timm"))
    assert backbone.is_timm and (meta.num_tokens, meta.width) == backbone.token_shape
    tokens = decode_tokens(table, meta)
    ids = table.column("image_id").to_pylist()
    first, copy = tokens[ids.index(rows[0]["image_id"])], tokens[ids.index("twin_of_first")]
    np.testing.assert_array_equal(first, copy)  # one encoder, one picture: the same tokens
    other = tokens[ids.index(rows[1]["image_id"])]
    assert np.abs(first - other).mean() > 1e-3 and np.isfinite(tokens).all()
