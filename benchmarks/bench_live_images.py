"""Live-image latency over HTTP: adding one image (POST /v1/images) and reranking a url document.

Starts a local Ray + Serve over a random corpus (serving.random_corpus: the test-sized model over the
edje-tiny-clip backbone, int8 tables), a live folder, and a loopback file server with PNG images at
the backbone's input size. Measures, each call sequential, p50/p90 in ms:
- `add_url`: POST /v1/images {"url"} of a new image (fetch, decode, backbone, adapter, int8, write
  the token table, append the log, apply it; the first stage indexes it before the answer);
- `rerank_id`: POST /v1/rerank, one query, one corpus id (the baseline);
- `rerank_url_new`: the same with one {"image": url} document never seen (fetch + encode + score);
- `rerank_url_cached`: the same url again (fetch + content hash; the encoded rows come from the cache).
Prints JSON with the load average (`os.getloadavg`) before and after.

    .venv/bin/python benchmarks/bench_live_images.py --reps 20 --json runs/bench_live_images.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import tempfile
import time

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np


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
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
