"""Raw token-table batches for training: decode Ray Data (pyarrow) batches, gather them across workers, and find
each image's mirrored copy (tables encoded with --augment hflip) for the flip square."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist

from edje.schemas.token_table import TableMetadata, decode_tokens, read_metadata, read_token_table, vector_matrix

RAW_COLUMNS = ["image_id", "tokens", "image_embedding", "caption", "text_embedding"]


@dataclass
class TrainBatch:
    """One worker's rows: backbone tokens, pooled image / caption embeddings, ids and captions."""

    image_ids: List[str]
    captions: List[str]
    tokens: torch.Tensor  # [B, n, d] float32 backbone tokens
    image_emb: torch.Tensor  # [B, e]
    text_emb: torch.Tensor  # [B, e]
    mirror_tokens: Optional[torch.Tensor] = None  # [B, n, d] each image's mirrored copy (zeros where none)
    has_mirror: Optional[torch.Tensor] = None  # [B] bool

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


def drop_augmented(table: pa.Table) -> pa.Table:
    """The table without its augmented rows (an image's transformed copy is never a training row of its own)."""
    if "augment" not in table.column_names:
        return table
    return table.filter(pc.is_null(table.column("augment")))


class MirrorLookup:
    """Backbone tokens of each image's mirrored copy (rows with augment "hflip"), by the image's id; in memory, one
    copy per image (fp16)."""

    def __init__(self, paths: Sequence[str]):
        self.index: Dict[str, int] = {}
        parts: List[torch.Tensor] = []
        for p in paths:
            meta = read_metadata(p)
            if meta.augment != "hflip":
                continue
            columns = ["source_image_id", "tokens"] + (["token_scales"] if meta.codec.num_scales else [])
            table, _ = read_token_table(p, columns=columns, filters=pc.field("augment") == "hflip")
            rows = []
            for j, image_id in enumerate(table.column("source_image_id").to_pylist()):
                if image_id not in self.index:  # one copy per image (a table with a row per caption repeats it)
                    self.index[image_id] = len(self.index)
                    rows.append(j)
            parts.append(torch.from_numpy(decode_tokens(table.take(pa.array(rows, pa.int64())), meta)).half())
        if not parts:
            raise ValueError(f"none of {list(paths)} holds mirrored rows: encode the images with --augment hflip")
        self.tokens = torch.cat(parts)

    def __len__(self) -> int:
        return len(self.index)

    def get(self, image_ids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, n, d] float32 of each image's mirror, zeros where it has none; found [B] bool)."""
        rows = [self.index.get(i, -1) for i in image_ids]
        found = torch.tensor([r >= 0 for r in rows])
        out = torch.zeros(len(rows), *self.tokens.shape[1:])
        if bool(found.any()):
            out[found] = self.tokens[[r for r in rows if r >= 0]].float()
        return out, found
