"""Typed options of the encode job (jobs/encode_cc12m.py): input, output, model, download, Ray."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from edje.schemas.cli_options import option
from edje.schemas.config import CodecConfig
from edje.schemas.shipped import DEFAULT_BACKBONE, SHIPPED_BACKBONE_WEIGHTS
from edje.schemas.token_table import AUGMENTS, TABLE_COLUMNS

# Url lists (downloaded), and the images a user already holds (read where they lie).
URL_LIST_FORMATS = ("auto", "tsv", "csv", "parquet")
FILE_FORMATS = ("webdataset", "image-folder", "image-parquet")
INPUT_FORMATS = URL_LIST_FORMATS + FILE_FORMATS


# Argument groups of the job's --help.
IO, MODEL, COMPUTE, DOWNLOAD, WORLD = ("input and output", "model", "compute", "download",
                                      "embedded sample world (when --input is omitted)")


@dataclass(frozen=True)
class EncodeJobConfig:
    """Everything one run of the encode job needs; `None` input means the embedded sample world. Each field's
    command-line option (jobs/encode_cc12m.py) is written on it."""

    output: str = option(group=IO, required=True, help="output folder on any fsspec path (local, s3://): tables/, "
                         "stats/, manifest.json, summary.json")
    # files, folders or globs on any fsspec path; a string is one entry
    input: Optional[Union[str, Tuple[str, ...]]] = option(
        None, group=IO, nargs="+", help="one or more files, folders or globs on any fsspec path (local, s3://, "
        "http(s)://): url lists (TSV/CSV, optionally compressed, or Parquet with url and caption columns and "
        "optionally an image id column: downloaded), or images already held, read where they lie: webdataset .tar "
        "shards (img2dataset's output), an image folder with sidecar .txt (and .json) captions (img2dataset's files "
        "output), a CSV/TSV/Parquet table of image paths and captions, Parquet with an image-bytes column "
        "(img2dataset's Parquet output; the Hugging Face datasets layout). Omitted: generate the embedded sample "
        "world and serve it on loopback")
    # one of INPUT_FORMATS; auto: detected (pipeline.input_source)
    input_format: str = option("auto", group=IO, choices=INPUT_FORMATS, help="format of --input: tsv, csv or parquet "
                               "url lists, webdataset, image-folder (a folder, or tables of image paths), "
                               "image-parquet (default: detected from the files, their names and columns; an input "
                               "that fits two readings is refused with the choice to make)")
    url_col: str = option("url", group=IO, help="url column name (default %(default)s)")
    caption_col: str = option("caption", group=IO, help="caption column name (default %(default)s; LAION parquet "
                              "parts: --url-col URL --caption-col TEXT)")
    id_col: str = option("image_id", group=IO, help="image id column (or .json field) name; a url list without one "
                         "gets ids from a hash of the url, images already held their sample key: the tar member's or "
                         "file's name without extension, img2dataset's key, else a hash of the path (default "
                         "%(default)s)")
    # input columns carried into the token tables, with their types; the command line gives them comma-separated
    keep_columns: Tuple[str, ...] = option(
        (), group=IO, cli_default="", help="comma-separated input columns (or .json fields) to carry into the token "
        "tables, e.g. similarity,punsafe: Parquet types are kept, TSV/CSV values are strings, JSON numbers float64")
    # image-parquet: the image column (None: found by name)
    image_col: Optional[str] = option(None, group=IO, help="image-parquet: the image column (binary, or a struct "
                                      "{bytes, path}); webdataset: the image member's extension (default: jpg, image, "
                                      "img, png, webp, ... whichever is there)")
    path_col: str = option("path", group=IO, help="a table of image paths: the path column, relative to the table's "
                           "folder, absolute or a url (default %(default)s; Hugging Face metadata.csv: file_name)")
    backbone: Optional[str] = option(
        None, group=MODEL, help="open_clip model name (with --pretrained TAG or a weights file), or hf-hub:ORG/NAME "
        "(an open_clip hub repository: its config and weights, no tag); weights come from the hub as HF_HUB_OFFLINE "
        f"/ HF_HOME / HF_ENDPOINT / HF_TOKEN allow (default: the adapter checkpoint's, else {DEFAULT_BACKBONE})")
    pretrained: Optional[str] = option(
        None, group=MODEL, help="open_clip pretrained tag or local (or s3://) weights file (default: the adapter "
        "checkpoint's, else the weights the repository ships for the backbone: "
        + ", ".join(f"{k} -> {v}" for k, v in SHIPPED_BACKBONE_WEIGHTS.items()) + ")")
    random_weights: bool = option(False, group=MODEL, help="encode with a randomly initialised backbone (tests and "
                                  "benchmarks only; an hf-hub repository's weights are skipped too); without it a "
                                  "backbone with no weights is refused")
    feature_layer: Optional[str] = option(
        None, group=MODEL, choices=["final", "penultimate"], help="which backbone tokens to store (default: the "
        "adapter checkpoint's, else the tower's kind: penultimate for class-token CLIP towers, final for SigLIP-style "
        "ones)")
    adapter: Optional[str] = option(None, group=MODEL, help="EDJE checkpoint dir: store its adapter's output "
                                    "(compressed tables). Omitted: store backbone tokens + captions + text embeddings "
                                    "(raw tables)")
    # Raw (training) tables only: each image also encoded so transformed ("hflip": mirrored left-right), as a row
    # of its own (schemas/token_table.py); the flip square of training reads them.
    augment: Optional[str] = option(
        None, group=MODEL, choices=sorted(AUGMENTS), help="raw (training) tables only: also encode each image so "
        "transformed, as a row of its own (hflip: mirrored left-right, id <image id>#hflip, source_image_id and "
        "augment columns), for training's flip square; refused with --adapter")
    quant: str = option("fp16", group=MODEL, choices=["fp32", "fp16", "int8", "int4"],
                        help="token storage (default %(default)s)")
    group_size: Optional[int] = option(None, group=MODEL, help="int4 only: values per scale (default: one scale per "
                                       "token)")
    batch_size: int = option(64, group=COMPUTE, help="images per encoder call (default %(default)s)")
    concurrency: int = option(1, group=COMPUTE, help="encoder actors (default %(default)s)")
    gpus_per_worker: Optional[float] = option(None, group=COMPUTE, help="GPUs per encoder actor (default: 1 when the "
                                              "cluster has GPUs, else 0 = CPU)")
    cpus_per_worker: float = option(1.0, group=COMPUTE, help="CPUs per encoder actor (default %(default)s)")
    # 0: the encoder actor's CPU count
    torch_threads: int = option(0, group=COMPUTE, help="torch threads per encoder actor (default: its CPU count)")
    compute_dtype: str = option("fp32", group=COMPUTE, choices=["fp32", "bf16"], help="arithmetic of backbone + "
                                "adapter on every device (default %(default)s: GPU-written tables equal CPU-written "
                                "ones within the codec's bound; bf16 is faster on a GPU and recorded in the table "
                                "metadata)")
    shard_size: int = option(1000, group=COMPUTE, help="input rows per shard = per output table, the unit of "
                             "resuming (default %(default)s)")
    shards_per_file: int = 64  # input shards per `_input/` Parquet file (one row group each)
    scratch: Optional[str] = None  # local folder for planning's spill files (default: system temp)
    download_threads: int = option(32, group=DOWNLOAD, help="img2dataset threads per shard (default %(default)s)")
    timeout: float = option(10.0, group=DOWNLOAD, help="seconds per url (default %(default)s)")
    retries: int = option(1, group=DOWNLOAD, help="retries per url (default %(default)s)")
    max_image_pixels: int = option(89_478_485, group=DOWNLOAD, help="images with more pixels are rejected as "
                                   "decompression bombs (default %(default)s)")
    s3_endpoint: Optional[str] = option(None, group=IO, help="S3-compatible endpoint url for s3:// paths (e.g. MinIO, "
                                        "moto); credentials come from the usual AWS_* environment variables")
    address: Optional[str] = option(None, group=COMPUTE, help="Ray cluster address (default: RAY_ADDRESS, else start "
                                    "a local Ray)")
    num_cpus: Optional[int] = option(None, group=COMPUTE, help="CPUs of the local Ray this command starts (default: "
                                     "all)")
    world_dir: Optional[str] = option(None, group=WORLD, help="where to generate it (default: "
                                      "~/.cache/edje-ray/sampleworld-seed0-N)")
    world_images: int = option(512, group=WORLD, help="images (default %(default)s)")

    def __post_init__(self) -> None:
        if self.input is not None and not isinstance(self.input, str):
            object.__setattr__(self, "input", tuple(self.input))  # hashable, frozen
            if not self.input:
                raise ValueError("input names no file")
        CodecConfig(self.quant, self.group_size)  # validates quantization / group size
        if min(self.batch_size, self.concurrency, self.shard_size, self.shards_per_file) < 1:
            raise ValueError("batch_size, concurrency, shard_size and shards_per_file must be >= 1")
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {self.input_format!r}")
        if isinstance(self.keep_columns, str):
            object.__setattr__(self, "keep_columns", tuple(c.strip() for c in self.keep_columns.split(",") if c.strip()))
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        if self.augment is not None and self.augment not in AUGMENTS:
            raise ValueError(f"augment must be one of {', '.join(sorted(AUGMENTS))}, got {self.augment!r}")
        if self.augment is not None and self.adapter:
            raise ValueError("--augment makes training rows: serving (compressed) tables never carry them; "
                             "encode without --adapter")
        clash = sorted(set(self.keep_columns) & set(TABLE_COLUMNS))
        if clash:
            raise ValueError(f"keep_columns {clash} are token table columns already")

    @property
    def kind(self) -> str:
        """'compressed' with an adapter, 'raw' without."""
        return "compressed" if self.adapter else "raw"
