"""Typed options of the encode job (jobs/encode_cc12m.py): input, output, model, download, Ray."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from edje.schemas.config import CodecConfig
from edje.schemas.token_table import AUGMENTS, TABLE_COLUMNS

# Url lists (downloaded), and the images a user already holds (read where they lie).
URL_LIST_FORMATS = ("auto", "tsv", "csv", "parquet")
FILE_FORMATS = ("webdataset", "image-folder", "image-parquet")
INPUT_FORMATS = URL_LIST_FORMATS + FILE_FORMATS


@dataclass(frozen=True)
class EncodeJobConfig:
    """Everything one run of the encode job needs; `None` input means the embedded sample world."""

    output: str
    # files, folders or globs on any fsspec path; a string is one entry
    input: Optional[Union[str, Tuple[str, ...]]] = None
    input_format: str = "auto"  # one of INPUT_FORMATS; auto: detected (pipeline.input_source)
    url_col: str = "url"
    caption_col: str = "caption"
    id_col: str = "image_id"
    keep_columns: Tuple[str, ...] = ()  # input columns carried into the token tables, with their types
    image_col: Optional[str] = None  # image-parquet: the image column (None: found by name)
    path_col: str = "path"  # image-folder given as a table: the image path column
    backbone: Optional[str] = None  # None: the adapter checkpoint's backbone, else schemas.shipped.DEFAULT_BACKBONE
    pretrained: Optional[str] = None
    random_weights: bool = False  # the backbone's architecture, randomly initialised (tests and benchmarks)
    feature_layer: Optional[str] = None  # None: the adapter checkpoint's, else the backbone kind's default
    adapter: Optional[str] = None  # EDJE checkpoint dir -> compressed tables; None -> raw tables
    # Raw (training) tables only: each image also encoded so transformed ("hflip": mirrored left-right), as a row
    # of its own (schemas/token_table.py); the flip square of training reads them.
    augment: Optional[str] = None
    quant: str = "fp16"
    group_size: Optional[int] = None
    batch_size: int = 64
    concurrency: int = 1  # encoder actors
    gpus_per_worker: Optional[float] = None  # None: 1 when the cluster has GPUs, else 0
    cpus_per_worker: float = 1.0
    torch_threads: int = 0  # 0: the encoder actor's CPU count
    compute_dtype: str = "fp32"  # "fp32" (tables equal on every device) or "bf16" (faster on a GPU)
    shard_size: int = 1000  # input rows per shard (= per output table)
    shards_per_file: int = 64  # input shards per `_input/` Parquet file (one row group each)
    scratch: Optional[str] = None  # local folder for planning's spill files (default: system temp)
    download_threads: int = 32
    timeout: float = 10.0
    retries: int = 1
    max_image_pixels: int = 89_478_485
    s3_endpoint: Optional[str] = None
    address: Optional[str] = None  # Ray address; None: RAY_ADDRESS or a fresh local instance
    num_cpus: Optional[int] = None  # CPUs of a fresh local Ray instance
    world_dir: Optional[str] = None  # where the default sample world is generated (local)
    world_images: int = 512  # size of the default sample world

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
