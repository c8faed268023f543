"""Serving load on one shard against three; replicas killed under load; overload refused with 503.

    .venv/bin/python benchmarks/bench_shards.py --phases kill overload --images 600 --seconds 30 \
        --workdir runs/shards --json runs/bench_shards.json
    .venv/bin/python benchmarks/bench_shards.py --phases compare --concurrency 32    # one shard against three

One local Ray, one Serve instance on loopback, applications over a sample-world corpus encoded by the shipped
reranker (int8). Every phase sends `POST /v1/search` (top 10, reranked).
- compare: `one` (shards=1) and `three` (shards=3), `concurrency` closed-loop clients for `seconds`, taking turns
  (one, three, one, three): p50/p99 latency, requests/s, errors, and the resident memory of every replica.
- kill: `--shards` shards with `--replicas-per-shard` replicas each (default 2 and 2), steady closed-loop load; a
  third of the way in one Reranker and one FirstStage replica (of different shards) are killed (`ray.kill`, as a
  lost node would). Prints the failed requests (%), the longest time without any answer (from 1 s before the kill
  on), and checks that an image added through /v1/images before the kill is still served after it.
  Goals: <= 0.5 % failed, no stretch longer than 2 s.
- overload: one shard, one replica of each deployment, for each `--admit ONGOING:QUEUED` setting the ingress admitting
  ONGOING requests at once and QUEUED more in Serve's proxy. Measures the unloaded latency (one client), the rate the
  replica sustains (ONGOING closed-loop clients), then sends an open-loop stream at `--overload-factor` (4) times that
  rate and prints the share of 503s, their latency and Retry-After, and the p99 of the admitted requests against the
  unloaded p99. Goals: 503s within 100 ms, admitted p99 within 2x the unloaded p99. `--admit gate:N` runs the
  ingress's own gate instead (`ServeConfig.admit_in_flight`: N in flight, no queue) with N clients for the
  sustained rate.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np


def build_corpus(workdir: Path, images: int, seed: int):
    """A sample world's test split encoded by the shipped reranker into one int8 token table; (table, captions, ids)."""
    from edje import EDJEReranker
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.annotations import load_annotations
    from edje.schemas.shipped import DEFAULT_RERANKER
    from edje.schemas.token_table import build_table_from_blobs, write_token_table

    world = workdir / "world"
    if not (world / "world.json").exists():
        generate(WorldConfig(seed=seed, n_train=0, n_val=0, n_test=images), world)
    ann = load_annotations(str(world / "flickr30k_test.json"))
    table = workdir / "corpus.parquet"
    if not table.exists():
        reranker = EDJEReranker.from_pretrained(DEFAULT_RERANKER)
        rows = reranker.encode_images(list(ann.image_paths))
        write_token_table(build_table_from_blobs(reranker._meta(), list(ann.image_ids), rows.blob, rows.scales,
                                                 rows.embeddings), str(table))
    caps = [ann.captions[c[0]] for c in ann.image_to_captions()]
    return str(table), caps, list(ann.image_ids), [str(p) for p in ann.image_paths]


def serve_replicas() -> List[dict]:
    """Live Serve replica actors: class name ('ServeReplica:<app>:<deployment>'), actor name, pid (from the GCS)."""
    from ray._private import state  # the GCS's actor table; the state API would need the dashboard

    return [{"class": v["ActorClassName"], "name": v["Name"], "pid": v["Pid"]} for v in state.actors().values()
            if v.get("State") == "ALIVE" and str(v.get("ActorClassName", "")).startswith("ServeReplica:")]


def replica_rss() -> Dict[str, float]:
    """MB resident per live Serve replica, by 'app:deployment#n' (VmRSS of the actor's process)."""
    out, seen = {}, {}
    for a in serve_replicas():
        key = a["class"][len("ServeReplica:"):]
        seen[key] = seen.get(key, 0) + 1
        try:
            with open(f"/proc/{a['pid']}/status") as f:
                kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        out[f"{key}#{seen[key]}"] = round(kb / 1024, 1)
    return out


