"""Costed plan: nodes, GPU hours, wall time, storage and money to encode CC12M and LAION-400M with
ViT-L-16-SigLIP2-384 into compressed-64 int8 tables, and to train EDJE on them.

    python benchmarks/cost_plan.py --scale-json /tmp/bench_scale.json --sim-json runs/gpu_shaped.json > plan.md

Every input rate is labelled with where it comes from:
  measured   on this project's 2-core CPU machine, by this script (decode + resize per core), by
             benchmarks/bench_scale.py (planning rows/s, --scale-json) or by the GPU-shaped simulation
             benchmarks/gpu_shaped_encode.py (the pipeline's CPU per image feeding one actor, --sim-json);
  computed   exactly from the architecture or the codec (FLOPs per image, bytes per image);
  published  a vendor's or a tool's own figure (GPU peak TFLOPS, img2dataset speed, list prices);
  assumed    a judgement (GPU utilisation, url success rate), stated so it can be changed.
No GPU was available to this project, so every GPU rate is published peak x assumed utilisation.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rate:
    """A number and where it comes from."""

    value: float
    source: str  # measured | computed | published | assumed
    note: str


def vit_flops_per_image(layers=24, width=1024, mlp=4096, tokens=576, patch=16, channels=3) -> float:
    """Forward FLOPs of a ViT image tower (2 per multiply-add): patch embedding, attention, MLP."""
    embed = 2 * tokens * (patch * patch * channels) * width
    per_layer = 2 * tokens * width * (4 * width + 2 * mlp) + 2 * 2 * tokens * tokens * width
    return embed + layers * per_layer


def edje_train_flops_per_sample(k=7, text=64, image=64, layers=12, width=384, mlp=1536, d_vis=1024,
                                vis_tokens=576, queries=64) -> float:
    """Forward+backward FLOPs of one EDJE training sample: compression adapter + joint passes (ITM with
    k negatives both ways, MLM, text-only recovery) of a MiniLM-L12-H384 encoder."""
    adapter = 2 * (2 * vis_tokens * d_vis * width + 2 * queries * vis_tokens * width + queries * width * 4 * width * 2)

    def encoder(n):
        return layers * (2 * n * width * (4 * width + 2 * mlp) + 4 * n * n * width)

    joint = encoder(text + image + 3)
    forward = adapter + (1 + 2 * k) * joint + joint + encoder(text + 2)
    return 3 * forward  # backward ~ 2x forward


def measure_decode_per_core(seconds: float = 5.0) -> float:
    """Images/s one CPU core decodes and resizes to 384 (pipeline.decode on 640x480 JPEGs)."""
    import numpy as np
    from PIL import Image

    from edje.model.image_decode import decode_image

    rng = np.random.default_rng(0)
    jpgs = []
    for _ in range(8):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        jpgs.append(buf.getvalue())
    # CPU time, not wall time: this machine is shared, and a core of a cluster node is not
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        decode_image(jpgs[n % len(jpgs)], 384)
        n += 1
    return n / (time.process_time() - t0)


def plan(args) -> str:
    from edje.schemas.codecs import bytes_per_image

    vit = vit_flops_per_image()
    train = edje_train_flops_per_sample()
    scale = json.loads(Path(args.scale_json).read_text()) if args.scale_json else None
    scale = scale["sizes"] if isinstance(scale, dict) else scale  # bench_scale.py's --json: {"sizes": [...], ...}
    plan_rate = min(r["rows_per_cpu_s"] for r in scale) if scale else None
    sim = json.loads(Path(args.sim_json).read_text()) if args.sim_json else None
    # The dearest feed seen over the simulated speeds: CPU seconds per image that read, decode and write took.
    feed_ms = max(r["feed_cpu_ms_per_image"] for r in sim["results"]) if sim else None
    rates_decode = args.decode_per_core or measure_decode_per_core()
    rates = {
        "decode_per_core": Rate(rates_decode, "measured", "pipeline.decode: 640x480 JPEG -> 384x384 RGB, per CPU-second of this machine"),
        "feed_cpu_ms": Rate(feed_ms or 1000 / rates_decode, "measured" if feed_ms else "measured (decode alone)",
                            "gpu_shaped_encode.py: the encode pipeline's read+decode+write CPU ms per image while feeding "
                            "one SIMULATED-GPU actor at " + (", ".join(f"{r['simulated_img_s']:.0f}" for r in sim["results"])
                                                             + " img/s" if sim else "- (no --sim-json: 1000 / decode_per_core)")),
        "plan_rows_s": Rate(plan_rate or 0, "measured" if plan_rate else "n/a",
                            "bench_scale.py, slowest size, rows per CPU-second of the driver: read+validate+dedupe+plan+manifest"),
        "download_node": Rate(1350, "published", "img2dataset README: 100M urls in 20 h on one 16-core machine"),
        "gpu_peak": Rate(362e12, "published", "NVIDIA L40S dense BF16 tensor peak (g6e.xlarge in ray_cluster.yaml)"),
        "mfu_infer": Rate(0.40, "assumed", "ViT-L inference utilisation at batch 256, bf16"),
        "mfu_train": Rate(0.30, "assumed", "small-encoder training utilisation"),
        "success": Rate(0.80, "assumed", "share of urls that still download (link rot); measure on a sample first"),
        "gpu_price": Rate(1.861, "published", "AWS g6e.xlarge on-demand $/h (us-east-1)"),
        "cpu_price": Rate(0.68, "published", "AWS c6i.4xlarge on-demand $/h (16 vCPU)"),
        "s3_price": Rate(0.023, "published", "S3 Standard $/GB-month"),
    }
    gpu_img_s = rates["gpu_peak"].value * rates["mfu_infer"].value / vit
    train_samples_s = rates["gpu_peak"].value * rates["mfu_train"].value / train
    c64 = bytes_per_image(64, 384, "int8") + 1024 * 4 + 100  # tokens + fp32 pooled embedding + id/url
    raw = bytes_per_image(576, 1024, "fp16") + 2 * 1024 * 4 + 200  # raw tables: tokens, two embeddings, caption
    out = ["| | CC12M | LAION-400M | source |", "| --- | ---: | ---: | --- |"]
    rows = {"CC12M": 12_423_374, "LAION-400M": 413_000_000}
    cells = {}
    for name, n in rows.items():
        ok = n * rates["success"].value
        gpus = args.gpus
        encode_h = ok / (gpu_img_s * gpus) / 3600
        # CPU nodes to keep the GPUs fed: download (published per node) and decode (measured per core)
        feed = gpu_img_s * gpus
        dl_nodes = math.ceil(feed / rates["download_node"].value)
        dec_cores = math.ceil(feed * rates["feed_cpu_ms"].value / 1000)
        plan_min = n / rates["plan_rows_s"].value / 60 if rates["plan_rows_s"].value else float("nan")
        c64_gb, raw_tb = ok * c64 / 1e9, ok * raw / 1e12
        train_h = ok * args.epochs / (train_samples_s * gpus) / 3600
        train_online_h = ok * args.epochs / (gpus / (1 / train_samples_s + 1 / gpu_img_s)) / 3600
        cost_enc = encode_h * (gpus * rates["gpu_price"].value + dl_nodes * rates["cpu_price"].value)
        cells[name] = {
            "urls": f"{n:,}", "images kept": f"{ok:,.0f}", "driver planning (min)": f"{plan_min:.1f}",
            "GPUs (L40S)": f"{gpus}", "CPU nodes for download (16 vCPU)": f"{dl_nodes}",
            "decode cores needed (Ray Data feed, per the pipeline)": f"{dec_cores}",
            "resize cores at download (640x480 -> 384)": f"{math.ceil(feed / rates['decode_per_core'].value)}",
            "encode wall time (h)": f"{encode_h:.1f}",
            "encode GPU-hours": f"{encode_h * gpus:,.0f}", "encode cost ($, on-demand)": f"{cost_enc:,.0f}",
            "compressed-64 int8 tables (GB)": f"{c64_gb:,.0f}",
            "storage $/month (S3)": f"{c64_gb * rates['s3_price'].value:,.0f}",
            "raw training tables (TB)": f"{raw_tb:,.1f}",
            f"train from raw tables, {args.epochs} epoch(s) (h)": f"{train_h:.1f}",
            f"train with the backbone online, {args.epochs} epoch(s) (h)": f"{train_online_h:.1f}",
            "train GPU-hours (online backbone)": f"{train_online_h * gpus:,.0f}",
        }
    src = {"urls": "published list sizes", "images kept": "x success (assumed)",
           "driver planning (min)": "measured rows per CPU-s (one core)", "GPUs (L40S)": "chosen (--gpus)",
           "CPU nodes for download (16 vCPU)": "published img2dataset rate",
           "decode cores needed (Ray Data feed, per the pipeline)":
               "measured pipeline CPU per image (simulation)" if sim else "measured decode rate",
           "resize cores at download (640x480 -> 384)": "measured decode+resize rate (img2dataset workers)",
           "encode wall time (h)": "published peak x assumed MFU",
           "encode GPU-hours": "same", "encode cost ($, on-demand)": "published prices",
           "compressed-64 int8 tables (GB)": "computed (codec)", "storage $/month (S3)": "published price",
           "raw training tables (TB)": "computed (576x1024 fp16)",
           f"train from raw tables, {args.epochs} epoch(s) (h)": "computed FLOPs / (peak x assumed MFU)",
           f"train with the backbone online, {args.epochs} epoch(s) (h)": "same + backbone forward",
           "train GPU-hours (online backbone)": "same"}
    for key in cells["CC12M"]:
        out.append(f"| {key} | {cells['CC12M'][key]} | {cells['LAION-400M'][key]} | {src[key]} |")
    lines = [f"Per-image compute: ViT-L-16-SigLIP2-384 forward {vit / 1e9:.0f} GFLOPs (computed); EDJE training "
             f"sample (k=7 negatives, fwd+bwd) {train / 1e9:.0f} GFLOPs (computed). Per L40S: "
             f"{gpu_img_s:,.0f} images/s encode, {train_samples_s:,.0f} samples/s training (published peak x "
             f"assumed MFU, **not measured**: no GPU here). Bytes per image: compressed-64 int8 {c64:,} "
             f"(tokens {bytes_per_image(64, 384, 'int8'):,}), raw {raw:,}.", "", *out, "", "Inputs:", ""]
    lines += [f"- `{k}` = {v.value:,.4g} ({v.source}): {v.note}" for k, v in rates.items()]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale-json", help="results of benchmarks/bench_scale.py --json (measured planning rate)")
    p.add_argument("--gpus", type=int, default=16, help="GPU workers (ray_cluster.yaml: up to 16 g6e.xlarge)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--decode-per-core", type=float, help="skip the decode measurement and use this rate")
    p.add_argument("--sim-json", help="results of benchmarks/gpu_shaped_encode.py --json (the pipeline's CPU per image)")
    print(plan(p.parse_args()))


if __name__ == "__main__":
    main()
