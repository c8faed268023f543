"""Live images: HTTP latency of adding one image and reranking a url document; the live log at scale.

Default (HTTP): starts a local Ray + Serve over a random corpus (serving.random_corpus: the test-sized model over
the edje-tiny-clip backbone, int8 tables), a live folder, and a loopback file server with PNG images at
the backbone's input size. Measures, each call sequential, p50/p90 in ms:
- `add_url`: POST /v1/images {"url"} of a new image (fetch, decode, backbone, adapter, int8, append the
  record to the live log and fsync it, apply it; the first stage indexes it before the answer);
- `rerank_id`: POST /v1/rerank, one query, one corpus id (the baseline);
- `rerank_url_new`: the same with one {"image": url} document never seen (fetch + encode + score);
- `rerank_url_cached`: the same url again (fetch + content hash; the encoded rows come from the cache).
Prints JSON with the load average (`os.getloadavg`) before and after.

    .venv/bin/python benchmarks/bench_live_images.py --reps 20 --json runs/bench_live_images.json

`--scale N` (no Ray, no model): N adds of synthetic rows at the default codec (16 tokens x 128 int8 + 16 fp16
scales = 2,080 B, plus a 128-d embedding) through the reranker's add path after the encoder
(`LiveImages.add_encoded`: lock, read the log, duplicate check, append + fsync, apply), no source bytes unless
`--source-bytes`. Prints one JSON line per phase: the adds (throughput, latency), files on disk before and after
compaction, restart time (a replica's token store + LiveImages over the folder; the first stage's read of the
embeddings) before and after, a run with the default automatic compaction (`--auto`), and the layout it
replaced (one Parquet table per image, `--legacy` images, restart extrapolated per image).

    nice .venv/bin/python benchmarks/bench_live_images.py --scale 100000 --json runs/bench_live_scale.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

from edje.serving.ports import free_port


def _pct(xs, q):
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 1)


def _timed(fn, reps: int):
    out = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return {"p50_ms": _pct(out, 50), "p90_ms": _pct(out, 90), "mean_ms": round(statistics.mean(out) * 1000, 1), "n": reps}


def main() -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--images", type=int, default=200, help="corpus size")
    p.add_argument("--scale", type=int, default=0, help="live log at scale: this many adds (no Ray, no HTTP)")
    p.add_argument("--auto", type=int, default=20_000, help="--scale: adds with the default automatic compaction")
    p.add_argument("--legacy", type=int, default=2_000, help="--scale: adds in the one-table-per-image layout")
    p.add_argument("--sqlite", type=int, default=0,
                   help="--scale: adds into SQLite in WAL mode (synchronous=FULL), the embedded store weighed against the log")
    p.add_argument("--source-bytes", type=int, default=0, help="--scale: keep this many source bytes per image")
    p.add_argument("--workdir", help="--scale: where the live folders go (default: a temp folder, removed)")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    out = run_scale(a) if a.scale else run_http(a)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


def run_http(a) -> dict:
    """Add and rerank latency over HTTP (module docstring)."""
    import ray
    import requests
    from PIL import Image
    from ray import serve

    from edje.model.backbone import VisionBackbone
    from edje.sampleworld.server import serve_directory
    from edje.serving.app import build
    from edje.serving.config import DeploymentResources, ServeConfig
    from edje.serving.random_corpus import tiny_config, write_random_corpus
    from edje.serving.startup import StartupConfig

    os.environ.update(StartupConfig().env())
    work = tempfile.mkdtemp(prefix="bench-live-")
    corpus = write_random_corpus(os.path.join(work, "corpus"), tiny_config(), a.images)
    size = VisionBackbone.create(corpus.config.backbone).preprocess.size
    img_dir = os.path.join(work, "img")
    os.makedirs(img_dir)
    rng = np.random.default_rng(0)
    for i in range(3 * a.reps + 2):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
        with open(os.path.join(img_dir, f"{i}.png"), "wb") as f:
            f.write(buf.getvalue())
    files = serve_directory(img_dir)
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cfg = ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables), auth_token_env=None,
                      live_dir=os.path.join(work, "live"), image_url_hosts=("127.0.0.1",),
                      image_url_allow=("127.0.0.1/32",),  # the image server is on loopback, refused by default
                      reranker=DeploymentResources(num_cpus=1.0))
    serve.run(build(cfg), name="bench", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    http = requests.Session()
    load_before = os.getloadavg()

    def post(path, body):
        r = http.post(url + path, json=body, timeout=300)
        r.raise_for_status()

    q = corpus.captions[0]
    post("/v1/images", {"url": files.url("0.png")})  # warm-up: loads the backbone in the replica
    post("/v1/rerank", {"query": q, "documents": [{"image": files.url("1.png")}]})
    out = {
        "add_url": _timed(lambda i: post("/v1/images", {"url": files.url(f"{2 + i}.png")}), a.reps),
        "rerank_id": _timed(lambda i: post("/v1/rerank", {"query": q, "documents": [corpus.image_ids[i]]}), a.reps),
        "rerank_url_new": _timed(lambda i: post("/v1/rerank", {"query": q, "documents": [
            {"image": files.url(f"{2 + a.reps + i}.png")}]}), a.reps),
        "rerank_url_cached": _timed(lambda i: post("/v1/rerank", {"query": q, "documents": [
            {"image": files.url("1.png")}]}), a.reps),
    }
    out["corpus_images"] = a.images
    out["image_size"] = size
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    serve.shutdown()
    ray.shutdown()
    files.stop()
    print(json.dumps(out, indent=2))
    return out


# ------------------------------------------------------------------------------------------ the live log at scale
def _line(phase: str, **fields) -> dict:
    """Print one JSON line (with the load average) and return it."""
    out = dict(phase=phase, **fields, loadavg=[round(x, 2) for x in os.getloadavg()])
    print(json.dumps(out), flush=True)
    return out


def _meta():
    """The default codec's table metadata: the shipped reranker's shape (16 tokens x 128 at int8, 128-d embeddings)."""
    from edje.schemas.token_table import TableMetadata

    return TableMetadata(kind="compressed", backbone="edje-tiny-convvit", pretrained=None, feature_layer="last",
                         num_tokens=16, width=128, quantization="int8", embed_dim=128, adapter_hash="bench")


def _synthetic(meta, n: int, seed: int):
    """n encoded rows of random bytes (what the encoder would hand to the add path)."""
    from edje.model.token_encoder import EncodedImages

    rng = np.random.default_rng(seed)
    codec = meta.codec
    return EncodedImages(rng.integers(0, 256, (n, codec.blob_bytes), dtype=np.uint8),
                         rng.random((n, codec.num_scales)).astype("<f2"),
                         rng.standard_normal((n, meta.embed_dim)).astype(np.float32))


def _files(folder: str) -> dict:
    """Files and bytes under a folder, and files by top-level entry (LOG, parts, wal, sources, ...)."""
    kinds, files, size = {}, 0, 0
    for root, _, names in os.walk(folder):
        top = os.path.relpath(root, folder).split(os.sep)[0]
        for n in names:
            key = n if top == "." else top
            kinds[key] = kinds.get(key, 0) + 1
            files += 1
            size += os.path.getsize(os.path.join(root, n))
    return dict(files=files, bytes=size, by_kind=kinds)


def _replica(base: str, live_dir: str, config):
    """A reranker replica's start: its token store, then LiveImages over the live folder (which applies the log)."""
    import torch

    from edje.serving.live_images import LiveImages
    from edje.storage.token_store import TokenStore

    t = time.perf_counter()
    store = TokenStore.load([base])
    t_store = time.perf_counter() - t
    live = LiveImages(store, None, torch.device("cpu"), live_dir, 10 ** 6, 4, config)
    return live, t_store, time.perf_counter() - t - t_store