async def load(url: str, queries: List[str], seconds: float, concurrency: int, on_tick=None) -> dict:
    """Closed-loop load: `concurrency` clients for `seconds`; latencies of answers, failures with their times."""
    import httpx

    lat, fails, ok_times = [], [], []
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def worker(w: int):
            i = w
            while time.perf_counter() - t0 < seconds:
                start = time.perf_counter()
                try:
                    r = await client.post(url, json={"query": queries[i % len(queries)], "top_k": 10})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                end = time.perf_counter()
                if ok:
                    lat.append(end - start)
                    ok_times.append(end - t0)
                else:
                    fails.append(end - t0)
                i += concurrency

        async def ticker():
            if on_tick is not None:
                await on_tick(t0)
        await asyncio.gather(ticker(), *(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": len(fails), "rps": round(len(lat) / wall, 2),
            "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1) if lat else None,
            "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 1) if lat else None,
            "fail_times": fails, "ok_times": ok_times}


def kill_replicas(app: str, deployments: List[str]) -> List[str]:
    """Kill one replica actor of each named deployment of `app` (as a lost node would); their names."""
    import ray

    killed = []
    for dep in deployments:
        victim = next((a["name"] for a in serve_replicas() if a["class"] == f"ServeReplica:{app}:{dep}"), None)
        if victim:
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            killed.append(victim)
    return killed


def longest_gap(ok_times: List[float], since: float, until: float) -> float:
    """The longest time between `since` and `until` without any answer (s)."""
    marks = [since] + sorted(t for t in ok_times if since < t < until) + [until]
    return float(max(np.diff(marks)))


def percentile_ms(values: List[float], q: float) -> Optional[float]:
    """The q-th percentile of latencies in seconds, as ms (None without any)."""
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


async def open_loop(url: str, queries: List[str], rate: float, seconds: float) -> List[dict]:
    """Requests sent at a fixed `rate` for `seconds` whatever the answers (arrivals do not wait for them): status,
    latency, Retry-After of each."""
    import httpx

    out: List[dict] = []
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(i: int):
            start = time.perf_counter()
            try:
                r = await client.post(url, json={"query": queries[i % len(queries)], "top_k": 10})
                status, retry = r.status_code, r.headers.get("retry-after")
            except httpx.HTTPError as e:
                status, retry = type(e).__name__, None
            out.append({"status": status, "latency": time.perf_counter() - start, "retry_after": retry})

        tasks, t0, n = [], time.perf_counter(), int(rate * seconds)
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)
    return out


def base_config(table: str, workdir: Path, **changes):
    """The ServeConfig the phases share: the shipped checkpoint, small CPU shares, one torch thread."""
    from edje.schemas.shipped import DEFAULT_RERANKER
    from edje.serving.config import DeploymentResources, ServeConfig

    small = DeploymentResources(num_cpus=0.5)
    return ServeConfig(checkpoint=DEFAULT_RERANKER, token_tables=(table,), auth_token_env=None, torch_threads=1,
                       reranker=DeploymentResources(num_cpus=0.5, max_ongoing_requests=256), first_stage=small,
                       **changes)


def compare_phase(args, base: str, table: str, caps: List[str], workdir: Path) -> dict:
    """One shard against three, taking turns; RSS per replica and token bytes per shard."""
    import httpx
    from ray import serve

    from edje.serving.app import build
    from edje.serving.config import DeploymentResources

    ingress = DeploymentResources(num_cpus=0.5, max_ongoing_requests=256, max_queued_requests=-1)
    apps = {"one": base_config(table, workdir, ingress=ingress, live_dir=str(workdir / "live-one")),
            "three": base_config(table, workdir, ingress=ingress, shards=3, live_dir=str(workdir / "live-three"))}
    for name, cfg in apps.items():
        serve.run(build(cfg), name=name, route_prefix=f"/{name}")
    for name in apps:  # warm every replica: the first requests load lazily built parts
        asyncio.run(load(f"{base}/{name}/v1/search", caps, 5, 8))
    out: dict = {"phases": []}
    for rnd in range(args.rounds):
        for name in apps:
            res = asyncio.run(load(f"{base}/{name}/v1/search", caps, args.seconds, args.concurrency))
            res.pop("fail_times"), res.pop("ok_times")
            out["phases"].append({"app": name, "round": rnd, **res})
            print(f"[shards] {name:5s} round {rnd}: {res}", flush=True)
    out["rss_mb"] = replica_rss()
    out["three_shards"] = httpx.get(f"{base}/three/v1/info", timeout=60).json().get("shards")
    out["one_shard_store_bytes"] = httpx.get(f"{base}/one/v1/info", timeout=60).json()["token_store"]["memory_bytes"]
    for name in apps:
        serve.delete(name)
    return out


