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
from dataclasses import dataclass
from typing import List, Optional

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.schemas.cli_options import add_options, from_args, given, option
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.startup import StartupConfig


def expand(paths: List[str]) -> List[str]:
    """Files, folders or globs on any fsspec filesystem (s3://.../part-*.parquet), keeping the protocol."""
    from edje.schemas.token_table import expand_paths

    return expand_paths(paths)


@dataclass(frozen=True)
class ServeJob:
    """Where and how the job deploys the application (its other options are ServeConfig's and StartupConfig's)."""

    config: Optional[str] = option(None, help="YAML/JSON with ServeConfig fields (or a Serve config's application args)")
    host: str = option("127.0.0.1", help="HTTP bind address (default loopback only)")
    port: int = option(8000)
    name: str = option("edje", help="Serve application name")
    route_prefix: str = option("/")
    address: Optional[str] = option(None, help="Ray address (default: RAY_ADDRESS or 'auto'; 'local' starts one)")
    block: bool = option(False, help="keep the driver alive (for a local cluster)")


# ServeConfig's fields the command line names by path or glob, expanded here (a config file's are taken as written).
_PATH_FIELDS = ("token_tables", "caption_sources", "miner_image_tables")
# ServeConfig's deployments: their flags (--reranker-replicas, --first-stage-gpus) merge into the file's sections.
_RESOURCE_FIELDS = ("reranker", "first_stage", "miner", "ingress")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """ServeConfig from a JSON/YAML file (--config) overridden by the command-line flags given."""
    base: dict = {}
    if args.config:
        import yaml

        with open(args.config) as f:
            base = yaml.safe_load(f) or {}
        base = base.get("args", base)  # accepts a bare ServeConfig mapping or an application's `args`
    flags = given(ServeConfig, args)
    flags.update({name: expand(flags[name]) for name in _PATH_FIELDS if name in flags})
    resources = {name: flags.pop(name) for name in _RESOURCE_FIELDS if name in flags}
    base.update(flags)
    # A deployment's flags complete its file section, itself completed from the field's default. The reranker's file
    # section is completed so even without flags (it always was); the others' then take DeploymentResources' defaults.
    if base.get("reranker") and "reranker" not in resources:
        resources["reranker"] = {}
    for name, values in resources.items():
        base[name] = {**dataclasses.asdict(_default_resources(name)), **dict(base.get(name) or {}), **values}
    return ServeConfig.from_dict(base)


def _default_resources(name: str) -> DeploymentResources:
    return {f.name: f for f in dataclasses.fields(ServeConfig)}[name].default


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line flags: ServeConfig's (None unless given, so that --config keeps its values), the job's, StartupConfig's."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(p, ServeConfig, unset=True)
    add_options(p, ServeJob)
    add_options(p, StartupConfig)
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Deploy, wait for health (retrying a failed start), print where it listens."""
    args = parse(argv)  # first: --help and a bad flag answer before the app's imports (torch, transformers, Serve)
    from edje.serving.app import build, check_models
    from edje.serving.startup import ServeStartError, init_ray, start_serve
    from edje.storage.hub import CheckpointNotFound, hub_env

    cfg = config_from_args(args)
    startup = from_args(StartupConfig, args)
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
