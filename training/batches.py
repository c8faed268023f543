"""Raw token-table batches for training: decode Ray Data (pyarrow) batches and gather them across workers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from edje.schemas.token_table import TableMetadata, decode_tokens, vector_matrix

RAW_COLUMNS = ["image_id", "tokens", "image_embedding", "caption", "text_embedding"]


@dataclass
class TrainBatch:
    """One worker's rows: backbone tokens, pooled image / caption embeddings, ids and captions."""

    image_ids: List[str]
    captions: List[str]
    tokens: torch.Tensor  # [B, n, d] float32 backbone tokens
    image_emb: torch.Tensor  # [B, e]
    text_emb: torch.Tensor  # [B, e]

    def __len__(self) -> int:
        return len(self.image_ids)


def decode_batch(batch: pa.Table | dict, meta: TableMetadata) -> TrainBatch:
    """A pyarrow batch of a raw token table -> TrainBatch (tokens decoded with the table's codec)."""
    table = batch if isinstance(batch, pa.Table) else pa.table(batch)
    missing = [c for c in RAW_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"training needs raw token tables; the batch lacks columns {missing} "
                         "(compressed tables carry no captions)")
    tokens = decode_tokens(table, meta)
    return TrainBatch(
        image_ids=table.column("image_id").to_pylist(),
        captions=table.column("caption").to_pylist(),
        tokens=torch.from_numpy(np.ascontiguousarray(tokens)),
        image_emb=torch.from_numpy(vector_matrix(table.column("image_embedding")).copy()),
        text_emb=torch.from_numpy(vector_matrix(table.column("text_embedding")).copy()),
    )


def gather_batch(batch: TrainBatch) -> TrainBatch:
    """All workers' batches concatenated in rank order (the local batch unchanged when not distributed).

    Tokens travel as fp16 (they are stored as fp16 or coarser anyway). Batches must have the
    same size on every worker (the loader drops the last partial batch).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return batch
    world = dist.get_world_size()

    def cat(t: torch.Tensor, dtype=None) -> torch.Tensor:
        t = t.to(dtype) if dtype is not None else t
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t.contiguous())
        return torch.cat(out).float()

    meta: list = [None] * world
    dist.all_gather_object(meta, (batch.image_ids, batch.captions))
    return TrainBatch(
        image_ids=[i for ids, _ in meta for i in ids],
        captions=[c for _, caps in meta for c in caps],
        tokens=cat(batch.tokens, torch.float16),
        image_emb=cat(batch.image_emb),
        text_emb=cat(batch.text_emb),
    )
