"""Scale of the encode job's driver: read -> validate -> dedupe -> plan -> manifest, encode off.

    python benchmarks/bench_scale.py --sizes 1M 12M 50M --workdir /tmp/edje-scale
    python benchmarks/bench_scale.py --sizes 1M --compare HEAD~1 --compare-reps 5   # before/after, alternating
    python benchmarks/bench_scale.py --sizes --s3-shards 100 1000 10000             # S3 ledger vs shard count

For each size it writes a synthetic LAION-style url list (Parquet parts of --part-rows rows,
columns URL and TEXT, written in chunks; 0.1% repeated urls across parts, 0.05% empty captions),
then runs pipeline.resume.plan_job, the exact code a job runs before it needs Ray, in a fresh
subprocess, and prints rows/s and peak driver RSS (ru_maxrss of that process). It then marks
0%, 50% and 99% of the shards committed (one small stats record each, as commits write them)
and times the resume step (manifest + plan + one listing of stats/) in a fresh process, plus
the cost of one more commit record. Generated files are deleted unless --keep.

Rows per CPU-second count the CPU time (user + system, all threads) of plan_job alone, not the
interpreter's start and imports; the 1-minute load average is recorded before and after each
measurement (this machine is shared). --compare REF extracts `pipeline/` and `schemas/` of a
git revision and plans the first size with it and with the working tree, alternately, in fresh
processes, --compare-reps times each: medians of the two, measured under the same load.

--s3-shards N... measures the shard ledger on S3 (moto's server on loopback, s3fs): for each N,
save a manifest and plan of N shards, commit the shards' records (each commit first checks for
its record, then writes it, as pipeline.write.commit_shard does), timing a sample of commits
early and late, then the resume step (manifest + plan + one listing of stats/) at 0, 50 and 99%
committed. Commit cost per shard and resume time should not grow with N beyond the listing.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

WORDS = np.array("a an the red blue green small large cube sphere cone left of right above below next to "
                 "photo picture dog cat house tree car street beach mountain city night sunset bird".split())
META = {"kind": "compressed", "backbone": "ViT-L-16-SigLIP2-384", "quantization": "int8", "num_tokens": 64}


def parse_size(s: str) -> int:
    """'12M' -> 12_000_000."""
    mult = {"K": 1_000, "M": 1_000_000}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if s[-1].isalpha() else s) * mult)


def generate(folder: Path, rows: int, part_rows: int, chunk: int = 1_000_000) -> float:
    """Write `rows` synthetic (URL, TEXT) rows as Parquet parts, a chunk at a time; returns GB written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(rows)
    for part, start in enumerate(range(0, rows, part_rows)):
        n_part = min(part_rows, rows - start)
        with pq.ParquetWriter(folder / f"part-{part:05d}.parquet", pa.schema([("URL", pa.string()),
                                                                             ("TEXT", pa.string())])) as w:
            for s in range(start, start + n_part, chunk):
                n = min(chunk, start + n_part - s)
                idx = np.arange(s, s + n)
                src = idx.copy()
                dup = rng.random(n) < 0.001  # a url seen earlier, often in an earlier part
                src[dup] = rng.integers(0, np.maximum(idx[dup], 1))
                host = pc.cast(pa.array(src % 9973), pa.string())
                key = pc.cast(pa.array((src * 2654435761) % 4294967291), pa.string())
                url = pc.binary_join_element_wise("https://img", host, ".example-cdn.com/photos/",
                                                  pc.cast(pa.array(src), pa.string()), "/", key, ".jpg", "")
                words = [pa.array(WORDS[rng.integers(0, len(WORDS), n)]) for _ in range(8)]
                text = pc.binary_join_element_wise(*words, " ")
                empty = pa.array(rng.random(n) < 0.0005)
                text = pc.if_else(empty, pa.scalar("  ", pa.string()), text)
                w.write_table(pa.table({"URL": url, "TEXT": text}), row_group_size=256_000)
    (folder / "_COMPLETE").write_text("")  # a list cut short by a killed run is never reused
    return sum(f.stat().st_size for f in folder.iterdir()) / 1e9


