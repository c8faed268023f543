"""End-to-end tests of jobs/encode_cc12m.py: two-node Ray cluster with planted bad inputs, resume,
a worker node removed mid-run, and an S3 round trip against moto's server on loopback."""
from __future__ import annotations

import contextlib
import glob
import gzip
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edje.pipeline import reasons
from edje.sampleworld.world import WorldConfig, generate, url_rows
from edje.schemas.shipped import DEFAULT_BACKBONE

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
JOB = [sys.executable, str(ROOT / "jobs" / "encode_cc12m.py")]
MiB = 1024 * 1024


# ----------------------------------------------------------------------------- loopback server
class _Handler(BaseHTTPRequestHandler):
    """Serves files under `root`, plus planted `routes`: path -> (status, body, delay seconds)."""

    root: Path
    routes: dict
    delay: float = 0.0

    def do_GET(self):
        path = urllib.parse.unquote(self.path.split("?", 1)[0])
        status, body, delay = self.routes.get(path, (None, None, self.delay))
        if status is None:
            f = (self.root / path.lstrip("/")).resolve()
            status, body = (200, f.read_bytes()) if f.is_file() and self.root in f.parents else (404, b"not found")
        time.sleep(delay)
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def log_message(self, *args):  # keep test output quiet
        pass


@contextlib.contextmanager
def serve(root: Path, routes: dict | None = None, delay: float = 0.0):
    """A threaded loopback HTTP server; yields its base url."""
    handler = type("H", (_Handler,), {"root": root.resolve(), "routes": routes or {}, "delay": delay})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()



def _png(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95, **kw)
    return buf.getvalue()


