"""Serving load on one shard against three, and the same with replicas killed mid-run.

    .venv/bin/python benchmarks/bench_shards.py --images 600 --seconds 30 --concurrency 32 --json runs/bench_shards.json

One local Ray, one Serve instance on loopback, two applications over the same sample-world corpus (encoded by the
shipped reranker, int8): `one` (shards=1) and `three` (shards=3). Each phase sends `POST /v1/search` (top 10,
reranked) from `concurrency` clients for `seconds`, the applications taking turns (one, three, one, three), and
prints p50/p99 latency, requests/s and errors, and the resident memory of every replica (VmRSS from /proc, found
through Ray's state API). The kill phase runs on `three`: a third of the way in, one Reranker and one FirstStage
replica are killed (`ray.kill`, as a lost node would); it prints the failed requests, the longest time after
the kill without any answer (requests wait while Serve replaces the replica), and checks that an image added
through /v1/images before the kill is still served after it.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
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


def main() -> int:
    """Run the phases and print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--seed", type=int, default=8383)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="turns of each application (alternating)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()

    import httpx
    import ray
    from ray import serve

    from edje.jobs.quickstart import free_port
    from edje.model.shards import shard_of
    from edje.schemas.shipped import DEFAULT_RERANKER
    from edje.serving.app import build
    from edje.serving.config import DeploymentResources, ServeConfig

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-shards-"))
    workdir.mkdir(parents=True, exist_ok=True)
    table, caps, ids, paths = build_corpus(workdir, args.images, args.seed)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # logical CPUs: replicas share the cores
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = DeploymentResources(num_cpus=0.5)
    common = dict(checkpoint=DEFAULT_RERANKER, token_tables=(table,), auth_token_env=None, torch_threads=1,
                  reranker=DeploymentResources(num_cpus=0.5, max_ongoing_requests=256), first_stage=small,
                  ingress=DeploymentResources(num_cpus=0.5, max_ongoing_requests=256))
    apps = {"one": ServeConfig(**common, live_dir=str(workdir / "live-one")),
            "three": ServeConfig(**common, shards=3, live_dir=str(workdir / "live-three"))}
    for name, cfg in apps.items():
        serve.run(build(cfg), name=name, route_prefix=f"/{name}")
    base = f"http://127.0.0.1:{port}"
    for name in apps:  # warm every replica: the first requests load lazily built parts
        asyncio.run(load(f"{base}/{name}/v1/search", caps, 5, 8))
    load_before = os.getloadavg()[0]
    out = {"images": len(ids), "seconds": args.seconds, "concurrency": args.concurrency, "phases": []}
    for rnd in range(args.rounds):
        for name in apps:
            res = asyncio.run(load(f"{base}/{name}/v1/search", caps, args.seconds, args.concurrency))
            res.pop("fail_times"), res.pop("ok_times")
            out["phases"].append({"app": name, "round": rnd, **res})
            print(f"[shards] {name:5s} round {rnd}: {res}", flush=True)
    out["rss_mb"] = replica_rss()
    info = httpx.get(f"{base}/three/v1/info", timeout=60).json()
    out["three_shards"] = info.get("shards")
    out["one_shard_store_bytes"] = httpx.get(f"{base}/one/v1/info", timeout=60).json()["token_store"]["memory_bytes"]

    # Kill phase: add an image, then lose a Reranker and a FirstStage replica under load.
    from PIL import Image

    buf = io.BytesIO()
    Image.open(paths[0]).transpose(Image.FLIP_LEFT_RIGHT).save(buf, "JPEG")
    added = httpx.post(f"{base}/three/v1/images", json={"image": base64.b64encode(buf.getvalue()).decode(),
                                                          "id": "bench-added"}, timeout=120)
    victims = [f"Reranker-{shard_of('bench-added', 3)}", f"FirstStage-{(shard_of('bench-added', 3) + 1) % 3}"]
    killed_at: Optional[float] = None

    async def kill_later(t0: float):
        nonlocal killed_at
        await asyncio.sleep(args.seconds / 3)
        killed_at = time.perf_counter() - t0
        await asyncio.to_thread(kill_replicas, "three", victims)

    res = asyncio.run(load(f"{base}/three/v1/search", caps, args.seconds * 2, args.concurrency, kill_later))
    after = [killed_at or 0.0] + sorted(t for t in res["ok_times"] if t > (killed_at or 0.0))
    stall = max(np.diff(after), default=None) if len(after) > 1 else None  # longest time without any answer
    still = httpx.post(f"{base}/three/v1/rerank", json={"query": caps[0], "documents": ["bench-added", ids[1]]}, timeout=120)
    kill = {"killed": victims, "killed_at_s": round(killed_at or 0, 2), "requests": res["requests"], "errors": res["errors"],
            "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "rps": res["rps"],
            "longest_time_without_an_answer_s": None if stall is None else round(float(stall), 2),
            "added_before_kill": added.status_code, "added_image_served_after": still.status_code}
    out["kill"] = kill
    out["load_average_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    serve.shutdown()
    ray.shutdown()

    print(f"\n[shards] {len(ids)} images, POST /v1/search top 10 reranked, {args.concurrency} clients, {args.seconds:.0f} s "
          f"per phase, load {out['load_average_before_after']}")
    print(f"[shards] {'app':6s} {'round':>5s} {'req/s':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s}")
    for ph in out["phases"]:
        print(f"[shards] {ph['app']:6s} {ph['round']:5d} {ph['rps']:7.2f} {ph['p50_ms']:8.1f} {ph['p99_ms']:8.1f} {ph['errors']:7d}")
    print("[shards] RSS per replica (MB): " + ", ".join(f"{k} {v}" for k, v in sorted(out["rss_mb"].items())))
    print(f"[shards] token bytes per shard: {[s['memory_bytes'] for s in out['three_shards']]} of "
          f"{out['one_shard_store_bytes']} in one shard")
    print(f"[shards] kill: {kill}")
    if args.json:
        from edje.pipeline.storage import write_json

        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
