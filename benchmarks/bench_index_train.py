"""Training an approximate first-stage index: faiss's default (polysemous PQ training on) against the project's
`new_index` (off), side by side on the same vectors, with the searches of both compared.

    .venv/bin/python benchmarks/bench_index_train.py --vectors 50000 --dim 256 --train 50000 \
        --factories IVF256,PQ16 IVF256,PQ32 --json runs/bench_index_train.json

Polysemous training reorders PQ codes so that Hamming distances between codes approximate the PQ distances, for a
Hamming pre-filter (`polysemous_ht`) that no search here turns on; it changes no distance. Printed per factory:
train seconds for each, their ratio, and the share of queries whose top 10 ids are the same (ties aside, 1.0).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import faiss
import numpy as np

from edje.storage.embedding_index import new_index


def clustered(n: int, d: int, seed: int) -> np.ndarray:
    """Unit vectors around 200 random centres: neighbours exist, as in an image corpus."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((200, d))
    x = centres[rng.integers(0, 200, n)] + 0.5 * rng.standard_normal((n, d))
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def timed_build(index: faiss.Index, train: np.ndarray, vectors: np.ndarray) -> tuple:
    """(index, train seconds) after training on `train` and adding `vectors`."""
    start = time.perf_counter()
    index.train(train)
    seconds = time.perf_counter() - start
    index.add(vectors)
    return index, seconds


def main(argv=None) -> dict:
    """CLI entry point; returns the measurements."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--train", type=int, default=50_000, help="training sample (the first rows)")
    p.add_argument("--factories", nargs="+", default=["IVF256,PQ16", "IVF256,PQ32"])
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--threads", type=int, default=1, help="faiss OpenMP threads (1: the timing is per core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    vectors = clustered(args.vectors, args.dim, args.seed)
    train, queries = vectors[:args.train], vectors[:args.queries]
    out = {"vectors": args.vectors, "dim": args.dim, "train": args.train, "threads": args.threads,
           "load_average": list(os.getloadavg()), "faiss": faiss.__version__, "factories": []}
    for factory in args.factories:
        default, t_default = timed_build(faiss.index_factory(args.dim, factory, faiss.METRIC_INNER_PRODUCT), train, vectors)
        ours, t_ours = timed_build(new_index(args.dim, factory), train, vectors)
        for index in (default, ours):
            faiss.ParameterSpace().set_index_parameters(index, f"nprobe={args.nprobe}")
        same = np.mean([set(a) == set(b) for a, b in zip(default.search(queries, 10)[1].tolist(),
                                                          ours.search(queries, 10)[1].tolist())])
        row = {"factory": factory, "train_s_default": round(t_default, 3), "train_s_new_index": round(t_ours, 3),
               "speedup": round(t_default / max(t_ours, 1e-9), 1), "same_top10_share": round(float(same), 4)}
        out["factories"].append(row)
        print(f"[index-train] {factory}: faiss default {row['train_s_default']} s, new_index {row['train_s_new_index']} s "
              f"({row['speedup']}x); same top 10 for {row['same_top10_share']:.1%} of {args.queries} queries", flush=True)
    out["load_average_after"] = list(os.getloadavg())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