def kill_phase(args, base: str, table: str, caps: List[str], ids: List[str], paths: List[str], workdir: Path) -> dict:
    """Steady load on `shards` x `replicas_per_shard`; one Reranker and one FirstStage replica killed mid-run."""
    import httpx
    from PIL import Image
    from ray import serve

    from edje.serving.app import build
    from edje.storage.shards import shard_of

    live = workdir / "live-kill"
    shutil.rmtree(live, ignore_errors=True)  # a fresh log: the image added below is new (not a 409 from a past run)
    cfg = base_config(table, workdir, shards=args.shards, replicas_per_shard=args.replicas_per_shard, live_dir=str(live))
    serve.run(build(cfg), name="kill", route_prefix="/kill")
    url = f"{base}/kill/v1/search"
    asyncio.run(load(url, caps, 10, args.concurrency))  # warm every replica
    buf = io.BytesIO()
    Image.open(paths[0]).transpose(Image.FLIP_LEFT_RIGHT).save(buf, "JPEG")
    added = httpx.post(f"{base}/kill/v1/images", json={"image": base64.b64encode(buf.getvalue()).decode(),
                                                         "id": "bench-added"}, timeout=120)
    owner = shard_of("bench-added", args.shards)
    victims = [f"Reranker-{owner}" if args.shards > 1 else "Reranker",
               f"FirstStage-{(owner + 1) % args.shards}" if args.shards > 1 else "FirstStage"]
    killed_at: Optional[float] = None
    killed: List[str] = []

    async def kill_later(t0: float):
        nonlocal killed_at, killed
        await asyncio.sleep(args.seconds / 3)
        killed_at = time.perf_counter() - t0
        killed = await asyncio.to_thread(kill_replicas, "kill", victims)

    seconds = args.seconds * 2
    res = asyncio.run(load(url, caps, seconds, args.concurrency, kill_later))
    at = killed_at or 0.0
    still = httpx.post(f"{base}/kill/v1/rerank", json={"query": caps[0], "documents": ["bench-added", ids[1]]}, timeout=120)
    total = res["requests"] + res["errors"]
    out = {"shards": args.shards, "replicas_per_shard": args.replicas_per_shard, "concurrency": args.concurrency,
           "seconds": seconds, "killed": killed, "killed_at_s": round(at, 2), "requests": total, "failed": res["errors"],
           "failed_pct": round(100 * res["errors"] / max(total, 1), 3),
           "failed_after_kill": sum(t > at for t in res["fail_times"]),
           "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "rps": res["rps"],
           # From 1 s before the kill to the end: the normal spacing of answers is the baseline it is read against.
           "longest_time_without_an_answer_s": round(longest_gap(res["ok_times"], max(0.0, at - 1.0), seconds), 2),
           "longest_before_kill_s": round(longest_gap(res["ok_times"], 1.0, at), 2),
           "added_before_kill": added.status_code, "added_image_served_after": still.status_code}
    out["goals_met"] = out["failed_pct"] <= 0.5 and out["longest_time_without_an_answer_s"] <= 2.0
    print(f"[shards] kill: {out}", flush=True)
    serve.delete("kill")
    return out


