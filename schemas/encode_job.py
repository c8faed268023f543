"""Typed options of the encode job (jobs/encode_cc12m.py): input, output, model, download, Ray."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from edje.schemas.config import CodecConfig


@dataclass(frozen=True)
class EncodeJobConfig:
    """Everything one run of the encode job needs; `None` input means the embedded sample world."""

    output: str
    # files, folders or globs on any fsspec path; a string is one entry
    input: Optional[Union[str, Tuple[str, ...]]] = None
    input_format: str = "auto"  # auto | tsv | csv | parquet
    url_col: str = "url"
    caption_col: str = "caption"
    id_col: str = "image_id"
    backbone: Optional[str] = None  # None: the adapter checkpoint's backbone, else schemas.shipped.DEFAULT_BACKBONE
    pretrained: Optional[str] = None
    feature_layer: Optional[str] = None  # None: the adapter checkpoint's, else the backbone kind's default
    adapter: Optional[str] = None  # EDJE checkpoint dir -> compressed tables; None -> raw tables
    quant: str = "fp16"
    group_size: Optional[int] = None
    batch_size: int = 64
    concurrency: int = 1  # encoder actors
    gpus_per_worker: Optional[float] = None  # None: 1 when the cluster has GPUs, else 0
    cpus_per_worker: float = 1.0
    torch_threads: int = 0  # 0: the encoder actor's CPU count
    compute_dtype: str = "fp32"  # "fp32" (tables equal on every device) or "bf16" (faster on a GPU)
    shard_size: int = 1000  # url-list rows per input shard (= per output table)
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
        if self.input_format not in ("auto", "tsv", "csv", "parquet"):
            raise ValueError(f"input_format must be auto, tsv, csv or parquet, got {self.input_format!r}")

    @property
    def kind(self) -> str:
        """'compressed' with an adapter, 'raw' without."""
        return "compressed" if self.adapter else "raw"
