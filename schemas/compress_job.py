"""Typed options of the compress job (jobs/compress.py): raw token tables + an adapter -> compressed tables."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from edje.schemas.config import CodecConfig


@dataclass(frozen=True)
class CompressJobConfig:
    """Everything one run of the compress job needs."""

    tables: Union[str, Tuple[str, ...]]  # raw token tables: files, folders or globs on any fsspec path
    adapter: str  # EDJE checkpoint dir whose adapter compresses the tokens
    output: str  # folder on any fsspec path: tables/, stats/, manifest.json, summary.json
    quant: str = "int8"
    group_size: Optional[int] = None
    batch_size: int = 256  # rows per adapter call
    concurrency: int = 1  # adapter actors
    gpus_per_worker: Optional[float] = None  # None: 1 when the cluster has GPUs, else 0
    cpus_per_worker: float = 1.0
    torch_threads: int = 0  # 0: the actor's CPU count
    compute_dtype: str = "fp32"  # "fp32" (tables equal on every device) or "bf16" (faster on a GPU)
    s3_endpoint: Optional[str] = None
    address: Optional[str] = None  # Ray address; None: RAY_ADDRESS or a fresh local instance
    num_cpus: Optional[int] = None  # CPUs of a fresh local Ray instance

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