def overload_phase(args, base: str, table: str, caps: List[str], workdir: Path, admit: str) -> dict:
    """For one admission setting ('ongoing:queued'): unloaded p99, the rate one replica sustains, then
    `overload_factor` times that rate open-loop."""
    from ray import serve

    from edje.serving.app import build
    from edje.serving.config import DeploymentResources

    if admit.startswith("gate:"):  # the ingress's own gate: `ongoing` in flight, no queue; Serve's limits out of its way
        ongoing, queued, gate = int(admit[5:]), 0, {"admit_in_flight": int(admit[5:])}
        ingress = DeploymentResources(num_cpus=0.5, max_ongoing_requests=256, max_queued_requests=-1)
    else:
        (ongoing, queued), gate = (int(x) for x in admit.split(":")), {}
        ingress = DeploymentResources(num_cpus=0.5, max_ongoing_requests=ongoing, max_queued_requests=queued)
    cfg = base_config(table, workdir, ingress=ingress, retry_after_s=args.retry_after, **gate)
    serve.run(build(cfg), name="over", route_prefix="/over")
    url = f"{base}/over/v1/search"
    asyncio.run(load(url, caps, 10, ongoing))  # warm-up
    unloaded = asyncio.run(load(url, caps, args.seconds, 1))
    sustained = asyncio.run(load(url, caps, args.seconds, ongoing))
    rate = sustained["requests"] / args.seconds * args.overload_factor
    got = asyncio.run(open_loop(url, caps, rate, args.seconds))
    admitted = [g["latency"] for g in got if g["status"] == 200]
    refused = [g for g in got if g["status"] == 503]
    others = sorted({str(g["status"]) for g in got} - {"200", "503"})
    out = {"admit": admit, "admit_ongoing": ongoing, "admit_queued": queued, "load_average": list(os.getloadavg()),
           "unloaded": {k: unloaded[k] for k in ("requests", "rps", "p50_ms", "p99_ms")},
           "sustained": {k: sustained[k] for k in ("requests", "rps", "p50_ms", "p99_ms", "errors")},
           "offered_rps": round(rate, 2), "sent": len(got), "admitted": len(admitted),
           "refused_503": len(refused), "refused_pct": round(100 * len(refused) / max(len(got), 1), 1),
           "other_statuses": {s: sum(str(g["status"]) == s for g in got) for s in others},
           "refused_p50_ms": percentile_ms([g["latency"] for g in refused], 50),
           "refused_p99_ms": percentile_ms([g["latency"] for g in refused], 99),
           "refused_max_ms": percentile_ms([g["latency"] for g in refused], 100),
           "retry_after": sorted({g["retry_after"] for g in refused}, key=str),
           "admitted_p50_ms": percentile_ms(admitted, 50), "admitted_p99_ms": percentile_ms(admitted, 99)}
    out["admitted_p99_over_unloaded_p99"] = (round(out["admitted_p99_ms"] / unloaded["p99_ms"], 2)
                                            if admitted and unloaded["p99_ms"] else None)
    out["goals_met"] = bool(refused) and (out["refused_p99_ms"] or 0) < 100 and \
        (out["admitted_p99_over_unloaded_p99"] or 99) <= 2.0
    print(f"[shards] overload: {out}", flush=True)
    serve.delete("over")
    return out


