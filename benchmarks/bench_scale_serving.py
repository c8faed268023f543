"""Serving on one node as the corpus grows from 10k to 10M rows: start-up, RSS per replica, /v1/search latency.

    nice -n 10 .venv/bin/python benchmarks/bench_scale_serving.py --rows 10000 1000000 10000000 --workdir runs/scale

Per N it writes (or reuses) a synthetic corpus under WORKDIR/rows-N/tables: token rows in the shipped reranker's
layout (`edje-c16-bind`: 16 tokens x 128 int8 + fp16 scales = 2,080 B per image, random bytes) and pooled
embeddings drawn around 1,000 cluster centres (serving/random_corpus.py `write_synthetic_tables`), 100,000 rows
per table so that memory stays flat. It builds the node's table cache and the first stage's IVF-PQ index ahead of
serving (`python -m edje.storage.prebuild`, timed: `cache_build_s`), then serves the corpus with `jobs/serve.py`
(a local Ray started by it, one Reranker and one FirstStage replica, IVF-PQ first stage) and measures: start-up
(launch to healthy, `startup_s`), the resident memory of every Serve replica (VmRSS, RssAnon, RssFile from /proc
after the load; the replica processes are found as descendants of the serve process), and `POST /v1/search`
(top 10 reranked) p50 / p99 / requests/s / errors from `--concurrency` closed-loop clients for `--seconds`.
One JSON line per N; docs/latency_vs_corpus.png is redrawn after each N (log x).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ROW_BYTES_ON_DISK = 2 * (2080 + 512 + 80)  # tables + cache, per row: tokens, scales, embedding, id and url


def corpus_tables(workdir: Path, rows: int, meta) -> tuple:
    """The synthetic tables of N rows (written unless already there); (paths, seconds spent writing)."""
    from edje.serving.random_corpus import SyntheticRows, write_synthetic_tables

    started = time.time()
    paths = write_synthetic_tables(str(workdir / f"rows-{rows}" / "tables"), meta, rows,
                                   SyntheticRows(rows_per_table=min(rows, 100_000)))
    return paths, time.time() - started


def shipped_metadata():
    """Table metadata of the shipped reranker's rows (what its checkpoint serves)."""
    from edje import EDJEReranker
    from edje.schemas.shipped import DEFAULT_RERANKER

    return EDJEReranker.from_pretrained(DEFAULT_RERANKER)._meta(), DEFAULT_RERANKER


def build_cache(tables_dir: Path, factory: str, nprobe: int) -> dict:
    """Build the table cache and the saved index in a child process (its memory is not the benchmark's)."""
    started = time.time()
    # Passive OpenMP waits: FAISS's threads spinning at barriers on a shared 2-core machine cost more than they give.
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, "-m", "edje.storage.prebuild", str(tables_dir), "--index-factory", factory,
                          "--index-search-params", f"nprobe={nprobe}"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode:
        raise RuntimeError(f"table cache build failed: {out.stderr[-3000:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    return {"cache_build_s": round(time.time() - started, 1), "index": info.get("index", {}),
            "cache_folder": info["folder"]}