def child_plan(input_dir: str, output: str, shard_size: int, scratch: str) -> dict:
    """In a fresh process: plan_job on the list (encode off); rows/s and peak RSS."""
    from edje.pipeline.resume import plan_job
    from edje.schemas.encode_job import EncodeJobConfig

    cfg = EncodeJobConfig(output=output, input=input_dir, url_col="URL", caption_col="TEXT", shard_size=shard_size,
                          scratch=scratch)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load0 = os.getloadavg()[0]
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.time()
    manifest, shards = plan_job(cfg, output, input_dir, None, META, {})
    seconds = time.time() - t0
    use = resource.getrusage(resource.RUSAGE_SELF)
    # all threads, plan_job only; on a shared machine the load-independent figure
    cpu = use.ru_utime + use.ru_stime - use0.ru_utime - use0.ru_stime
    return {"cpu_s": round(cpu, 2), "user_s": round(use.ru_utime - use0.ru_utime, 2),
            "sys_s": round(use.ru_stime - use0.ru_stime, 2), "process_cpu_s": round(use.ru_utime + use.ru_stime, 2),
            "rows_per_cpu_s": round(manifest.rows_in / cpu), "rows": manifest.rows_in, "kept": manifest.rows_kept,
            "shards": manifest.num_shards, "failed": manifest.read_failed, "seconds": round(seconds, 2),
            "load_before": load0, "load_after": os.getloadavg()[0], "digest": manifest.plan_digest,
            "rows_per_s": round(manifest.rows_in / seconds), "rss_start_mb": round(rss0),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "arrow_peak_mb": round(pa.default_memory_pool().max_memory() / 2**20)}


