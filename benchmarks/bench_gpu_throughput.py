"""GPU throughput: encode images/s and reranker pairs/s on one device, each with its share of the device's bf16 peak.

    .venv/bin/python benchmarks/bench_gpu_throughput.py --json runs/gpu_throughput.json   # on a GPU machine

ViT-L-16-SigLIP2-384 images/s through the encode actor (pipeline/encode.py EncodeBatch: random weights, a random
64 x 384 compression adapter, int8 tables, bf16 arithmetic), and compressed-64 pairs/s of a MiniLM-L12-H384-shaped
joint encoder in bf16 at forward batches 64 to 4,096 (benchmarks/bench_serving.py's encoder). Each figure is printed
with the device name and its share of the device's dense bf16 peak (benchmarks/bench_encode.py's table; unknown
devices: no share). FLOPs are approximated as 2 x parameters x tokens per image or pair (the matmuls of a forward;
attention's score and value products, ~2 x tokens^2 x width per layer, are left out, so the share reads low).

These are measurements; that every GPU-bound path works on the device is the GPU smoke's job
(`pytest tests/test_gpu_smoke.py --device cuda`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ENCODE_MODEL = "ViT-L-16-SigLIP2-384"


def peak_tflops(device) -> tuple:
    """(device name, dense bf16 peak TFLOP/s or None)."""
    import torch
    from bench_encode import bf16_peak_tflops

    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, bf16_peak_tflops(name)


def share(flops_per_item: float, rate: float, peak: Optional[float]) -> str:
    """A rate's share of the peak, as printed."""
    return f"{100 * flops_per_item * rate / (peak * 1e12):.1f}% of {peak:g} TFLOPS" if peak else "peak unknown"


def throughput_encode(args, work: Path, figures: dict) -> str:
    """ViT-L-16-SigLIP2-384 images/s through EncodeBatch (random weights, random compression adapter, int8)."""
    import numpy as np
    from bench_encode import random_adapter_checkpoint

    from edje.pipeline.encode import EncodeBatch, EncoderSpec
    from edje.schemas.config import BackboneConfig

    ckpt = random_adapter_checkpoint(work / "adapter-vitl", 1024)
    actor = EncodeBatch(EncoderSpec(BackboneConfig(ENCODE_MODEL), ckpt, "int8", None, torch_threads=args.threads,
                                    compute_dtype="bf16"))
    size, b = actor.encoder.backbone.preprocess.size, args.encode_batch
    rng = np.random.default_rng(0)
    batch = {"status": np.array(["ok"] * b, dtype=object), "image": rng.integers(0, 256, (b, size, size, 3), np.uint8),
             "caption": np.array(["x"] * b, dtype=object), "shard": np.zeros(b, np.int32), "row": np.arange(b, dtype=np.int32),
             "image_id": np.array([str(i) for i in range(b)], dtype=object), "url": np.array([""] * b, dtype=object),
             "detail": np.array([""] * b, dtype=object)}
    actor(batch)  # warm-up (returns host arrays: the device is synchronised)
    n_batches = max(1, args.encode_images // b)
    t = time.perf_counter()
    for _ in range(n_batches):
        actor(batch)
    rate = n_batches * b / (time.perf_counter() - t)
    params = sum(p.numel() for p in actor.encoder.backbone.visual.parameters())
    tokens = actor.encoder.backbone.token_shape[0]
    flops = 2 * params * tokens
    dev, peak = peak_tflops(actor.encoder.device)
    figures["encode"] = dict(model=ENCODE_MODEL, device=dev, images_per_s=round(rate, 1), batch=b, compute_dtype="bf16",
                             gflops_per_image_approx=round(flops / 1e9, 1), bf16_peak_tflops=peak)
    return (f"{ENCODE_MODEL} through EncodeBatch on {dev}: {rate:,.1f} images/s (batch {b}, bf16), "
            f"~{flops / 1e9:.0f} GFLOP/img (2 x {params / 1e6:.0f}M params x {tokens} tokens), {share(flops, rate, peak)}")


def throughput_pairs(args, figures: dict) -> str:
    """compressed-64 pairs/s of a MiniLM-L12-H384-shaped joint encoder at batches 64..4096 (bench_serving.py's)."""
    import torch
    from bench_serving import DTYPES, captions, encoder_config, timed

    from edje.model.device import pick_device
    from edje.model.joint_encoder import JointEncoder

    device = pick_device(args.device)
    dtype = DTYPES[args.pairs_dtype]
    enc = JointEncoder(encoder_config("l12", 64)).to(device, dtype).eval()
    layers = sum(p.numel() for n, p in enc.bert.named_parameters() if ".encoder." in n or n.startswith("encoder."))
    texts = captions(max(args.pair_batches), seed=3)
    tokens = torch.randn(max(args.pair_batches), 64, enc.hidden_size, device=device, dtype=dtype)
    dev, peak = peak_tflops(device)
    rows, out = [], {}
    for b in args.pair_batches:
        seq = enc.tokenize_pairs(texts[:b], 64).input_ids.shape[1]
        with torch.inference_mode():
            seconds = timed(lambda b=b: enc.score(texts[:b], tokens[:b]), args.pair_reps)
        rate = b / seconds
        flops = 2 * layers * seq
        out[b] = dict(pairs_per_s=round(rate, 1), tokens_per_pair=seq, gflops_per_pair_approx=round(flops / 1e9, 3))
        rows.append(f"b{b}: {rate:,.1f} pairs/s ({share(flops, rate, peak)})")
    figures["pairs"] = dict(model="MiniLM-L12-H384-shaped, compressed-64", device=dev, dtype=args.pairs_dtype,
                            bf16_peak_tflops=peak, by_batch=out)
    return (f"compressed-64, L12-H384 {args.pairs_dtype} on {dev}; FLOPs ~ 2 x {layers / 1e6:.1f}M encoder params x "
            f"tokens per pair: " + ", ".join(rows))


def parse(argv=None) -> argparse.Namespace:
    """The benchmark's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu; cpu hides the GPUs from this process")
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads")
    p.add_argument("--encode-images", type=int, default=4096, help="images timed through EncodeBatch")
    p.add_argument("--encode-batch", type=int, default=256, help="images per EncodeBatch call")
    p.add_argument("--pair-batches", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--pair-reps", type=int, default=10)
    p.add_argument("--pairs-dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--only", choices=["encode", "pairs"], help="one figure only (default: both)")
    p.add_argument("--json", help="also write the figures here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Print the figures (and write them with --json); 2 when the device named is not visible."""
    args = parse(argv)
    if args.device == "cpu":
        # Before torch: EncodeBatch takes cuda whenever one is visible (as a Ray actor given a GPU would).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the random models' heads are newly initialised on purpose
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device} but no CUDA device is visible (use --device cpu for CPU figures)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"[gpu-throughput] device {args.device} ({name}), torch {torch.__version__}", flush=True)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        if args.only in (None, "encode"):
            print("[gpu-throughput] encode: " + throughput_encode(args, Path(tmp), figures), flush=True)
        if args.only in (None, "pairs"):
            print("[gpu-throughput] pairs: " + throughput_pairs(args, figures), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": args.device, "device_name": name, "figures": figures},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
