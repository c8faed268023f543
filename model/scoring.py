"""The one reranking core: ITM logits of (text, stored tokens) pairs, fused and calibrated by the checkpoint's rule.

Evaluation, the Serve reranker, the HTTP ingress and the Python API (`edje.EDJEReranker`) all score
through `PairScorer` and rank through its `RankingConfig` (model/ranking.py), so one pair gets one
score whichever door it came in by. Nothing here imports Ray.
"""
from __future__ import annotations

from typing import Callable, Hashable, List, Optional, Sequence

import numpy as np
import torch

from edje.model.device import pick_device
from edje.model.edje import EDJEModel, load_checkpoint
from edje.model.ranking import RankingConfig, read_ranking
from edje.schemas.token_table import TableMetadata, TableMismatchError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' = fp32 on CPU and bf16 on GPU (the paper's inference precision; tolerance in ARCHITECTURE.md)."""
    if precision == "auto":
        return "bf16" if torch.device(device).type == "cuda" else "fp32"
    if precision not in DTYPES:
        raise ValueError(f"precision must be 'auto' or one of {sorted(DTYPES)}, got {precision!r}")
    return precision


def decode_blobs(meta: TableMetadata, blob: np.ndarray, scales: Optional[np.ndarray],
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Decode gathered token blobs with the table's codec on `device` (the compressed bytes are what travel)."""
    b = torch.from_numpy(_writable(blob)).to(device)
    s = torch.from_numpy(_writable(scales)).to(device) if scales is not None else None
    return meta.codec.decode_torch(b, s)


def check_tables(model: EDJEModel, meta: TableMetadata) -> None:
    """Refuse stored tokens that this model's encoder cannot read (compressed by another adapter, other backbone)."""
    if meta.kind == "compressed":
        if meta.adapter_hash != model.adapter_hash():
            raise TableMismatchError("adapter_hash", meta.adapter_hash, model.adapter_hash())
    elif model.config.adapter.input_dim != meta.width or model.config.backbone.name != meta.backbone:
        raise TableMismatchError("backbone", f"{meta.backbone} ({meta.width} wide)",
                                 f"{model.config.backbone.name} ({model.config.adapter.input_dim} wide)")


class PairScorer:
    """A checkpoint's joint encoder on one device and precision, with its ranking rule."""

    def __init__(self, model: EDJEModel, ranking: RankingConfig, device: torch.device | str | None = None,
                 precision: str = "fp32", batch_size: int = 256):
        self.device = pick_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.dtype = DTYPES[self.precision]
        self.model = model.to(self.device, self.dtype).eval()
        self.ranking, self.batch_size = ranking, batch_size

    @classmethod
    def from_checkpoint(cls, checkpoint: str, device: torch.device | str | None = None, precision: str = "fp32",
                        batch_size: int = 256) -> "PairScorer":
        """Load a checkpoint folder (any fsspec path) and its recorded ranking rule."""
        model = load_checkpoint(checkpoint, map_location=str(pick_device(device)))
        return cls(model, read_ranking(checkpoint), device, precision, batch_size)

    @torch.inference_mode()
    def encoder_tokens(self, meta: TableMetadata, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens the joint encoder reads: stored compressed tokens as they are, raw backbone tokens through the adapter."""
        check_tables(self.model, meta)
        tokens = tokens.to(self.device, self.dtype)
        if meta.kind == "compressed":
            return tokens
        return torch.cat([self.model.adapter(tokens[i:i + self.batch_size]) for i in range(0, len(tokens), self.batch_size)])

    @torch.inference_mode()
    def itm_logits(self, texts: Sequence[str], tokens: torch.Tensor, image_index: Optional[np.ndarray] = None,
                   progress: Optional[Callable[[int], None]] = None, batch_size: Optional[int] = None) -> np.ndarray:
        """ITM logits (float32) of (texts[i], tokens[image_index[i]]) (image_index None: tokens[i]), in batches
        of `batch_size` (default: the scorer's); `progress(pairs done)` after each batch."""
        step = batch_size or self.batch_size
        if image_index is None:
            if len(texts) != len(tokens):
                raise ValueError(f"{len(texts)} texts but {len(tokens)} token rows")
            image_index = np.arange(len(texts))
        out: List[np.ndarray] = []
        for i in range(0, len(texts), step):
            idx = torch.from_numpy(np.asarray(image_index[i:i + step], dtype=np.int64)).to(tokens.device)
            rows = tokens[idx].to(self.device, self.dtype)
            out.append(self.model.encoder.score(list(texts[i:i + step]), rows).float().cpu().numpy())
            if progress is not None:
                progress(min(i + step, len(texts)))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def blob_logits(self, meta: TableMetadata, texts: Sequence[str], blob: np.ndarray, scales: Optional[np.ndarray],
                    batch_size: Optional[int] = None, progress: Optional[Callable[[int], None]] = None) -> np.ndarray:
        """ITM logits of texts against gathered stored rows (blobs + scales of a compressed table)."""
        return self.itm_logits(texts, decode_blobs(meta, blob, scales, self.device), progress=progress,
                               batch_size=batch_size)

    def scores(self, itm_logits: np.ndarray, similarity: Optional[np.ndarray] = None,
               queries: Optional[Sequence[Hashable]] = None) -> np.ndarray:
        """Ranking scores under the checkpoint's rule: the ITM logit, plus w x first-stage cosine when it fuses
        (`queries`: each pair's query, where pairs of several queries lie in one array; RankingConfig.fuse)."""
        if self.ranking.fuses and similarity is None:
            raise ValueError("this checkpoint ranks by ITM + w x first-stage cosine: pass the first-stage similarities")
        return self.ranking.fuse(itm_logits, similarity, queries) if similarity is not None else itm_logits

    def relevance(self, scores: np.ndarray) -> np.ndarray:
        """Calibrated probability that each pair matches (sigmoid(a x score + b); sigmoid(score) if not calibrated)."""
        return self.ranking.probability(scores)


def _writable(a: np.ndarray) -> np.ndarray:
    # Arrays that arrive through Ray's object store are read-only views; torch wants writable memory.
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()