def _restart(phase: str, base: str, live_dir: str, want_rows: int) -> dict:
    """Time a replica's start over the folder (reranker side) and the first stage's read of the live embeddings."""
    from edje.serving.live_images import embeddings_of_tables
    from edje.serving.live_log import LiveLog

    cpu = time.process_time()
    live, t_store, t_live = _replica(base, live_dir, None)
    cpu_live = time.process_time() - cpu
    rows = len(live.store)
    assert rows == want_rows, (rows, want_rows)
    del live
    t, cpu = time.perf_counter(), time.process_time()
    got, _ = LiveLog(live_dir).read()
    ids, _ = embeddings_of_tables(got)
    t_first, cpu_first = time.perf_counter() - t, time.process_time() - cpu
    return _line(phase, rows=rows, reranker_live_s=round(t_live, 3), reranker_store_s=round(t_store, 3),
                 reranker_cpu_s=round(cpu_live, 3), first_stage_live_s=round(t_first, 3),
                 first_stage_cpu_s=round(cpu_first, 3), first_stage_rows=len(ids))


def _add_many(phase: str, live, rows, prefix: str, source_bytes: int) -> dict:
    """Add rows one by one through the add path; throughput and latency."""
    from edje.model.token_encoder import EncodedImages

    data = os.urandom(source_bytes) if source_bytes else None
    n, lat, start, cpu = len(rows.blob), np.empty(len(rows.blob)), time.perf_counter(), time.process_time()
    for i in range(n):
        t = time.perf_counter()
        one = EncodedImages(rows.blob[i:i + 1], rows.scales[i:i + 1], rows.embeddings[i:i + 1])
        got = live.add_encoded(f"{prefix}{i:07d}", one, None, data)
        lat[i] = time.perf_counter() - t
        assert got.status == 200, got.detail
        if (i + 1) % 10_000 == 0 and i + 1 < n:
            _line(phase + "_progress", adds=i + 1, adds_per_s=round((i + 1) / (time.perf_counter() - start), 1))
    wall = time.perf_counter() - start
    return dict(adds=n, wall_s=round(wall, 1), cpu_ms_per_add=round((time.process_time() - cpu) / n * 1000, 3),
                adds_per_s=round(n / wall, 1), p50_ms=_pct(lat, 50),
                p99_ms=_pct(lat, 99), max_ms=round(float(lat.max()) * 1000, 1))


