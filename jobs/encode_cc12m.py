"""Encode a CC12M-style list of (url, caption) pairs, or images already held, into Parquet token tables on Ray Data.

    python jobs/encode_cc12m.py --output runs/enc                      # the embedded sample world
    python jobs/encode_cc12m.py --input urls.tsv --output s3://b/enc --adapter ckpt/ --quant int8
    python jobs/encode_cc12m.py --input s3://b/laion-wds/ --output s3://b/raw --keep-columns similarity,punsafe
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

from edje.schemas.encode_job import INPUT_FORMATS, EncodeJobConfig
from edje.schemas.shipped import DEFAULT_BACKBONE, SHIPPED_BACKBONE_WEIGHTS
from edje.schemas.token_table import AUGMENTS
from edje.schemas.weights import find_weights


class WeightsError(ValueError):
    """The backbone would run with random weights without being asked to."""


def build_parser() -> argparse.ArgumentParser:
    """The command line; every option maps onto an EncodeJobConfig field."""
    d = EncodeJobConfig(output="-")
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("input and output")
    io.add_argument("--input", nargs="+", help="one or more files, folders or globs on any fsspec path (local, "
                    "s3://, http(s)://): url lists (TSV/CSV, optionally compressed, or Parquet with url and caption "
                    "columns and optionally an image id column: downloaded), or images already held, read where "
                    "they lie: webdataset .tar shards (img2dataset's output), an image folder with sidecar .txt "
                    "(and .json) captions (img2dataset's files output), a CSV/TSV/Parquet table of image paths and "
                    "captions, Parquet with an image-bytes column (img2dataset's Parquet output; the Hugging Face "
                    "datasets layout). Omitted: generate the embedded sample world and serve it on loopback")
    io.add_argument("--output", required=True, help="output folder on any fsspec path (local, s3://): "
                    "tables/, stats/, manifest.json, summary.json")
    io.add_argument("--input-format", default=d.input_format, choices=INPUT_FORMATS,
                    help="format of --input: tsv, csv or parquet url lists, webdataset, image-folder (a folder, or "
                    "tables of image paths), image-parquet (default: detected from the files, their names and "
                    "columns; an input that fits two readings is refused with the choice to make)")
    io.add_argument("--url-col", default=d.url_col, help="url column name (default %(default)s)")
    io.add_argument("--caption-col", default=d.caption_col, help="caption column name (default %(default)s; "
                    "LAION parquet parts: --url-col URL --caption-col TEXT)")
    io.add_argument("--id-col", default=d.id_col, help="image id column (or .json field) name; a url list "
                    "without one gets ids from a hash of the url, images already held their sample key: the tar "
                    "member's or file's name without extension, img2dataset's key, else a hash of the path "
                    "(default %(default)s)")
    io.add_argument("--keep-columns", default=",".join(d.keep_columns), help="comma-separated input columns (or "
                    ".json fields) to carry into the token tables, e.g. similarity,punsafe: Parquet types are "
                    "kept, TSV/CSV values are strings, JSON numbers float64")
    io.add_argument("--image-col", default=d.image_col, help="image-parquet: the image column (binary, or a "
                    "struct {bytes, path}); webdataset: the image member's extension (default: jpg, image, img, "
                    "png, webp, ... whichever is there)")
    io.add_argument("--path-col", default=d.path_col, help="a table of image paths: the path column, relative "
                    "to the table's folder, absolute or a url (default %(default)s; Hugging Face metadata.csv: "
                    "file_name)")
    io.add_argument("--s3-endpoint", help="S3-compatible endpoint url for s3:// paths (e.g. MinIO, moto); "
                    "credentials come from the usual AWS_* environment variables")
    m = p.add_argument_group("model")
    m.add_argument("--backbone", help="open_clip model name (with --pretrained TAG or a weights file), or "
                   "hf-hub:ORG/NAME (an open_clip hub repository: its config and weights, no tag); weights come from "
                   "the hub as HF_HUB_OFFLINE / HF_HOME / HF_ENDPOINT / HF_TOKEN allow (default: the adapter "
                   f"checkpoint's, else {DEFAULT_BACKBONE})")
    m.add_argument("--pretrained", help="open_clip pretrained tag or local (or s3://) weights file (default: the "
                   "adapter checkpoint's, else the weights the repository ships for the backbone: "
                   + ", ".join(f"{k} -> {v}" for k, v in SHIPPED_BACKBONE_WEIGHTS.items()) + ")")
    m.add_argument("--random-weights", action="store_true", help="encode with a randomly initialised backbone "
                   "(tests and benchmarks only; an hf-hub repository's weights are skipped too); without it a "
                   "backbone with no weights is refused")
    m.add_argument("--feature-layer", choices=["final", "penultimate"], help="which backbone tokens to store "
                   "(default: the adapter checkpoint's, else the tower's kind: penultimate for class-token CLIP "
                   "towers, final for SigLIP-style ones)")
    m.add_argument("--adapter", help="EDJE checkpoint dir: store its adapter's output (compressed tables). "
                   "Omitted: store backbone tokens + captions + text embeddings (raw tables)")
    m.add_argument("--quant", default=d.quant, choices=["fp32", "fp16", "int8", "int4"],
                   help="token storage (default %(default)s)")
    m.add_argument("--group-size", type=int, help="int4 only: values per scale (default: one scale per token)")
    m.add_argument("--augment", choices=sorted(AUGMENTS), help="raw (training) tables only: also encode each image "
                   "so transformed, as a row of its own (hflip: mirrored left-right, id <image id>#hflip, "
                   "source_image_id and augment columns), for training's flip square; refused with --adapter")
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
                   help="input rows per shard = per output table, the unit of resuming (default %(default)s)")
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
    if backbone and backbone.startswith("hf-hub:") and pretrained:
        raise WeightsError(f"{backbone} carries its own weights: drop --pretrained {pretrained}")
    if pretrained or adapter:
        return pretrained  # an adapter checkpoint records its backbone's weights (pipeline.encode.resolve_backbone)
    if random_weights:
        return None
    name = backbone or DEFAULT_BACKBONE
    if name.startswith("hf-hub:"):
        return None  # the repository's own weights
    weights = find_weights(backbone=name)
    if weights is None:
        raise WeightsError(f"backbone {name!r} has no weights: give --pretrained (an open_clip tag or a checkpoint "
                           f"path), name an open_clip hub repository (--backbone hf-hub:ORG/NAME), or "
                           f"--random-weights to encode with random initialisation on purpose")
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
    return EncodeJobConfig(**args, random_weights=random_weights)


def main(argv=None) -> int:
    """Run the job; exit status 0 when every shard is committed, 1 otherwise (rerun to finish), 2 when a model
    cannot be had (one line says which and why)."""
    cfg = config_from_args(argv)
    from edje.pipeline.job import IncompleteJobError, run_encode_job
    from edje.storage.hub import CheckpointNotFound

    try:
        run_encode_job(cfg)
    except IncompleteJobError as e:
        print(f"[encode] incomplete: {e}", file=sys.stderr)
        return 1
    except CheckpointNotFound as e:  # a model that cannot be had: one line that names it and says why
        print(f"[encode] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
