"""The one image -> stored-row step: frozen backbone, optional EDJE adapter, token codec.

The encode job's actors, live images in a serving replica, evaluation's raw tables and the
Python API's `encode_images` all run this class, so one image gives the same stored bytes
whichever path encoded it. `TokenCompressor` is its second half alone (adapter + codec over
tokens a raw table stored), the step `edje compress` runs; both go through `adapt`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from edje.model.backbone import VisionBackbone
from edje.schemas.codecs import TokenCodec
from edje.schemas.config import BackboneConfig, CodecConfig

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class EncodedImages:
    """Encoded rows: token blobs (uint8 [B, bytes]), scales (fp16 [B, s] or None), pooled embeddings [B, e]."""

    blob: np.ndarray
    scales: Optional[np.ndarray]
    embeddings: np.ndarray

    def take(self, rows: Sequence[int]) -> "EncodedImages":
        """Some rows, in the given order."""
        rows = np.asarray(rows, dtype=np.int64)
        return EncodedImages(self.blob[rows], None if self.scales is None else self.scales[rows], self.embeddings[rows])


def exact_fp32(device: torch.device, compute_dtype: str) -> None:
    """Keep fp32 arithmetic fp32 on a GPU: cuDNN convolutions and matmuls default to TF32 (10-bit mantissa)."""
    if device.type == "cuda" and compute_dtype == "fp32":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


def adapt(adapter: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The adapter over backbone tokens, in the adapter's own parameter dtype (a serving replica may hold it
    in bf16/fp16, the backbone in fp32); call it under the caller's autocast."""
    return adapter(tokens.to(next(adapter.parameters()).dtype))


class TokenEncoder:
    """Backbone (+ adapter) + codec on one device; `encode(pixels)` gives the rows a token table stores."""

    def __init__(self, backbone: VisionBackbone, adapter: Optional[torch.nn.Module], codec: CodecConfig,
                 device: torch.device, compute_dtype: str = "fp32"):
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {compute_dtype!r}")
        self.backbone, self.device = backbone.to(device), torch.device(device)
        self.adapter = adapter.to(device).eval().requires_grad_(False) if adapter is not None else None
        self.compute_dtype = COMPUTE_DTYPES[compute_dtype]
        n, d = backbone.token_shape
        if self.adapter is not None:
            if self.adapter.config.input_dim != d:
                raise ValueError(f"adapter takes {self.adapter.config.input_dim}-wide tokens, "
                                 f"backbone {backbone.config.name} gives {d}")
            n, d = self.adapter.config.output_tokens(n), self.adapter.config.output_dim
        self.num_tokens, self.width = int(n), int(d)
        self.codec = TokenCodec(codec, self.num_tokens, self.width)
        exact_fp32(self.device, compute_dtype)  # the patch stem would otherwise round like fp16

    @classmethod
    def create(cls, backbone: BackboneConfig, adapter: Optional[torch.nn.Module], codec: CodecConfig,
               device: torch.device | str = "cpu", compute_dtype: str = "fp32") -> "TokenEncoder":
        """Build the backbone a config names, on `device`."""
        return cls(VisionBackbone.create(backbone, device=device), adapter, codec, torch.device(device), compute_dtype)

    @property
    def image_size(self) -> int:
        """Side of the square uint8 images `encode` takes."""
        return self.backbone.preprocess.size

    @torch.inference_mode()
    def tokens(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 tokens [B, n, d] after the adapter, float32 pooled embeddings [B, e]) of uint8 [B, S, S, 3]."""
        pixels = pixels.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32):
            tokens, emb = self.backbone.encode(pixels)
            if self.adapter is not None:
                tokens = adapt(self.adapter, tokens)
        return tokens.float(), emb.float()

    @torch.inference_mode()
    def encode(self, pixels: np.ndarray | torch.Tensor) -> EncodedImages:
        """uint8 images [B, S, S, 3] -> stored rows: codec blobs, fp16 scales, pooled embeddings."""
        if isinstance(pixels, np.ndarray):
            pixels = torch.from_numpy(np.ascontiguousarray(pixels))
        tokens, emb = self.tokens(pixels)
        blob, scales = self.codec.encode_torch(tokens)
        return EncodedImages(blob.cpu().numpy(), None if scales is None else scales.cpu().numpy().astype("<f2"),
                             emb.cpu().numpy())

    @torch.inference_mode()
    def encode_text(self, texts: Sequence[str]) -> np.ndarray:
        """The backbone's normalised text embeddings [len(texts), e] (float32)."""
        return self.backbone.encode_text(list(texts)).float().cpu().numpy()


class TokenCompressor:
    """Adapter + codec on one device: the float tokens a raw table stores -> compressed rows (blob, scales)."""

    def __init__(self, adapter: torch.nn.Module, codec: CodecConfig, input_tokens: int,
                 device: torch.device | str = "cpu", compute_dtype: str = "fp32"):
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {compute_dtype!r}")
        self.device = torch.device(device)
        self.adapter = adapter.to(self.device).eval().requires_grad_(False)
        self.compute_dtype = COMPUTE_DTYPES[compute_dtype]
        self.num_tokens = int(self.adapter.config.output_tokens(input_tokens))
        self.width = int(self.adapter.config.output_dim)
        self.codec = TokenCodec(codec, self.num_tokens, self.width)
        exact_fp32(self.device, compute_dtype)

    @torch.inference_mode()
    def encode(self, tokens: np.ndarray | torch.Tensor) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """float tokens [B, n, d] -> (codec blobs uint8 [B, bytes], fp16 scales [B, s] or None)."""
        if isinstance(tokens, np.ndarray):
            tokens = torch.from_numpy(np.ascontiguousarray(tokens))
        tokens = tokens.to(self.device, torch.float32, non_blocking=True)
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32):
            out = adapt(self.adapter, tokens)
        blob, scales = self.codec.encode_torch(out.float())
        return blob.cpu().numpy(), None if scales is None else scales.cpu().numpy().astype("<f2")
