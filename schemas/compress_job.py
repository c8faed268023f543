"""Typed options of the compress job (jobs/compress.py): raw token tables + an adapter -> compressed tables."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from edje.schemas.cli_options import option
from edje.schemas.config import CodecConfig


@dataclass(frozen=True)
class CompressJobConfig:
    """Everything one run of the compress job needs; each field's command-line option (jobs/compress.py) is written
    on it."""

    tables: Union[str, Tuple[str, ...]] = option(nargs="+", required=True, help="raw token tables: files, folders or "
                                                 "globs on any fsspec path (local, s3://), all made by one backbone")
    adapter: str = option(required=True, help="EDJE checkpoint dir whose adapter compresses the tokens; it must have "
                          "been trained on the tables' backbone")
    output: str = option(required=True, help="output folder on any fsspec path: tables/, stats/, manifest.json, "
                         "summary.json")
    quant: str = option("int8", choices=["fp32", "fp16", "int8", "int4"], help="token storage (default %(default)s)")
    group_size: Optional[int] = option(None, help="int4 only: values per scale (default: one scale per token)")
    batch_size: int = option(256, help="rows per adapter call (default %(default)s)")
    concurrency: int = option(1, help="adapter actors (default %(default)s)")
    gpus_per_worker: Optional[float] = option(None, help="GPUs per adapter actor (default: 1 when the cluster has "
                                              "GPUs, else 0 = CPU)")
    cpus_per_worker: float = option(1.0, help="CPUs per adapter actor (default %(default)s)")
    # 0: the actor's CPU count
    torch_threads: int = option(0, help="torch threads per adapter actor (default: its CPU count)")
    compute_dtype: str = option("fp32", choices=["fp32", "bf16"], help="the adapter's arithmetic on every device "
                                "(default %(default)s)")
    s3_endpoint: Optional[str] = option(None, help="S3-compatible endpoint url for s3:// paths (e.g. MinIO, moto)")
    address: Optional[str] = option(None, help="Ray cluster address (default: RAY_ADDRESS, else start a local Ray)")
    num_cpus: Optional[int] = option(None, help="CPUs of the local Ray this command starts (default: all)")

    def __post_init__(self) -> None:
        tables = (self.tables,) if isinstance(self.tables, str) else tuple(self.tables)
        if not tables:
            raise ValueError("tables names no file")
        object.__setattr__(self, "tables", tables)
        CodecConfig(self.quant, self.group_size)  # validates quantization / group size
        if min(self.batch_size, self.concurrency) < 1:
            raise ValueError("batch_size and concurrency must be >= 1")
        if self.compute_dtype not in ("fp32", "bf16"):
            raise ValueError(f"compute_dtype must be fp32 or bf16, got {self.compute_dtype!r}")