def main() -> int:
    """Run the chosen phases and print their tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", nargs="+", choices=["compare", "kill", "overload"], default=["kill", "overload"])
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--seed", type=int, default=8383)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop clients of the compare and kill phases")
    p.add_argument("--rounds", type=int, default=2, help="turns of each application in the compare phase")
    p.add_argument("--shards", type=int, default=2, help="kill phase: shards")
    p.add_argument("--replicas-per-shard", type=int, default=2, help="kill phase: replicas of each shard's deployments")
    p.add_argument("--admit", nargs="+", default=["1:1", "2:2"],
                   help="overload phase: the ingress's max_ongoing_requests:max_queued_requests, or gate:N (the "
                        "ingress's own gate, N in flight and no queue), one run each")
    p.add_argument("--overload-factor", type=float, default=4.0, help="overload phase: offered rate / sustained rate")
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()

    import ray
    from ray import serve

    from edje.serving.ports import free_port

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-shards-"))
    workdir.mkdir(parents=True, exist_ok=True)
    table, caps, ids, paths = build_corpus(workdir, args.images, args.seed)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # logical CPUs: replicas share the cores
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = f"http://127.0.0.1:{port}"
    out: dict = {"images": len(ids), "seconds": args.seconds, "load_average_before": list(os.getloadavg())}
    try:
        if "compare" in args.phases:
            out["compare"] = compare_phase(args, base, table, caps, workdir)
        if "kill" in args.phases:
            out["kill"] = kill_phase(args, base, table, caps, ids, paths, workdir)
        if "overload" in args.phases:
            out["overload"] = [overload_phase(args, base, table, caps, workdir, admit) for admit in args.admit]
    finally:
        out["load_average_after"] = list(os.getloadavg())
        serve.shutdown()
        ray.shutdown()
    report(out)
    if args.json:
        from edje.pipeline.storage import write_json

        write_json(args.json, out)
    return 0


def report(out: dict) -> None:
    """The phases' figures as plain lines."""
    print(f"\n[shards] {out['images']} images, POST /v1/search top 10 reranked, {out['seconds']:.0f} s per phase, "
          f"load average before {[round(x, 2) for x in out['load_average_before']]}, "
          f"after {[round(x, 2) for x in out['load_average_after']]}")
    if "compare" in out:
        c = out["compare"]
        print(f"[shards] {'app':6s} {'round':>5s} {'req/s':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s}")
        for ph in c["phases"]:
            print(f"[shards] {ph['app']:6s} {ph['round']:5d} {ph['rps']:7.2f} {ph['p50_ms']:8.1f} {ph['p99_ms']:8.1f} "
                  f"{ph['errors']:7d}")
        print("[shards] RSS per replica (MB): " + ", ".join(f"{k} {v}" for k, v in sorted(c["rss_mb"].items())))
        print(f"[shards] token bytes per shard: {[s['memory_bytes'] for s in c['three_shards']]} of "
              f"{c['one_shard_store_bytes']} in one shard")
    if "kill" in out:
        k = out["kill"]
        print(f"[shards] kill ({k['shards']} shards x {k['replicas_per_shard']} replicas, {k['concurrency']} clients, "
              f"{k['seconds']:.0f} s, killed {k['killed']} at {k['killed_at_s']} s): {k['requests']} requests, "
              f"{k['failed']} failed ({k['failed_pct']} %), longest time without an answer "
              f"{k['longest_time_without_an_answer_s']} s (before the kill {k['longest_before_kill_s']} s), p50 "
              f"{k['p50_ms']} ms, p99 {k['p99_ms']} ms; image added before the kill: {k['added_before_kill']}, "
              f"served after: {k['added_image_served_after']}; goals (<= 0.5 %, <= 2 s) met: {k['goals_met']}")
    for o in out.get("overload", []):
        print(f"[shards] overload (ingress admits {o['admit_ongoing']} + {o['admit_queued']} queued"
              f"{', its own gate' if o['admit'].startswith('gate:') else ''}): unloaded p50 "
              f"{o['unloaded']['p50_ms']} ms, p99 {o['unloaded']['p99_ms']} ms; sustained {o['sustained']['rps']} req/s; "
              f"offered {o['offered_rps']} req/s for {out['seconds']:.0f} s: {o['sent']} sent, {o['admitted']} admitted, "
              f"{o['refused_503']} refused 503 ({o['refused_pct']} %, p50 {o['refused_p50_ms']} ms, p99 "
              f"{o['refused_p99_ms']} ms, max {o['refused_max_ms']} ms, Retry-After {o['retry_after']}), other "
              f"{o['other_statuses']}; admitted p50 {o['admitted_p50_ms']} ms, p99 {o['admitted_p99_ms']} ms = "
              f"{o['admitted_p99_over_unloaded_p99']}x the unloaded p99; goals (503 < 100 ms, <= 2x) met: "
              f"{o['goals_met']}; load average {[round(x, 2) for x in o['load_average']]}")


if __name__ == "__main__":
    sys.exit(main())