def _legacy(base: str, live_dir: str, meta, rows) -> dict:
    """The layout the log replaced, as its add and start-up did it: per add, under the flock, one Parquet table
    (temp + rename), one LOG line (fsync), the table read back and applied; at start, every table read."""
    import fcntl

    from edje.schemas.token_table import build_table_from_blobs, read_token_tables, write_token_table
    from edje.storage.token_store import TokenStore

    store = TokenStore.load([base])
    os.makedirs(os.path.join(live_dir, "tables"))
    log_path = os.path.join(live_dir, "LOG")
    open(log_path, "a").close()
    n, start = len(rows.blob), time.perf_counter()
    for i in range(n):
        with open(log_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            table = build_table_from_blobs(meta, [f"old{i:07d}"], rows.blob[i:i + 1], rows.scales[i:i + 1],
                                           rows.embeddings[i:i + 1], urls=[None])
            name = f"{os.path.getsize(log_path):012d}-{i:016x}.parquet"
            final = os.path.join(live_dir, "tables", name)
            write_token_table(table, final + ".tmp")
            os.replace(final + ".tmp", final)
            with open(log_path, "a") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            store.add_table(read_token_tables([final])[0])
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    wall = time.perf_counter() - start
    files = _files(live_dir)
    t, cpu = time.perf_counter(), time.process_time()
    with open(log_path) as f:
        paths = [os.path.join(live_dir, "tables", x) for x in f.read().split("\n") if x]
    table, _ = read_token_tables(paths)
    TokenStore.load([base]).add_table(table)
    restart, restart_cpu = time.perf_counter() - t, time.process_time() - cpu
    return dict(adds=n, adds_per_s=round(n / wall, 1), files=files["files"], bytes=files["bytes"],
                restart_s=round(restart, 3), restart_cpu_s=round(restart_cpu, 3),
                restart_ms_per_image=round(restart / n * 1000, 3), restart_cpu_ms_per_image=round(restart_cpu / n * 1000, 3))


def run_scale(a) -> dict:
    """The live log at scale (module docstring): adds, files, compaction, restarts, automatic compaction, legacy."""
    import shutil
    import tempfile

    from edje.schemas.token_table import build_table_from_blobs, write_token_table
    from edje.serving.live_log import LiveLog, LiveLogConfig

    work = a.workdir or tempfile.mkdtemp(prefix="bench-live-scale-")
    os.makedirs(work, exist_ok=True)
    meta = _meta()
    base_rows = _synthetic(meta, a.images, seed=1)
    base = os.path.join(work, "base.parquet")
    write_token_table(build_table_from_blobs(meta, [f"base{i:05d}" for i in range(a.images)], base_rows.blob,
                                             base_rows.scales, base_rows.embeddings), base)
    out = dict(row_bytes=meta.codec.blob_bytes + 2 * meta.codec.num_scales, embedding_bytes=4 * meta.embed_dim,
               base_rows=a.images, adds=a.scale, source_bytes=a.source_bytes, cpus=os.cpu_count())
    _line("setup", **out, workdir=work)

    live_dir = os.path.join(work, "live")
    rows = _synthetic(meta, a.scale, seed=2)
    # Compaction off while adding: the add path alone, then one compaction of everything.
    live, _, _ = _replica(base, live_dir, LiveLogConfig(compact_rows=a.scale + 1, compact_bytes=1 << 62))
    out["add"] = _line("add", **_add_many("add", live, rows, "live", a.source_bytes))
    del live
    out["files_before"] = _line("files_before_compaction", **_files(live_dir))
    out["restart_before"] = _restart("restart_before_compaction", base, live_dir, a.images + a.scale)
    t, cpu = time.perf_counter(), time.process_time()
    done = LiveLog(live_dir).compact()
    out["compact"] = _line("compact", wall_s=round(time.perf_counter() - t, 2), cpu_s=round(time.process_time() - cpu, 2),
                           parts=len(done["parts"]),
                           rows=done["rows"], part_rows_max=max(p["rows"] for p in done["parts"]))
    out["files_after"] = _line("files_after_compaction", **_files(live_dir))
    out["restart_after"] = _restart("restart_after_compaction", base, live_dir, a.images + a.scale)

    if a.auto:
        auto_dir = os.path.join(work, "live-auto")
        live, _, _ = _replica(base, auto_dir, LiveLogConfig())  # the default: a thread compacts every 10,000 rows
        got = _add_many("auto", live, _synthetic(meta, a.auto, seed=3), "auto", a.source_bytes)
        live.wait_for_compaction()  # a compaction in flight finishes before the files are counted
        out["auto"] = _line("auto_compaction", **got, compactions=len(live.compactions), **_files(auto_dir))
        del live
        out["restart_auto"] = _restart("restart_auto", base, auto_dir, a.images + a.auto)

    if a.legacy:
        out["legacy"] = _line("legacy_one_table_per_image", **_legacy(base, os.path.join(work, "legacy"), meta,
                                                                      _synthetic(meta, a.legacy, seed=4)))
        leg = out["legacy"]
        leg["restart_s_extrapolated_to_adds"] = round(leg["restart_ms_per_image"] * a.scale / 1000, 1)
        leg["restart_cpu_s_extrapolated_to_adds"] = round(leg["restart_cpu_ms_per_image"] * a.scale / 1000, 1)
    if a.sqlite:
        out["sqlite"] = _line("sqlite_wal", **_sqlite(base, os.path.join(work, "sqlite"), meta,
                                                      _synthetic(meta, a.sqlite, seed=5)))
    if not a.workdir:
        shutil.rmtree(work)
    return out


def _sqlite(base: str, folder: str, meta, rows) -> dict:
    """The same adds into SQLite (WAL, synchronous=FULL: each commit fsyncs the WAL), each one a transaction that
    checks the id first, as a replica's add does; then a restart: every row read back into a replica's store."""
    import sqlite3

    import pyarrow as pa

    from edje.schemas.token_table import build_table_from_blobs
    from edje.storage.token_store import TokenStore

    os.makedirs(folder)
    path = os.path.join(folder, "live.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE live (seq INTEGER PRIMARY KEY, image_id TEXT UNIQUE NOT NULL, batch BLOB NOT NULL)")
    n, lat, start, cpu = len(rows.blob), np.empty(len(rows.blob)), time.perf_counter(), time.process_time()
    for i in range(n):
        t = time.perf_counter()
        image_id = f"sql{i:07d}"
        table = build_table_from_blobs(meta, [image_id], rows.blob[i:i + 1], rows.scales[i:i + 1],
                                       rows.embeddings[i:i + 1], urls=[None])
        db.execute("BEGIN IMMEDIATE")
        if db.execute("SELECT 1 FROM live WHERE image_id = ?", (image_id,)).fetchone():
            raise AssertionError(image_id)
        db.execute("INSERT INTO live (image_id, batch) VALUES (?, ?)",
                   (image_id, table.to_batches()[0].serialize().to_pybytes()))
        db.execute("COMMIT")
        lat[i] = time.perf_counter() - t
    wall, add_cpu = time.perf_counter() - start, time.process_time() - cpu
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    files = _files(folder)
    t, cpu = time.perf_counter(), time.process_time()
    db = sqlite3.connect(path)
    schema = build_table_from_blobs(meta, ["x"], rows.blob[:1], rows.scales[:1], rows.embeddings[:1], urls=[None]).schema
    batches = [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for (b,) in db.execute("SELECT batch FROM live ORDER BY seq")]
    db.close()
    store = TokenStore.load([base])
    store.add_table(pa.Table.from_batches(batches))
    restart, restart_cpu = time.perf_counter() - t, time.process_time() - cpu
    return dict(adds=n, adds_per_s=round(n / wall, 1), cpu_ms_per_add=round(add_cpu / n * 1000, 3),
                p50_ms=_pct(lat, 50), p99_ms=_pct(lat, 99), files=files["files"], bytes=files["bytes"],
                restart_s=round(restart, 3), restart_cpu_s=round(restart_cpu, 3))


if __name__ == "__main__":
    main()
