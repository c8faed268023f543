"""Deploy the EDJE serving application onto a running Ray cluster (or a local one) and return.

    ray job submit --working-dir . -- python jobs/serve.py \
        --checkpoint s3://bucket/edje/ckpt --tokens s3://bucket/tokens/part-*.parquet \
        --captions s3://bucket/raw/part-000.parquet --port 8000

Serve applications outlive the driver, so the job ends once the application is healthy. Binds
127.0.0.1 unless --host says otherwise. The bearer token, if any, is read from the environment
variable named by --auth-token-env (never from the command line, which `ray job` records).
Without --checkpoint only the hard-negative miner is served (for pretraining before a checkpoint).
Start-up tolerates a busy machine (serving.startup): the proxy's health checks get --proxy-timeout
seconds, a failed start is retried --start-attempts times, and a final failure exits 2 with the reason.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import List, Optional

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.serving.config import DeploymentResources, ServeConfig


def expand(paths: List[str]) -> List[str]:
    """Files, folders or globs on any fsspec filesystem (s3://.../part-*.parquet), keeping the protocol."""
    from edje.schemas.token_table import expand_paths

    return expand_paths(paths)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """ServeConfig from a JSON/YAML file (--config) overridden by command-line flags."""
    base: dict = {}
    if args.config:
        import yaml

        with open(args.config) as f:
            base = yaml.safe_load(f) or {}
        base = base.get("args", base)  # accepts a bare ServeConfig mapping or an application's `args`
    flags = dict(checkpoint=args.checkpoint, token_tables=expand(args.tokens) if args.tokens else None,
                 caption_sources=expand(args.captions) if args.captions else None,
                 miner_image_tables=expand(args.miner_images) if args.miner_images else None,
                 model_name=args.model_name, max_documents=args.max_documents, precision=args.precision,
                 dynamic_batching=None if args.no_batching is None else not args.no_batching,
                 max_batch_pairs=args.max_batch_pairs, auth_token_env=args.auth_token_env,
                 torch_threads=args.torch_threads, live_dir=args.live_dir,
                 image_url_hosts=args.image_url_hosts, image_url_allow=args.image_url_allow,
                 ui=args.ui, image_dir=args.image_dir, image_url_prefix=args.image_url_prefix, shards=args.shards,
                 replicas_per_shard=args.replicas_per_shard, retry_after_s=args.retry_after,
                 admit_in_flight=args.admit_in_flight,
                 index_factory=args.index_factory, index_search_params=args.index_search_params)
    base.update({k: v for k, v in flags.items() if v is not None})
    rr = dict(base.get("reranker") or {})
    for key, value in (("num_replicas", args.reranker_replicas), ("num_gpus", args.reranker_gpus),
                       ("num_cpus", args.reranker_cpus)):
        if value is not None:
            rr[key] = value
    if rr:
        base["reranker"] = {**dataclasses.asdict(_default_reranker()), **rr}
    ingress = {key: value for key, value in (("max_ongoing_requests", args.ingress_max_ongoing),
                                             ("max_queued_requests", args.ingress_max_queued)) if value is not None}
    if ingress:
        base["ingress"] = {**dataclasses.asdict(_default_resources("ingress")), **dict(base.get("ingress") or {}), **ingress}
    # The first stage's text tower and the miner's run on a GPU when their replicas are given one.
    for name, gpus in (("first_stage", args.first_stage_gpus), ("miner", args.miner_gpus)):
        if gpus is not None:
            base[name] = {**dataclasses.asdict(_default_resources(name)), **dict(base.get(name) or {}), "num_gpus": gpus}
    return ServeConfig.from_dict(base)


def _default_resources(name: str) -> DeploymentResources:
    return {f.name: f for f in dataclasses.fields(ServeConfig)}[name].default


def _default_reranker() -> DeploymentResources:
    return _default_resources("reranker")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", help="YAML/JSON with ServeConfig fields (or a Serve config's application args)")
    p.add_argument("--checkpoint", help="EDJE checkpoint dir (any fsspec path); omit to serve the miner alone")
    p.add_argument("--tokens", nargs="+", help="compressed token tables (globs allowed)")
    p.add_argument("--captions", nargs="+", help="miner caption sources: raw token tables or annotation JSON")
    p.add_argument("--miner-images", nargs="+", help="miner image tables (default: --tokens)")
    p.add_argument("--model-name")
    p.add_argument("--max-documents", type=int)
    p.add_argument("--live-dir", help="shared folder of the live-image log (enables POST /v1/images; added images "
                   "persist there as token tables and are loaded at start)")
    p.add_argument("--image-url-hosts", nargs="+", help="hosts image urls may name (default: any)")
    p.add_argument("--ui", action="store_true", default=None,
                   help="serve the search page at /ui (static files; the API behind it keeps its token)")
    p.add_argument("--image-dir", help="local folder of <image id>.jpg|.png|... files: the thumbnails' source")
    p.add_argument("--image-url-prefix", help="url the image id is appended to (or put in place of {image_id}) "
                   "to fetch a thumbnail's image (default: the corpus's stored url)")
    p.add_argument("--image-url-allow", nargs="+",
                   help="non-public addresses image urls may reach: CIDRs, 'loopback' or host names "
                        "(default: none; loopback, private and link-local addresses are refused)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--no-batching", action="store_true", default=None, help="disable @serve.batch dynamic batching")
    p.add_argument("--max-batch-pairs", type=int)
    p.add_argument("--torch-threads", type=int)
    p.add_argument("--shards", type=int, help="split the corpus into this many shards by a hash of the image id: one "
                   "FirstStage and one Reranker deployment per shard, each holding its rows only (default 1)")
    p.add_argument("--replicas-per-shard", type=int,
                   help="replicas of each shard's FirstStage and Reranker: a shard answers while one of them does "
                        "(default 1; --reranker-replicas, when given, sets the Reranker's)")
    p.add_argument("--ingress-max-ongoing", type=int,
                   help="requests an ingress replica works on at once (default 64)")
    p.add_argument("--ingress-max-queued", type=int,
                   help="requests Serve's proxy holds back for the ingress beyond those; more are answered 503 with "
                        "Retry-After at once (default 64; -1: no limit)")
    p.add_argument("--admit-in-flight", type=int,
                   help="a gate with no queue: an ingress replica works on at most this many requests and answers "
                        "each further one 503 with Retry-After at once (below --ingress-max-ongoing; default: no gate)")
    p.add_argument("--retry-after", type=float, help="seconds in the Retry-After header of a 503 (default 1)")
    p.add_argument("--index-factory", help="FAISS index of the first stage (default Flat; 'IVF1024,PQ32' for large corpora)")
    p.add_argument("--index-search-params", help="its search parameters, as faiss.ParameterSpace takes them ('nprobe=32')")
    p.add_argument("--reranker-replicas", type=int)
    p.add_argument("--reranker-gpus", type=float)
    p.add_argument("--reranker-cpus", type=float)
    p.add_argument("--first-stage-gpus", type=float, help="GPUs per first-stage replica (its text tower runs there)")
    p.add_argument("--miner-gpus", type=float, help="GPUs per miner replica (its text tower runs there)")
    p.add_argument("--auth-token-env", help="environment variable holding the bearer token (default EDJE_API_TOKEN)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default="edje", help="Serve application name")
    p.add_argument("--route-prefix", default="/")
    p.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS or 'auto'; 'local' starts one)")
    p.add_argument("--block", action="store_true", help="keep the driver alive (for a local cluster)")
    p.add_argument("--proxy-timeout", type=float, default=60.0,
                   help="seconds Serve's HTTP proxy may take to answer a health check (Serve's own default: 5)")
    p.add_argument("--start-attempts", type=int, default=3, help="tries to bring Serve up before giving up")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds per attempt until GET /healthz answers 200 (default %(default)s)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Deploy, wait for health (retrying a failed start), print where it listens."""
    from edje.serving.app import build, check_models
    from edje.serving.startup import ServeStartError, StartupConfig, init_ray, start_serve
    from edje.storage.hub import CheckpointNotFound, hub_env

    args = parse(argv)
    cfg = config_from_args(args)
    startup = StartupConfig(proxy_ready_timeout_s=args.proxy_timeout, proxy_health_timeout_s=args.proxy_timeout,
                            attempts=args.start_attempts, healthy_timeout_s=args.ready_timeout)
    try:
        check_models(cfg)  # before any cluster work: a backbone that cannot be had is one line, exit 2
    except CheckpointNotFound as e:
        print(f"[serve] {e}", file=sys.stderr)
        return 2
    # Replicas reach the hub (or stay offline, or read the cache) as this driver does.
    init_ray(args.address or os.environ.get("RAY_ADDRESS") or "auto", startup,
             env={**hub_env(), "NO_ALBUMENTATIONS_UPDATE": "1"})
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}{args.route_prefix.rstrip('/')}"
    started = time.time()
    try:
        attempts = start_serve(lambda: build(cfg), args.name, args.route_prefix, args.host, args.port, url, startup)
    except ServeStartError as e:
        print(f"[serve] {e}", file=sys.stderr)
        return 2
    print(json.dumps({"application": args.name, "url": url, "ready_s": round(time.time() - started, 1),
                      "attempts": attempts, "checkpoint": cfg.checkpoint, "token_tables": len(cfg.token_tables),
                      "auth": cfg.resolved_auth_token() is not None,
                      **({"search_page": f"{url}/ui/"} if cfg.ui else {})}), flush=True)
    if args.block:
        from ray import serve

        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