# ----------------------------------------------------------------------------- planted url list
def planted_world(tmp: Path, n: int):
    """A sample world plus odd-but-usable and bad inputs; returns (world dir, routes, rows builder)."""
    world = tmp / "world"
    generate(WorldConfig(seed=5, n_train=n - 32, n_val=16, n_test=16), world)
    odd = world / "odd"
    odd.mkdir()
    src = {i: Image.open(world / "images" / f"sw_{i:06d}.jpg").convert("RGB") for i in range(10, 17)}
    rgb = np.asarray(src[10])
    (odd / "cmyk.jpg").write_bytes(_jpeg(src[10].convert("CMYK")))
    (odd / "gray.jpg").write_bytes(_jpeg(src[11].convert("L")))
    (odd / "rgba.png").write_bytes(_png(src[12].convert("RGBA")))
    import cv2
    bgra16 = np.dstack([np.asarray(src[13])[..., ::-1].astype(np.uint16) * 257, np.full(rgb.shape[:2], 65535, np.uint16)])
    (odd / "rgba16.png").write_bytes(cv2.imencode(".png", bgra16)[1].tobytes())
    (odd / "gray16.png").write_bytes(_png(Image.fromarray(np.asarray(src[14].convert("L")).astype(np.uint16) * 257)))
    stored = src[15].transpose(Image.ROTATE_90)  # stored rotated; EXIF 6 says "rotate 90 CW to display"
    exif = stored.getexif()
    exif[0x0112] = 6
    (odd / "exif.jpg").write_bytes(_jpeg(stored, exif=exif))
    (odd / "palette.png").write_bytes(_png(src[16].convert("P")))
    (odd / "café ü.jpg").write_bytes(_jpeg(src[14]))  # a non-ASCII url with a space: percent-encoded to fetch
    bad = world / "bad"
    bad.mkdir()
    full = _jpeg(src[10])
    (bad / "trunc.jpg").write_bytes(full[: len(full) // 2])
    png = _png(src[11])
    (bad / "trunc.png").write_bytes(png[: len(png) // 2])
    (bad / "text.jpg").write_bytes(b"<html><body>this is not an image</body></html>")
    (bad / "bomb.png").write_bytes(_png(Image.new("1", (12000, 12000))))  # 144 Mpx > the 89 Mpx limit
    routes = {"/err/500": (500, b"server error", 0.0), "/err/404": (404, b"gone", 0.0),
              "/slow.jpg": (200, full, 20.0), "/empty.jpg": (200, b"", 0.0)}
    odd_ids = {"odd_cmyk": "cmyk.jpg", "odd_gray": "gray.jpg", "odd_rgba": "rgba.png", "odd_rgba16": "rgba16.png",
               "odd_gray16": "gray16.png", "odd_exif": "exif.jpg", "odd_palette": "palette.png",
               "odd_unicode": "café ü.jpg"}
    twins = {"odd_cmyk": "sw_000010", "odd_gray": None, "odd_rgba": "sw_000012", "odd_rgba16": "sw_000013",
             "odd_exif": "sw_000015", "odd_palette": None, "odd_gray16": None, "odd_unicode": "sw_000014"}

    def rows(base: str, dead: str):
        good = url_rows(world, base)
        lines = [b"url\tcaption\timage_id"]
        expected = {r["image_id"]: r for r in good}
        body = [f"{r['url']}\t{r['caption']}\t{r['image_id']}".encode() for r in good]
        for i, (iid, name) in enumerate(odd_ids.items()):
            body.append(f"{base}/odd/{name}\tan odd picture number {i}\t{iid}".encode())
            expected[iid] = {"url": f"{base}/odd/{name}", "caption": f"an odd picture number {i}", "image_id": iid}
        failed = {reasons.HTTP_ERROR: 3, reasons.CONNECTION_ERROR: 2, reasons.TIMEOUT: 2, reasons.NOT_AN_IMAGE: 2,
                  reasons.TRUNCATED_IMAGE: 2, reasons.DECOMPRESSION_BOMB: 1, reasons.EMPTY_CAPTION: 2,
                  reasons.CAPTION_NOT_UTF8: 2, reasons.DUPLICATE_URL: 2, reasons.MALFORMED_ROW: 2}
        planted = [
            f"{base}/err/404?a\ta missing picture\tbad_404a", f"{base}/no/such/file.jpg\tanother missing one\tbad_404b",
            f"{base}/err/500\ta broken server\tbad_500", f"{dead}/x1.jpg\tnobody listens\tbad_dead1",
            f"{dead}/x2.jpg\tnobody listens here either\tbad_dead2", f"{base}/slow.jpg?1\ttoo slow\tbad_slow1",
            f"{base}/slow.jpg?2\tslow too\tbad_slow2", f"{base}/bad/text.jpg\ta web page\tbad_text",
            f"{base}/empty.jpg\tnothing at all\tbad_empty", f"{base}/bad/trunc.jpg\thalf a jpeg\tbad_truncjpg",
            f"{base}/bad/trunc.png\thalf a png\tbad_truncpng", f"{base}/bad/bomb.png\ta bomb\tbad_bomb",
            f"{good[1]['url']}?e1\t\tbad_nocap", f"{good[2]['url']}?e2\t   \tbad_spacecap",
            "just-one-field", "not-a-url\ta caption\tbad_nourl",
        ]
        body += [p.encode() for p in planted]
        body += [f"{good[3]['url']}?u1\tbad ".encode() + b"\xff\xfe utf8\tbad_utf8a",
                 f"{good[4]['url']}?u2\t".encode() + b"\xc3\x28 invalid\tbad_utf8b"]
        rng = np.random.default_rng(0)
        body = [body[i] for i in rng.permutation(len(body))]  # spread the bad rows over the shards
        # duplicates of good urls come after their first occurrence: the first is kept
        body += [f"{good[5]['url']}\tthe same url again\tbad_dup1".encode(),
                 f"{good[6]['url']}\tand again\tbad_dup2".encode()]
        return b"\n".join(lines + body) + b"\n", expected, failed, twins

    return world, routes, rows


def read_tables(summary: dict, **fs_kwargs):
    from edje.schemas.token_table import read_token_tables
    return read_token_tables(summary["tables"], **fs_kwargs)


def nearest(table, meta, query_id: str) -> str:
    """Image id whose decoded tokens are nearest (L2) to those of `query_id`, excluding itself."""
    from edje.schemas.token_table import decode_tokens
    ids = table.column("image_id").to_pylist()
    tok = decode_tokens(table, meta).reshape(len(ids), -1)
    q = ids.index(query_id)
    d = np.linalg.norm(tok - tok[q], axis=1)
    d[q] = np.inf
    return ids[int(np.argmin(d))]


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and one worker node, one CPU each, on this machine."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 300 * MiB,
                                                           "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=300 * MiB)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_two_node_cluster_planted_bad_inputs_and_resume(tmp_path, two_node_cluster, refused_url):
    import ray

    from edje.pipeline.job import run_encode_job
    from edje.pipeline.write import parts_dir, stats_path
    from edje.schemas.encode_job import EncodeJobConfig

    world, routes, rows = planted_world(tmp_path, 176)
    out = str(tmp_path / "out")
    with serve(world, routes) as base:
        data, expected, failed, twins = rows(base, refused_url)
        # A multi-file input: a folder of two lists (plain and gzipped TSV); the duplicate urls at the
        # end of the second file repeat rows of the first, so "once in the output" spans files.
        lines = data.splitlines(keepends=True)
        (tmp_path / "urls").mkdir()
        (tmp_path / "urls" / "part-0.tsv").write_bytes(b"".join(lines[:120]))
        with gzip.open(tmp_path / "urls" / "part-1.tsv.gz", "wb") as f:
            f.write(lines[0] + b"".join(lines[120:]))
        # A 1.5 s timeout let good loopback images time out on a loaded CI machine: 5 s, with the slow route 20 s.
        cfg = EncodeJobConfig(input=str(tmp_path / "urls"), output=out, shard_size=40, batch_size=16,
                              timeout=5.0, retries=0, address=two_node_cluster.address)
        ray.init(address=two_node_cluster.address, log_to_driver=False)
        summary = run_encode_job(cfg)

        assert summary["complete"] and summary["run"]["ray_nodes"] == 2
        # the profile: a timeline in order, and every operator's CPU seconds
        tl = summary["run"]["timeline_s"]
        assert 0 <= tl["actor_ready"] <= tl["first_batch_encoding"] <= tl["last_batch_encoded"] <= tl["commits_done"]
        ops = summary["run"]["operators"]
        assert {"FlatMap(download_rows)", "MapBatches(decode_batch)", "MapBatches(EncodeBatch)",
                "MapBatches(write_parts)"} <= set(ops) and all(o["cpu_s"] >= 0 and o["tasks"] >= 1 for o in ops.values())
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        assert manifest["input"] == [str(tmp_path / "urls")] and manifest["num_shards"] == summary["shards"] == 5
        n_in = len(expected) + sum(failed.values())
        assert summary["images_in"] == n_in == 204
        assert summary["failed"] == failed
        assert summary["images_ok"] == len(expected)
        table, meta = read_tables(summary, kind="raw", backbone=DEFAULT_BACKBONE)
        ids = table.column("image_id").to_pylist()
        assert sorted(ids) == sorted(expected) and len(set(ids)) == len(ids)
        got = {r["image_id"]: r for r in table.select(["image_id", "url", "caption"]).to_pylist()}
        assert all(got[i]["url"] == e["url"] and got[i]["caption"] == e["caption"] for i, e in expected.items())
        # normalised images are the pictures they came from (EXIF applied, CMYK/alpha/16-bit converted)
        for odd_id, twin in twins.items():
            if twin:
                assert nearest(table, meta, odd_id) == twin, odd_id
        assert summary["bytes_per_image"] == meta.num_tokens * meta.width * 2 == 64 * 128 * 2  # fp16 tokens of the default backbone

        # Resume: un-commit one shard and leave junk parts behind, as a crash would; the rerun redoes
        # only that shard and every good row is still present exactly once.
        before = {p: os.path.getmtime(p) for p in glob.glob(f"{out}/tables/*.parquet")}
        os.remove(stats_path(out, 1))
        os.makedirs(parts_dir(out, 1), exist_ok=True)
        (Path(parts_dir(out, 1)) / "stale.parquet").write_bytes(b"junk from a crashed run")
        again = run_encode_job(cfg)
        assert again["run"]["shards_committed"] == [1]
        assert again["failed"] == failed and again["images_ok"] == len(expected)
        after = {p: os.path.getmtime(p) for p in glob.glob(f"{out}/tables/*.parquet")}
        changed = [p for p in after if after[p] != before[p]]
        assert [os.path.basename(p) for p in changed] == ["part-00001.parquet"]
        table2, _ = read_tables(again)
        assert sorted(table2.column("image_id").to_pylist()) == sorted(expected)
        assert not os.path.exists(parts_dir(out, 1))


def test_worker_node_removed_mid_run_then_rerun_completes(tmp_path):
    from ray.cluster_utils import Cluster

    world = tmp_path / "world"
    generate(WorldConfig(seed=9, n_train=96, n_val=8, n_test=8), world)
    rows = url_rows(world, "http://placeholder")
    out = tmp_path / "out"
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 300 * MiB,
                                                           "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=1, object_store_memory=300 * MiB)
        cluster.wait_for_nodes()
        with serve(world, delay=0.15) as base:  # slow images: the run lasts long enough to be hit
            lines = ["url\tcaption\timage_id"] + [f"{base}{r['url'][len('http://placeholder'):]}\t{r['caption']}\t"
                                                   f"{r['image_id']}" for r in rows]
            (tmp_path / "urls.tsv").write_text("\n".join(lines) + "\n")
            cmd = JOB + ["--input", str(tmp_path / "urls.tsv"), "--output", str(out), "--shard-size", "8",
                         "--batch-size", "8", "--download-threads", "2", "--address", cluster.address]
            # To a file, not a pipe: a driver blocked on a full pipe would look like a hung run.
            log1 = open(tmp_path / "first.log", "w")
            first = subprocess.Popen(cmd, env=env, stdout=log1, stderr=subprocess.STDOUT, text=True)
            deadline = time.time() + 240
            while not glob.glob(str(out / "stats" / "*.json")) and first.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            assert first.poll() is None, "the job ended before any shard was committed:\n" + (tmp_path / "first.log").read_text()[-3000:]
            n_shards = len(rows) // 8
            committed_at_fault = len(glob.glob(str(out / "stats" / "*.json")))
            assert committed_at_fault < n_shards
            cluster.remove_node(worker)
            # Ray Data usually rides out the lost node. To leave a half-done output for the rerun
            # whatever happens, the driver is killed once one more shard has been committed.
            deadline = time.time() + 240
            while (first.poll() is None and time.time() < deadline
                   and len(glob.glob(str(out / "stats" / "*.json"))) <= committed_at_fault):
                time.sleep(0.2)
            killed = first.poll() is None
            after = len(glob.glob(str(out / "stats" / "*.json")))
            if killed:
                first.kill()
            first.wait()
            log1.close()
            text1 = (tmp_path / "first.log").read_text()
            left = n_shards - len(glob.glob(str(out / "stats" / "*.json")))
            # What became of the first run: either it rode out the lost node and kept committing shards
            # (the lost node's work redone elsewhere), or it stopped with an error naming the problem.
            # Still running at the deadline with nothing committed since the fault: it hung.
            if killed:
                assert after > committed_at_fault, (f"the first run hung after the node was removed: still "
                                                    f"{after}/{n_shards} shards after 240 s\n" + text1[-3000:])
            else:
                assert first.returncode != 0, "the first run finished every shard before it could be stopped"
                tail = text1[-3000:]  # where the driver's final error lies
                assert re.search(r"Error|Exception|\[encode\] incomplete", tail) and \
                    re.search(r"node|died|lost|unavailable", tail, re.I), \
                    f"the first run failed (exit {first.returncode}) without naming the problem:\n" + tail
            assert left > 0, "nothing was left for the rerun to finish"
            print(f"first run: {'killed' if killed else f'exit {first.returncode}'}, {committed_at_fault}/{n_shards} "
                  f"shards committed at the node loss, {left} left for the rerun")
            cluster.add_node(num_cpus=1, object_store_memory=300 * MiB)
            cluster.wait_for_nodes()
            second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
            assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
            assert f"{n_shards - left} already committed, {left} to do" in second.stdout
        summary = json.loads((out / "summary.json").read_text())
        assert summary["complete"] and summary["images_ok"] == len(rows) and summary["failed"] == {}
        table, _ = read_tables(summary)
        ids = table.column("image_id").to_pylist()
        assert sorted(ids) == sorted(r["image_id"] for r in rows)  # every good row exactly once
        assert len(glob.glob(str(out / "tables" / "*.parquet"))) == n_shards
        assert not glob.glob(str(out / "tables" / ".*tmp*"))
    finally:
        cluster.shutdown()


def test_s3_round_trip_with_compressed_int8_tables(tmp_path, tiny_edje_config):
    import json

    import s3fs
    from moto.server import ThreadedMotoServer

    from edje.model.edje import EDJEModel, save_checkpoint

    ckpt = tmp_path / "ckpt"
    model = EDJEModel(tiny_edje_config)
    save_checkpoint(model, str(ckpt))
    world = tmp_path / "world"
    generate(WorldConfig(seed=11, n_train=24, n_val=4, n_test=4), world)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        import boto3
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="edje-bucket")
        fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint})
        with serve(world) as base:
            rows = url_rows(world, base)
            tsv = "url\tcaption\timage_id\n" + "".join(f"{r['url']}\t{r['caption']}\t{r['image_id']}\n" for r in rows)
            tsv += f"{base}/missing.jpg\tgone\tbad_missing\n"
            fs.pipe("edje-bucket/in/urls.tsv", tsv.encode())
            cmd = JOB + ["--input", "s3://edje-bucket/in/urls.tsv", "--output", "s3://edje-bucket/enc",
                         "--s3-endpoint", endpoint, "--adapter", str(ckpt), "--quant", "int8", "--shard-size", "20",
                         "--num-cpus", "2", "--batch-size", "16"]
            env = {**os.environ, **creds, "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1"}
            env.pop("RAY_ADDRESS", None)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        fs.invalidate_cache()
        summary = json.loads(fs.cat("edje-bucket/enc/summary.json"))
        assert summary["complete"] and summary["images_ok"] == len(rows)
        assert summary["failed"] == {reasons.HTTP_ERROR: 1}
        assert all(t.startswith("s3://edje-bucket/enc/tables/") for t in summary["tables"])
        assert fs.exists("edje-bucket/enc/_downloads/00000.tar")  # img2dataset wrote its shards to S3 too
        from edje.schemas.token_table import read_token_tables
        table, meta = read_token_tables([t[len("s3://"):] for t in summary["tables"]], filesystem=fs,
                                        kind="compressed", adapter_hash=model.adapter_hash(), quantization="int8")
        assert sorted(table.column("image_id").to_pylist()) == sorted(r["image_id"] for r in rows)
        assert (meta.num_tokens, meta.width) == (16, 64) and "caption" not in table.column_names
    finally:
        moto.stop()
