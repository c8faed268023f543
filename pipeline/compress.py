"""The compress job's stages: raw token tables -> EDJE adapter -> quantize, with no backbone and no image.

    from_items(raw tables) -> map_batches(read_raw_rows) -> map_batches(CompressBatch, ActorPoolStrategy)
    -> map_batches(write_parts) -> driver commits one compressed table per raw table (pipeline.write)

The adapter and codec step is the encode job's own (model.token_encoder.TokenCompressor shares `adapt` with
TokenEncoder), so compressing a raw table gives what encoding its images with the adapter gives, up to the
raw table's own storage rounding of the backbone tokens (fp16 by default), well inside an int8 step.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from edje.pipeline import storage
from edje.pipeline.decode import OK
from edje.schemas.config import AdapterConfig, CodecConfig, EDJEConfig, from_dict
from edje.schemas.token_table import TABLE_COLUMNS, TableMetadata, decode_tokens

# What the compressed table takes from a raw row (caption and text embedding are the raw table's alone).
RAW_COLUMNS = ("image_id", "url", "tokens", "token_scales", "image_embedding")


class AdapterMismatchError(ValueError):
    """The adapter was not trained on what the tables hold (another backbone, weights, width or kind)."""


@dataclass(frozen=True)
class CompressSpec:
    """What the adapter actors build: the checkpoint, the raw tables' metadata, the output codec."""

    adapter: str
    raw: TableMetadata
    quant: str
    group_size: Optional[int]
    torch_threads: int = 0
    compute_dtype: str = "fp32"


def load_adapter(path: str) -> Tuple[torch.nn.Module, str]:
    """(adapter module in eval mode, its content hash) of an EDJE checkpoint."""
    from edje.model.edje import load_checkpoint

    model = load_checkpoint(path)
    return model.adapter.eval().requires_grad_(False), model.adapter_hash()


def check_adapter_fits(raw: TableMetadata, checkpoint: str) -> AdapterConfig:
    """The checkpoint's adapter config, after checking it was trained on the backbone that made the tables."""
    from edje.model.edje import read_checkpoint_config

    cfg = from_dict(EDJEConfig, read_checkpoint_config(checkpoint)["config"])
    ck = cfg.backbone
    if raw.kind != "raw":
        raise AdapterMismatchError(f"compress reads raw token tables; these are {raw.kind}")
    if (ck.name, ck.feature_layer) != (raw.backbone, raw.feature_layer):
        raise AdapterMismatchError(f"adapter {checkpoint} was trained on {ck.name} ({ck.feature_layer} tokens), the tables hold "
                         f"{raw.backbone} ({raw.feature_layer} tokens)")
    # The same weights: by content where either side knows it, else by tag (or both random).
    same = (ck.weights_sha256 == raw.pretrained_sha256 if ck.weights_sha256 or raw.pretrained_sha256
            else ck.pretrained == raw.pretrained)
    if not same:
        raise AdapterMismatchError(f"adapter {checkpoint} was trained on {ck.name} weights {ck.pretrained or 'random'} "
                         f"({(ck.weights_sha256 or '-')[:12]}), the tables were made with {raw.pretrained or 'random'} "
                         f"({(raw.pretrained_sha256 or '-')[:12]})")
    if cfg.adapter.input_dim != raw.width:
        raise AdapterMismatchError(f"adapter {checkpoint} takes {cfg.adapter.input_dim}-wide tokens, the tables hold {raw.width}")
    return cfg.adapter


def compressed_metadata(raw: TableMetadata, adapter: AdapterConfig, adapter_hash: str, quant: str,
                        group_size: Optional[int], compute_dtype: str) -> TableMetadata:
    """The compressed tables' metadata: the raw tables' backbone and embeddings, the adapter's tokens and codec."""
    meta = dataclasses.replace(raw, kind="compressed", num_tokens=adapter.output_tokens(raw.num_tokens),
                               width=adapter.output_dim, quantization=quant, group_size=group_size,
                               adapter_hash=adapter_hash, compute_dtype=compute_dtype)
    meta.codec  # noqa: B018 - raises CodecError now if the quantization does not fit the width
    return meta


def extra_columns(schema: pa.Schema) -> Tuple[str, ...]:
    """A raw table's columns kept from its input (--keep-columns): the ones that are no token table column."""
    return tuple(n for n in schema.names if n not in TABLE_COLUMNS)


def read_raw_rows(items: pa.Table) -> Iterator[pa.Table]:
    """Ray Data stage: each item's raw table one row group at a time, rows numbered within their table."""
    for item in items.to_pylist():
        fs, path = storage.url_to_fs(item["path"])
        first = 0
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            columns = [c for c in RAW_COLUMNS if c in pf.schema_arrow.names]
            for g in range(pf.metadata.num_row_groups):
                rows = pf.read_row_group(g, columns=columns)
                n = rows.num_rows
                rows = rows.append_column("shard", pa.array(np.full(n, item["shard"], np.int32)))
                yield rows.append_column("row", pa.array(np.arange(first, first + n, dtype=np.int32)))
                first += n


class CompressBatch:
    """Ray Data callable class: raw rows -> compressed rows in the encode job's part layout (pipeline.write)."""

    def __init__(self, spec: CompressSpec):
        from edje.model.device import pick_device
        from edje.model.token_encoder import TokenCompressor
        from edje.pipeline.encode import _assigned_cpus

        torch.set_num_threads(max(1, spec.torch_threads or _assigned_cpus()))
        adapter, _ = load_adapter(spec.adapter)
        self.raw = spec.raw
        self.compressor = TokenCompressor(adapter, CodecConfig(spec.quant, spec.group_size), spec.raw.num_tokens,
                                          pick_device(None), spec.compute_dtype)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Compress every row of the batch (raw tables hold good rows only)."""
        t_start = time.time()
        n = batch.num_rows
        blob, scales = self.compressor.encode(decode_tokens(batch, self.raw))
        codec = self.compressor.codec
        url = batch.column("url") if "url" in batch.column_names else pa.nulls(n, pa.string())
        return pa.table({
            "shard": batch.column("shard"), "row": batch.column("row"), "image_id": batch.column("image_id"),
            "url": url, "caption": pa.nulls(n, pa.string()), "status": pa.array([OK] * n, pa.string()),
            "detail": pa.array([""] * n, pa.string()), "tokens": _fixed_binary(blob, codec.blob_bytes),
            "token_scales": _fixed_binary(scales.view(np.uint8).reshape(n, -1), 2 * codec.num_scales)
            if scales is not None else pa.nulls(n, pa.binary()),
            "image_embedding": batch.column("image_embedding"),
            "text_embedding": pa.nulls(n, pa.list_(pa.float32())),
            "encode_start": pa.array(np.full(n, t_start)), "encode_end": pa.array(np.full(n, time.time())),
        })


def _fixed_binary(matrix: np.ndarray, width: int) -> pa.Array:
    flat = np.ascontiguousarray(matrix).reshape(-1)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(matrix), [None, pa.py_buffer(flat)])
