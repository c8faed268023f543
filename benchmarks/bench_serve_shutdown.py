"""How long taking a served application down takes, at Serve's drain period (2 s) and at the project's (0.5 s).

Starts a local Ray + Serve once, then, for each drain period in turn (alternating, `--reps` times each): deploys the
random corpus's application (serving.random_corpus: the test-sized model, int8 tables) with that
`graceful_shutdown_wait_loop_s` on every deployment, answers one /v1/rerank, and times `serve.delete` of the
application (every replica drains, then stops). Prints JSON: the seconds per period (each rep, median) and the ratio
of medians, with the load average before and after.

    .venv/bin/python benchmarks/bench_serve_shutdown.py --reps 3 --json runs/bench_serve_shutdown.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from edje.serving.ports import free_port


def main() -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--periods", type=float, nargs=2, default=[2.0, 0.5], help="Serve's default, then ours")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()

    import ray
    import requests
    from ray import serve

    from edje.serving.app import build
    from edje.serving.config import ServeConfig
    from edje.serving.random_corpus import tiny_config, write_random_corpus
    from edje.serving.startup import StartupConfig

    os.environ.update(StartupConfig().env())
    corpus = write_random_corpus(tempfile.mkdtemp(prefix="bench-shutdown-"), tiny_config(), 24)
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    load_before = os.getloadavg()
    base = ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables), auth_token_env=None)
    times = {period: [] for period in a.periods}
    for _ in range(a.reps):
        for period in a.periods:
            cfg = dataclasses.replace(base, **{f: dataclasses.replace(getattr(base, f), graceful_shutdown_wait_loop_s=period)
                                               for f in ("reranker", "first_stage", "miner", "ingress")})
            serve.run(build(cfg), name="bench", route_prefix="/")
            r = requests.post(f"http://127.0.0.1:{port}/v1/rerank",
                              json={"query": corpus.captions[0], "documents": corpus.image_ids[:2]}, timeout=300)
            r.raise_for_status()
            t = time.perf_counter()
            serve.delete("bench")
            times[period].append(round(time.perf_counter() - t, 2))
    serve.shutdown()
    ray.shutdown()
    median = {str(k): statistics.median(v) for k, v in times.items()}
    first, second = (str(x) for x in a.periods)
    out = {"delete_s": {str(k): v for k, v in times.items()}, "median_s": median,
           "ratio": round(median[first] / median[second], 2),
           "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=2))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
