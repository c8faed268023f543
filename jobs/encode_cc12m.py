"""Encode a CC12M-style list of (url, caption) pairs into Parquet token tables on Ray Data.

    python jobs/encode_cc12m.py --output runs/enc                      # the embedded sample world
    python jobs/encode_cc12m.py --input urls.tsv --output s3://b/enc --adapter ckpt/ --quant int8
    ray job submit --working-dir . -- python jobs/encode_cc12m.py --input ... --output ...

Without --adapter the tables are *raw* (backbone tokens, pooled image embedding, caption,
caption text embedding: training input); with it they are *compressed* (adapter output,
quantized: serving input). Running the same command again resumes: committed shards are
skipped, partial ones redone. `<output>/summary.json` holds the counts, failures by reason,
bytes per image, images per second and the table paths.
"""
from __future__ import annotations

import argparse
import os
import sys

# Runs as a script (python jobs/encode_cc12m.py, ray job submit): make the repo importable.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from edje.schemas.encode_job import EncodeJobConfig
from edje.schemas.shipped import DEFAULT_BACKBONE, SHIPPED_BACKBONE_WEIGHTS
from edje.schemas.weights import find_weights


class WeightsError(ValueError):
    """The backbone would run with random weights without being asked to."""


def build_parser() -> argparse.ArgumentParser:
    """The command line; every option maps onto an EncodeJobConfig field."""
    d = EncodeJobConfig(output="-")
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("input and output")
    io.add_argument("--input", nargs="+", help="url list(s): one or more files, folders or globs on any fsspec "
                    "path (local, s3://, http(s)://), each TSV/CSV (optionally compressed) or Parquet with url and "
                    "caption columns (and optionally an image id column). Omitted: generate the embedded sample "
                    "world and serve it on loopback")
    io.add_argument("--output", required=True, help="output folder on any fsspec path (local, s3://): "
                    "tables/, stats/, manifest.json, summary.json")
    io.add_argument("--input-format", default=d.input_format, choices=["auto", "tsv", "csv", "parquet"],
                    help="format of --input (default: from the file name)")
    io.add_argument("--url-col", default=d.url_col, help="url column name (default %(default)s)")
    io.add_argument("--caption-col", default=d.caption_col, help="caption column name (default %(default)s; "
                    "LAION parquet parts: --url-col URL --caption-col TEXT)")
    io.add_argument("--id-col", default=d.id_col, help="image id column name; a list without one gets ids "
                    "from a hash of the url (default %(default)s)")
    io.add_argument("--s3-endpoint", help="S3-compatible endpoint url for s3:// paths (e.g. MinIO, moto); "
                    "credentials come from the usual AWS_* environment variables")
    m = p.add_argument_group("model")
    m.add_argument("--backbone", help=f"open_clip model name (default: the adapter checkpoint's, else {DEFAULT_BACKBONE})")
    m.add_argument("--pretrained", help="open_clip pretrained tag or local checkpoint path (default: the adapter "
                   "checkpoint's, else the weights the repository ships for the backbone: "
                   + ", ".join(f"{k} -> {v}" for k, v in SHIPPED_BACKBONE_WEIGHTS.items()) + ")")
    m.add_argument("--random-weights", action="store_true", help="encode with a randomly initialised backbone "
                   "(tests and benchmarks only); without it a backbone with no weights is refused")
    m.add_argument("--feature-layer", choices=["final", "penultimate"], help="which backbone tokens to store "
                   "(default: the adapter checkpoint's, else final)")
    m.add_argument("--adapter", help="EDJE checkpoint dir: store its adapter's output (compressed tables). "
                   "Omitted: store backbone tokens + captions + text embeddings (raw tables)")
    m.add_argument("--quant", default=d.quant, choices=["fp32", "fp16", "int8", "int4"],
                   help="token storage (default %(default)s)")
    m.add_argument("--group-size", type=int, help="int4 only: values per scale (default: one scale per token)")
    r = p.add_argument_group("compute")
    r.add_argument("--batch-size", type=int, default=d.batch_size, help="images per encoder call (default %(default)s)")
    r.add_argument("--concurrency", type=int, default=d.concurrency, help="encoder actors (default %(default)s)")
    r.add_argument("--gpus-per-worker", type=float, help="GPUs per encoder actor (default: 1 when the cluster "
                   "has GPUs, else 0 = CPU)")
    r.add_argument("--cpus-per-worker", type=float, default=d.cpus_per_worker,
                   help="CPUs per encoder actor (default %(default)s)")
    r.add_argument("--torch-threads", type=int, default=d.torch_threads,
                   help="torch threads per encoder actor (default: its CPU count)")
    r.add_argument("--compute-dtype", default=d.compute_dtype, choices=["fp32", "bf16"],
                   help="arithmetic of backbone + adapter on every device (default %(default)s: GPU-written tables "
                   "equal CPU-written ones within the codec's bound; bf16 is faster on a GPU and recorded in the "
                   "table metadata)")
    r.add_argument("--shard-size", type=int, default=d.shard_size,
                   help="url-list rows per shard = per output table, the unit of resuming (default %(default)s)")
    r.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else start a local Ray)")
    r.add_argument("--num-cpus", type=int, help="CPUs of the local Ray this command starts (default: all)")
    dl = p.add_argument_group("download")
    dl.add_argument("--download-threads", type=int, default=d.download_threads,
                    help="img2dataset threads per shard (default %(default)s)")
    dl.add_argument("--timeout", type=float, default=d.timeout, help="seconds per url (default %(default)s)")
    dl.add_argument("--retries", type=int, default=d.retries, help="retries per url (default %(default)s)")
    dl.add_argument("--max-image-pixels", type=int, default=d.max_image_pixels,
                    help="images with more pixels are rejected as decompression bombs (default %(default)s)")
    w = p.add_argument_group("embedded sample world (when --input is omitted)")
    w.add_argument("--world-dir", help="where to generate it (default: ~/.cache/edje-ray/sampleworld-seed0-N)")
    w.add_argument("--world-images", type=int, default=d.world_images, help="images (default %(default)s)")
    return p


def weights_from_flags(backbone: str | None, pretrained: str | None, adapter: str | None, random_weights: bool) -> str | None:
    """The flags checked against each other; where the weights are is find_weights's to say."""
    if random_weights and (pretrained or adapter):
        raise WeightsError("--random-weights contradicts --pretrained / --adapter, which name weights")
    if pretrained or adapter:
        return pretrained  # an adapter checkpoint records its backbone's weights (pipeline.encode.resolve_backbone)
    if random_weights:
        return None
    name = backbone or DEFAULT_BACKBONE
    weights = find_weights(backbone=name)
    if weights is None:
        raise WeightsError(f"backbone {name!r} has no weights: give --pretrained (an open_clip tag or a checkpoint "
                           f"path), or --random-weights to encode with random initialisation on purpose")
    return weights


def config_from_args(argv=None) -> EncodeJobConfig:
    """Parse the command line into an EncodeJobConfig (backbone weights checked by weights_from_flags)."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    random_weights = args.pop("random_weights")
    try:
        args["pretrained"] = weights_from_flags(args["backbone"], args["pretrained"], args["adapter"], random_weights)
    except WeightsError as e:
        parser.error(str(e))
    return EncodeJobConfig(**args)


def main(argv=None) -> int:
    """Run the job; exit status 0 when every shard is committed, 1 otherwise (rerun to finish)."""
    cfg = config_from_args(argv)
    from edje.pipeline.job import IncompleteJobError, run_encode_job

    try:
        run_encode_job(cfg)
    except IncompleteJobError as e:
        print(f"[encode] incomplete: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