def du(path: Path) -> int:
    """Bytes of the files under a folder."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def children(pid: int) -> List[int]:
    """Every descendant of a process (from /proc's parent links)."""
    parent: Dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def replica_memory(serve_pid: int) -> Dict[str, dict]:
    """VmRSS / RssAnon / RssFile (MB) of the Serve replica processes under the serve process, by deployment."""
    out: Dict[str, dict] = {}
    for pid in children(serve_pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "ServeReplica:" not in cmd:
            continue
        name = cmd.split("ServeReplica:", 1)[1].split()[0].split(":")[-1]
        fields = {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in status.splitlines())
                  if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
        out[name] = {k: round(v, 1) for k, v in fields.items()}
    return out


def start_serving(checkpoint: str, tables_dir: Path, factory: str, nprobe: int, port: int, log_path: Path):
    """jobs/serve.py on a local Ray of its own, blocking; (process, seconds until it printed that it is healthy)."""
    env = {k: v for k, v in os.environ.items() if k != "EDJE_API_TOKEN"}
    env.update(RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "jobs/serve.py", "--address", "local", "--block", "--checkpoint", checkpoint,
           "--tokens", str(tables_dir), "--index-factory", factory, "--index-search-params", f"nprobe={nprobe}",
           "--torch-threads", "1", "--reranker-cpus", "1", "--port", str(port), "--name", "scale",
           "--ready-timeout", "1800"]
    log = open(log_path, "w")
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)
    for line in proc.stdout:
        log.write(line)
        log.flush()
        if line.startswith("{") and '"url"' in line:
            return proc, time.time() - started, json.loads(line)
    raise RuntimeError(f"jobs/serve.py exited ({proc.wait()}) before it was healthy: see {log_path}")


def stop_serving(proc: subprocess.Popen) -> None:
    """Ctrl-C the serve process (it shuts Serve down and its local Ray with it), then make sure of its group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this benchmark started: raylet, GCS, workers
    except ProcessLookupError:
        pass


async def load(url: str, queries: List[str], seconds: float, concurrency: int) -> dict:
    """Closed-loop POST /v1/search (top 10 reranked) from `concurrency` clients for `seconds`."""
    import httpx

    lat, errors = [], 0
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def worker(w: int):
            nonlocal errors
            i = w
            while time.perf_counter() - t0 < seconds:
                start = time.perf_counter()
                try:
                    r = await client.post(url, json={"query": queries[i % len(queries)], "top_k": 10})
                    ok = r.status_code == 200 and len(r.json()["results"]) == 10
                except (httpx.HTTPError, KeyError, ValueError):
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - start)
                else:
                    errors += 1
                i += concurrency
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": errors, "rps": round(len(lat) / wall, 2),
            "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1) if lat else None,
            "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 1) if lat else None}


def measure(rows: int, args, meta, checkpoint: str) -> dict:
    """One N: corpus, cache, serve, load, memory; the JSON line's fields."""
    from edje.serving.ports import free_port
    from edje.serving.random_corpus import caption_of

    workdir = Path(args.workdir)
    free = shutil.disk_usage(workdir).free
    tables_dir = workdir / f"rows-{rows}" / "tables"
    if not tables_dir.exists() and free < rows * ROW_BYTES_ON_DISK * 1.05:
        return {"rows": rows, "error": f"needs ~{rows * ROW_BYTES_ON_DISK / 1e9:.0f} GB, {free / 1e9:.0f} GB free"}
    out: dict = {"rows": rows}
    paths, out["build_s"] = corpus_tables(workdir, rows, meta)
    out["build_s"] = round(out["build_s"], 1)
    out.update(build_cache(tables_dir, args.index_factory, args.nprobe))
    folder = Path(out.pop("cache_folder"))
    tokens = sum((folder / f).stat().st_size for f in ("tokens.npy", "token_scales.npy"))
    out["tokens_disk_gb"] = round(tokens / 1e9, 2)
    out["disk_gb"] = round((du(tables_dir)) / 1e9, 2)  # tables + their cache (.edje-cache beside them)
    out["load_before"] = [round(x, 2) for x in os.getloadavg()]
    port = free_port()
    proc, startup, ready = start_serving(checkpoint, tables_dir, args.index_factory, args.nprobe, port,
                                         workdir / f"rows-{rows}" / "serve.log")
    try:
        out["startup_s"] = round(startup, 1)
        out["rss_after_start"] = replica_memory(proc.pid)
        url = f"http://127.0.0.1:{port}/v1/search"
        queries = [caption_of(i) for i in range(997)]
        asyncio.run(load(url, queries, args.warmup, args.concurrency))
        res = asyncio.run(load(url, queries, args.seconds, args.concurrency))
        out.update(res)
        mem = replica_memory(proc.pid)
        out["rss_mb_per_replica"] = {k: v["VmRSS"] for k, v in mem.items()}
        out["rss_detail_mb"] = mem
    finally:
        stop_serving(proc)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def plot(results: List[dict], path: Path) -> None:
    """p50 / p99 of /v1/search and RSS per replica against corpus rows (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if r.get("p99_ms")]
    if not done:
        return
    rows = [r["rows"] for r in done]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(rows, [r["p50_ms"] for r in done], "o-", label="p50")
    a.plot(rows, [r["p99_ms"] for r in done], "s-", label="p99")
    a.set(xscale="log", xlabel="corpus rows", ylabel="POST /v1/search ms (top 10 reranked)", ylim=(0, None),
          title=f"latency, {done[0].get('concurrency', 8)} clients")
    a.legend()
    for name in ("Reranker", "FirstStage", "Ingress"):
        b.plot(rows, [r["rss_mb_per_replica"].get(name, np.nan) / 1024 for r in done], "o-", label=f"{name} RSS")
    b.plot(rows, [r["tokens_disk_gb"] / 1.073741824 for r in done], "k--", label="token rows on disk")
    b.set(xscale="log", yscale="log", xlabel="corpus rows", ylabel="GiB", title="memory per replica vs tokens on disk")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    """Measure every N in --rows; one JSON line each."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--workdir", default="runs/scale")
    p.add_argument("--index-factory", default="IVF1024,PQ32np")
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--plot", default=str(ROOT / "docs" / "latency_vs_corpus.png"))
    p.add_argument("--prepare-only", action="store_true", help="write the corpora and their caches, serve nothing")
    args = p.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    meta, checkpoint = shipped_metadata()
    results = []
    for rows in args.rows:
        if args.prepare_only:
            paths, seconds = corpus_tables(Path(args.workdir), rows, meta)
            print(json.dumps({"rows": rows, "build_s": round(seconds, 1),
                              **build_cache(Path(args.workdir) / f"rows-{rows}" / "tables", args.index_factory,
                                            args.nprobe)}),
                  flush=True)
            continue
        res = {**measure(rows, args, meta, checkpoint), "concurrency": args.concurrency, "seconds": args.seconds,
               "index_factory": args.index_factory, "nprobe": args.nprobe}
        results.append(res)
        print(json.dumps(res), flush=True)
        with open(Path(args.workdir) / "bench_scale_serving.jsonl", "a") as f:
            f.write(json.dumps(res) + "\n")
        plot(results, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
