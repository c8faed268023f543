"""GPU-SHAPED SIMULATION (a benchmark instrument, never an encoder): can the encode pipeline feed one GPU actor?

    .venv/bin/python benchmarks/gpu_shaped_encode.py --images 2048 --rates 1000 3000 --json runs/gpu_shaped.json

No GPU is lent to this project, so the model's side is replaced by SIMULATED-GPU, an actor with a fixed
throughput: per batch it reads its input (a strided sum over the pixels) and sleeps for batch / rate seconds
minus the time that took, then returns zero tokens of the shipped GPU table's shape (compressed 64 x 384
int8 of ViT-L-16-SigLIP2-384, 384 x 384 input). Everything else is the real job: img2dataset download from
a loopback server, Ray Data read -> decode -> actor -> part writer, commits.

For each simulated rate it prints the images/s the pipeline delivered to the one actor over its busy window,
the share of that window the actor was busy, and the CPUs the pipeline used to feed it: Ray Data's CPU seconds
of the read, decode and write operators over the window, and per 1,000 img/s. `cost_plan.py --sim-json` turns
the CPU seconds per image into decode CPUs per GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import numpy as np

from edje.pipeline.encode import EncodeBatch, ModelInfo
from edje.schemas.token_table import TableMetadata

LABEL = "SIMULATED-GPU"
BACKBONE = "ViT-L-16-SigLIP2-384"  # what the simulated actor stands for: its input size and table shape
IMAGE_SIZE, TOKENS, WIDTH, EMBED_DIM = 384, 64, 384, 1024
FEED_OPERATORS = ("FlatMap(download_rows)", "MapBatches(decode_batch)", "MapBatches(write_parts)")


def simulated_meta() -> TableMetadata:
    """The table the simulated actor writes: compressed 64 x 384 int8, labelled as simulated."""
    return TableMetadata(kind="compressed", backbone=BACKBONE, pretrained=LABEL, feature_layer="final",
                         num_tokens=TOKENS, width=WIDTH, quantization="int8", embed_dim=EMBED_DIM,
                         adapter_hash=LABEL.lower())


def simulated_encoder(rate: float):
    """An EncodeBatch whose model is a fixed-throughput stand-in of `rate` images/s (pickled by value)."""

    class SimulatedGPUEncoder(EncodeBatch):
        """SIMULATED-GPU: reads its input, sleeps batch / rate seconds, returns zero tokens."""

        def __init__(self, spec):
            started = time.time()
            self.with_text, self.augment = False, None  # no mirrored copies: the simulation times the plain job
            self.codec = simulated_meta().codec
            self.init_window = (started, time.time())

        def encode_rows(self, images: np.ndarray, captions):
            t0 = time.perf_counter()
            touched = int(np.asarray(images)[:, ::32, ::32].sum())  # the actor reads what it was sent
            n = len(images)
            blob = np.zeros((n, self.codec.blob_bytes), np.uint8)
            blob[:, 0] = touched % 251
            scales = np.ones((n, self.codec.num_scales), np.float16)
            time.sleep(max(0.0, n / rate - (time.perf_counter() - t0)))
            return blob, scales, np.zeros((n, EMBED_DIM), np.float32), None

    return SimulatedGPUEncoder


def run_job(workdir: Path, urls: Path, rate: float, batch: int, shard: int) -> dict:
    """The real encode job with the simulated actor in place of EncodeBatch; returns its summary."""
    import edje.pipeline.job as job
    from edje.schemas.encode_job import EncodeJobConfig

    job.EncodeBatch = simulated_encoder(rate)
    job.describe_model = lambda spec: ModelInfo(IMAGE_SIZE, "shortest", simulated_meta())
    cfg = EncodeJobConfig(input=str(urls), output=str(workdir / "out-simulated"), backbone=BACKBONE,
                          quant="int8", batch_size=batch, shard_size=shard, torch_threads=1)
    return job.run_encode_job(cfg)


def measure(summary: dict, rate: float) -> dict:
    """Delivered img/s, actor busy share and the feeding CPUs of one run."""
    run = summary["run"]
    window, images = run["encoder_window_s"], run["images_encoded"]
    ops = run.get("operators") or {}
    feed_cpu = sum(ops.get(name, {}).get("cpu_s", 0.0) for name in FEED_OPERATORS)
    return {"simulated_img_s": rate, "images": images, "delivered_img_s": round(images / window, 1),
            "actor_busy_share": round(min(1.0, images / rate / window), 3), "encoder_window_s": window,
            "end_to_end_img_s": summary["images_per_second"],
            "feed_cpu_s": round(feed_cpu, 3), "feed_cpus_used": round(feed_cpu / window, 2),
            "feed_cpu_ms_per_image": round(1000 * feed_cpu / images, 3),
            "feed_cpus_per_1000_img_s": round(feed_cpu / images * 1000, 2),
            "operators_cpu_s": {k: v["cpu_s"] for k, v in ops.items()}}


def main() -> int:
    """Run the simulation at each rate and print what the pipeline delivered."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--source-size", type=int, default=512, help="side of the served images (resized to 384)")
    p.add_argument("--rates", type=float, nargs="+", default=[1000.0, 3000.0], help="simulated GPU img/s per actor")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--shard-size", type=int, default=512)
    p.add_argument("--workdir", help="keep files here (default: a temporary folder)")
    p.add_argument("--json", help="write the results here (cost_plan.py --sim-json reads it)")
    args = p.parse_args()

    import ray
    from bench_encode import make_world, uncommit

    from edje.sampleworld.server import serve_directory
    from edje.sampleworld.world import write_url_list

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-shaped-"))
    world = make_world(workdir, args.images, image_size=args.source_size)
    server = serve_directory(world)
    urls = write_url_list(world, server.base_url, workdir / "urls.tsv", splits=["train"])
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False)  # once, as a cluster would be
    load_before = os.getloadavg()
    # The first run downloads (img2dataset resizes to 384 and stores JPEG); the measured runs read those shards.
    first = run_job(workdir, urls, max(args.rates), args.batch_size, args.shard_size)
    results = []
    for rate in args.rates:
        uncommit(first)
        results.append(measure(run_job(workdir, urls, rate, args.batch_size, args.shard_size), rate))
    server.stop()
    ray.shutdown()
    out = {"label": LABEL, "stands_for": BACKBONE, "input_size": IMAGE_SIZE, "source_size": args.source_size,
           "batch_size": args.batch_size, "cpus": os.cpu_count(), "results": results,
           "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}
    print(f"\n[{LABEL}] one actor standing for {BACKBONE}; {args.source_size}px JPEGs resized to {IMAGE_SIZE} at "
          f"download; {os.cpu_count()} CPUs on this node, load {out['load_average_before_after']}")
    print(f"[{LABEL}] {'simulated img/s':>16} {'delivered img/s':>16} {'actor busy':>11} {'feed CPUs used':>15} "
          f"{'feed CPU ms/img':>16} {'CPUs per 1000 img/s':>20}")
    for r in results:
        print(f"[{LABEL}] {r['simulated_img_s']:16.0f} {r['delivered_img_s']:16.1f} {r['actor_busy_share']:11.1%} "
              f"{r['feed_cpus_used']:15.2f} {r['feed_cpu_ms_per_image']:16.3f} {r['feed_cpus_per_1000_img_s']:20.2f}")
    print(f"[{LABEL}] " + json.dumps(out))
    if args.json:
        from edje.pipeline.storage import write_json

        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