def child_resume(input_dir: str, output: str, shard_size: int) -> dict:
    """In a fresh process: the resume step (reuse the plan, list committed shards) and one commit record."""
    from edje.pipeline import storage
    from edje.pipeline.manifest import committed_shards
    from edje.pipeline.resume import plan_job
    from edje.schemas.encode_job import EncodeJobConfig

    cfg = EncodeJobConfig(output=output, input=input_dir, url_col="URL", caption_col="TEXT", shard_size=shard_size)
    t0 = time.time()
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    manifest, shards = plan_job(cfg, output, input_dir, None, META, {})
    done = committed_shards(output)
    pending = [s for s in range(manifest.num_shards) if s not in done]
    resume_s = time.time() - t0
    use1 = resource.getrusage(resource.RUSAGE_SELF)
    resume_cpu = use1.ru_utime + use1.ru_stime - use0.ru_utime - use0.ru_stime
    t1 = time.time()
    record = storage.join(output, "stats", f"{10**9 - 1}.json")  # pipeline.write.stats_path's layout
    storage.write_json(record, {"shard": -1})  # one more commit record
    commit_s = time.time() - t1
    storage.remove(record)
    return {"committed": len(done), "pending": len(pending), "resume_s": round(resume_s, 3),
            "load_avg": os.getloadavg()[0],
            "resume_cpu_s": round(resume_cpu, 3),
            "commit_record_ms": round(commit_s * 1000, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def mark_committed(output: str, shard_ids) -> None:
    """Write the stats record of each shard, as commit_shard would (small JSON, written once)."""
    stats = Path(output) / "stats"
    stats.mkdir(exist_ok=True)
    for s in shard_ids:
        (stats / f"{s:05d}.json").write_text(json.dumps({"shard": int(s), "images_ok": 0}))


def run_child(args: list, code_root: str = None) -> dict:
    # Another revision plans with its own copy of this script, which finds that revision's code itself.
    script = Path(code_root) / "benchmarks" / "bench_scale.py" if code_root else Path(__file__)
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=False)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 and not last.startswith("{"):
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(last)
    if out.returncode != 0:  # measured and printed, then died on the way out: keep the figures, say so
        result["exit_code"], result["exit_stderr"] = out.returncode, out.stderr[-300:]
        print(f"[warning] child exited {out.returncode} after its result: {out.stderr[-300:]!r}", flush=True)
    return result


def compare(ref: str, lst: Path, work: Path, shard_size: int, reps: int) -> dict:
    """Plan `lst` with git revision `ref` and with the working tree, alternately; medians of each."""
    root = Path(__file__).resolve().parent.parent
    tree = work / f"code-{ref.replace('/', '_').replace('~', '_')}"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", top, "archive", ref, "pipeline", "schemas"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    runs = {ref: [], "working tree": []}
    for _ in range(reps):
        for name, code in ((ref, str(tree)), ("working tree", None)):
            out, scratch = work / "cmp-out", work / "cmp-scratch"
            for d in (out, scratch):
                shutil.rmtree(d, ignore_errors=True)
            scratch.mkdir(parents=True)
            runs[name].append(run_child(["--child", str(lst), str(out), str(shard_size), str(scratch)], code))
    for d in (tree, work / "cmp-out", work / "cmp-scratch"):
        shutil.rmtree(d, ignore_errors=True)
    summary = {}
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu_s", "user_s", "sys_s")}
        summary[name] = {"rows": rs[0]["rows"], "digests": sorted({r["digest"] for r in rs}), **med,
                         "rows_per_s": round(rs[0]["rows"] / med["seconds"]),
                         "rows_per_cpu_s": round(rs[0]["rows"] / med["cpu_s"]),
                         "loads": [r["load_before"] for r in rs]}
        print(f"[compare] {name:>14}: median {med['seconds']:.2f} s wall, {med['cpu_s']:.2f} CPU-s "
              f"(user {med['user_s']:.2f}, sys {med['sys_s']:.2f}) -> {summary[name]['rows_per_s']:,} rows/s, "
              f"{summary[name]['rows_per_cpu_s']:,} rows/CPU-s; plan digest {summary[name]['digests']}; "
              f"load {summary[name]['loads']}", flush=True)
    return summary


def s3_ledger(shard_counts, sample: int = 50, threads: int = 16) -> list:
    """Commit and resume cost of the shard ledger on an S3 server on loopback, against the shard count."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    from edje.pipeline import storage
    from edje.pipeline.manifest import JobManifest, committed_shards, load_manifest, load_plan, save_manifest
    from edje.pipeline.write import stats_path

    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(creds)
    with socket.socket() as sock:  # a free port for moto's server, run in its own process (not this one's GIL)
        sock.bind(("127.0.0.1", 0))
        host, port = sock.getsockname()
    server = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", host, "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **creds})
    results = []
    try:
        for _ in range(300):
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        storage.configure_s3_endpoint(f"http://{host}:{port}")
        boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(Bucket="bench")

        def commit(output: str, shard: int) -> float:  # the ledger part of pipeline.write.commit_shard
            t = time.perf_counter()
            if storage.read_json(stats_path(output, shard)) is None:
                storage.write_json(stats_path(output, shard), {"shard": shard, "images_ok": 1000})
            return time.perf_counter() - t

        def resume(output: str) -> float:
            t = time.perf_counter()
            manifest = load_manifest(output)
            load_plan(output)
            done = committed_shards(output)
            assert len([s for s in range(manifest.num_shards) if s not in done]) == manifest.num_shards - len(done)
            return time.perf_counter() - t

        for n in shard_counts:
            output = f"s3://bench/out-{n}"
            shards = pa.table({"shard": pa.array(np.arange(n, dtype=np.int64)), "rows": pa.array(np.full(n, 1000)),
                               "digest": pa.array([f"{i:016x}" for i in range(n)])})
            manifest = JobManifest(input=["s3://bench/in"], kind="compressed", table_metadata=META, shard_size=1000,
                                   shards_per_file=64, read_options={}, fingerprint="f" * 16, rows_in=1000 * n,
                                   rows_kept=1000 * n, read_failed={}, read_examples={}, num_shards=n,
                                   plan_digest="d" * 16, has_ids=False)
            t = time.perf_counter()
            save_manifest(output, manifest, shards)
            plan_s = time.perf_counter() - t
            r = {"shards": n, "save_manifest_s": round(plan_s, 3), "load_before": os.getloadavg()[0]}
            r["resume_0%_s"] = round(resume(output), 3)
            k = min(sample, n // 2)
            early = [commit(output, s) for s in range(k)]  # the first commits, next to an empty ledger
            with ThreadPoolExecutor(threads) as pool:  # the bulk, untimed, to reach 50% committed
                list(pool.map(lambda s, output=output: commit(output, s), range(k, n // 2)))
            r["resume_50%_s"] = round(resume(output), 3)
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda s, output=output: commit(output, s), range(n // 2, int(n * 0.99) - k)))
            late = [commit(output, s) for s in range(int(n * 0.99) - k, int(n * 0.99))]  # next to ~99% committed
            r["resume_99%_s"] = round(resume(output), 3)
            r["committed"] = len(committed_shards(output))
            r["commit_ms_early"] = round(1000 * statistics.median(early), 2)
            r["commit_ms_late"] = round(1000 * statistics.median(late), 2)
            r["load_after"] = os.getloadavg()[0]
            print(f"[s3] {n:>6} shards: commit {r['commit_ms_early']:.1f} ms/shard (first {k}), "
                  f"{r['commit_ms_late']:.1f} ms/shard (at ~99%); resume 0/50/99% "
                  f"{r['resume_0%_s']:.3f}/{r['resume_50%_s']:.3f}/{r['resume_99%_s']:.3f} s; "
                  f"load {r['load_before']:.1f}-{r['load_after']:.1f}", flush=True)
            results.append(r)
    finally:
        server.terminate()
        server.wait()
    if len(results) > 1:
        a, b = results[0], results[-1]
        print(f"[s3] {b['shards']}/{a['shards']} shards: commit x{b['commit_ms_late'] / a['commit_ms_late']:.2f}, "
              f"resume at 99% x{b['resume_99%_s'] / a['resume_99%_s']:.2f} "
              f"({b['shards'] / a['shards']:.0f}x the shards)", flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="*", default=["1M", "12M", "50M"])
    p.add_argument("--workdir", default="/tmp/edje-scale")
    p.add_argument("--part-rows", type=int, default=2_000_000, help="rows per Parquet part (LAION: ~1.2M)")
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--keep", action="store_true", help="keep the generated lists and outputs")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--compare", metavar="REF", help="also plan the first size with this git revision, alternately")
    p.add_argument("--compare-reps", type=int, default=5)
    p.add_argument("--s3-shards", nargs="*", type=int, default=[], help="S3 ledger benchmark at these shard counts")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--child-resume", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child_plan(args.child[0], args.child[1], int(args.child[2]), args.child[3])))
        return
    if args.child_resume:
        print(json.dumps(child_resume(args.child_resume[0], args.child_resume[1], int(args.child_resume[2]))))
        return

    work = Path(args.workdir)
    results = []
    comparison = None
    for i, size in enumerate(args.sizes):
        n = parse_size(size)
        lst, out, scratch = work / f"list-{size}", work / f"out-{size}", work / f"scratch-{size}"
        for d in (out, scratch):
            shutil.rmtree(d, ignore_errors=True)
        scratch.mkdir(parents=True)
        t = time.time()
        if not (lst / "_COMPLETE").exists():
            shutil.rmtree(lst, ignore_errors=True)
        gb = generate(lst, n, args.part_rows) if not (lst / "_COMPLETE").exists() else \
            sum(f.stat().st_size for f in lst.iterdir()) / 1e9
        print(f"[{size}] list: {gb:.2f} GB of Parquet in {time.time() - t:.0f} s", flush=True)
        if args.compare and i == 0:
            comparison = compare(args.compare, lst, work, args.shard_size, args.compare_reps)
        r = run_child(["--child", str(lst), str(out), str(args.shard_size), str(scratch)])
        r.update(size=size, list_gb=round(gb, 2), load_avg=os.getloadavg()[0])
        print(f"[{size}] plan: {json.dumps(r)}", flush=True)
        resumes = {}
        for frac in (0.0, 0.5, 0.99):
            want = int(r["shards"] * frac)
            have = len(list((out / "stats").glob("*.json"))) if (out / "stats").exists() else 0
            mark_committed(str(out), range(have, want))
            resumes[f"{int(frac * 100)}%"] = run_child(["--child-resume", str(lst), str(out), str(args.shard_size)])
            print(f"[{size}] resume at {int(frac * 100)}% committed: {json.dumps(resumes[f'{int(frac * 100)}%'])}",
                  flush=True)
        r["resume"] = resumes
        results.append(r)
        if args.json:  # after each size: a long run stopped later keeps what it measured
            Path(args.json).write_text(json.dumps({"sizes": results, "compare": comparison}, indent=2))
        if not args.keep:
            for d in (lst, out, scratch):
                shutil.rmtree(d, ignore_errors=True)
    s3 = s3_ledger(args.s3_shards) if args.s3_shards else []
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": results, "compare": comparison, "s3": s3}, indent=2))
    if not results:
        return
    base = results[0]
    print("\nsize  rows        rows/s   rows/CPU-s  peak RSS MB (Arrow)  RSS vs first  resume 0/50/99% wall s (CPU s)")
    for r in results:
        res = "/".join(f"{r['resume'][k]['resume_s']:.2f}" for k in ("0%", "50%", "99%"))
        cpu = "/".join(f"{r['resume'][k]['resume_cpu_s']:.2f}" for k in ("0%", "50%", "99%"))
        print(f"{r['size']:>5} {r['rows']:>11,} {r['rows_per_s']:>8,} {r['rows_per_cpu_s']:>11,} "
              f"{r['peak_rss_mb']:>12} ({r['arrow_peak_mb']}) "
              f"{r['peak_rss_mb'] / base['peak_rss_mb']:>8.2f}x  {res} ({cpu})")


if __name__ == "__main__":
    main()
