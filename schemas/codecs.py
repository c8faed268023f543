"""Token codecs: a [n, d] token matrix <-> one byte blob (+ fp16 scales), numpy and torch paths.

The blob layout is the stored format of every token table, so it lives with the table schema; the
torch twin is the same format computed where the tokens are (a GPU), bit-identical to numpy.

fp16 / fp32: plain little-endian values, no scales.
int8: symmetric, one scale per token (row): q = round(x / s), s = max|x| / 127.
int4: symmetric, q in [-7, 7] stored as q + 8, two values per byte (low nibble first),
      one scale per token or per group of `group_size` values along the width.
Scales are stored as fp16 (2 bytes each) so that int8 64x384 fits in 24,704 bytes and
int4 in 12,416; they are rounded *up* to the next fp16 so that no value clips and the
round-trip error stays within half a quantization step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np

from edje.schemas.config import CodecConfig

if TYPE_CHECKING:  # the torch path imports torch where it runs: readers and writers of tables never need it
    import torch

QMAX = {"int8": 127, "int4": 7}


class CodecError(ValueError):
    """A token matrix or blob does not fit the codec it is used with."""


@dataclass(frozen=True)
class TokenCodec:
    """Encodes batches of [n, d] token matrices to fixed-size byte blobs and back."""

    config: CodecConfig
    num_tokens: int
    width: int

    def __post_init__(self) -> None:
        if self.config.quantization == "int4":
            if self.width % 2:
                raise CodecError(f"int4 needs an even width, got {self.width}")
            g = self.group_size
            if self.width % g:
                raise CodecError(f"int4 group_size {g} does not divide width {self.width}")

    @property
    def quantization(self) -> str:
        return self.config.quantization

    @property
    def group_size(self) -> int:
        """Values per scale along the width (the whole row for int8 and per-token int4)."""
        return self.config.group_size or self.width

    @property
    def blob_bytes(self) -> int:
        """Bytes of one row's token blob."""
        n, d = self.num_tokens, self.width
        return {"fp32": 4 * n * d, "fp16": 2 * n * d, "int8": n * d, "int4": n * d // 2}[self.quantization]

    @property
    def num_scales(self) -> int:
        """fp16 scales per row (0 for float codecs)."""
        if self.quantization in ("fp32", "fp16"):
            return 0
        return self.num_tokens * (self.width // self.group_size)

    @property
    def bytes_per_image(self) -> int:
        """Stored bytes of one token matrix: blob plus scales."""
        return self.blob_bytes + 2 * self.num_scales

    # ------------------------------------------------------------------ numpy
    def encode(self, tokens: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """[B, n, d] float -> (uint8 [B, blob_bytes], fp16 [B, num_scales] or None)."""
        x = self._check(np.asarray(tokens))
        b = x.shape[0]
        q = self.quantization
        if q in ("fp32", "fp16"):
            dt = np.float32 if q == "fp32" else np.float16
            return np.ascontiguousarray(x.astype("<" + np.dtype(dt).str[1:])).view(np.uint8).reshape(b, -1), None
        groups = x.astype(np.float32).reshape(b, self.num_tokens, -1, self.group_size)
        scale = _np_scales(np.abs(groups).max(axis=-1), QMAX[q])  # [B, n, G] fp16
        values = np.clip(np.rint(groups / scale.astype(np.float32)[..., None]), -QMAX[q], QMAX[q]).astype(np.int8)
        if q == "int8":
            blob = values.reshape(b, -1).view(np.uint8)
        else:
            nib = (values.reshape(b, -1, 2) + 8).astype(np.uint8)
            blob = nib[..., 0] | (nib[..., 1] << 4)
        return np.ascontiguousarray(blob), scale.reshape(b, -1)

    def decode(self, blob: np.ndarray, scales: Optional[np.ndarray] = None) -> np.ndarray:
        """(uint8 [B, blob_bytes], fp16 [B, num_scales]) -> float32 [B, n, d]."""
        blob = np.asarray(blob, dtype=np.uint8)
        if blob.ndim != 2 or blob.shape[1] != self.blob_bytes:
            raise CodecError(f"{self.quantization} blob must be [B, {self.blob_bytes}] bytes, got {blob.shape}")
        b, q = blob.shape[0], self.quantization
        if q in ("fp32", "fp16"):
            dt = "<f4" if q == "fp32" else "<f2"
            return blob.view(dt).astype(np.float32).reshape(b, self.num_tokens, self.width)
        scales = self._check_scales(scales, b)
        if q == "int8":
            values = blob.view(np.int8).astype(np.float32)
        else:
            values = np.stack([(blob & 0x0F), (blob >> 4)], axis=-1).astype(np.float32).reshape(b, -1) - 8.0
        groups = values.reshape(b, self.num_tokens, -1, self.group_size)
        out = groups * scales.astype(np.float32).reshape(b, self.num_tokens, -1, 1)
        return out.reshape(b, self.num_tokens, self.width)

    # ------------------------------------------------------------------ torch
    def encode_torch(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Torch twin of `encode` (runs on the tokens' device); returns uint8 and fp16 tensors."""
        import torch

        x = self._check(tokens)
        b, q = x.shape[0], self.quantization
        if q in ("fp32", "fp16"):
            dt = torch.float32 if q == "fp32" else torch.float16
            return x.to(dt).contiguous().view(torch.uint8).reshape(b, -1), None
        groups = x.float().reshape(b, self.num_tokens, -1, self.group_size)
        scale = _torch_scales(groups.abs().amax(dim=-1), QMAX[q])
        values = torch.clamp(torch.round(groups / scale.float()[..., None]), -QMAX[q], QMAX[q]).to(torch.int8)
        if q == "int8":
            blob = values.reshape(b, -1).view(torch.uint8)
        else:
            nib = (values.reshape(b, -1, 2) + 8).to(torch.uint8)
            blob = nib[..., 0] | (nib[..., 1] << 4)
        return blob.contiguous(), scale.reshape(b, -1)

    def decode_torch(self, blob: torch.Tensor, scales: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Torch twin of `decode`: uint8 [B, blob_bytes] (+ fp16 scales) -> float32 [B, n, d]."""
        import torch

        if blob.dtype != torch.uint8 or blob.dim() != 2 or blob.shape[1] != self.blob_bytes:
            raise CodecError(f"{self.quantization} blob must be uint8 [B, {self.blob_bytes}], got "
                             f"{blob.dtype} {tuple(blob.shape)}")
        b, q = blob.shape[0], self.quantization
        if q in ("fp32", "fp16"):
            dt = torch.float32 if q == "fp32" else torch.float16
            return blob.contiguous().view(dt).float().reshape(b, self.num_tokens, self.width)
        scales = self._check_scales(scales, b)
        if q == "int8":
            values = blob.contiguous().view(torch.int8).float()
        else:
            values = torch.stack([blob & 0x0F, blob >> 4], dim=-1).float().reshape(b, -1) - 8.0
        groups = values.reshape(b, self.num_tokens, -1, self.group_size)
        out = groups * scales.float().reshape(b, self.num_tokens, -1, 1)
        return out.reshape(b, self.num_tokens, self.width)

    # ---------------------------------------------------------------- checks
    def _check(self, x):
        shape = tuple(x.shape)
        if len(shape) != 3 or shape[1:] != (self.num_tokens, self.width):
            raise CodecError(f"token matrices must be [B, {self.num_tokens}, {self.width}], got {list(shape)}")
        floating = np.issubdtype(x.dtype, np.floating) if isinstance(x, np.ndarray) else x.is_floating_point()
        if not floating:
            raise CodecError(f"token matrices must be floating point, got {x.dtype}")
        return x

    def _check_scales(self, scales, b: int):
        if scales is None:
            raise CodecError(f"{self.quantization} decode needs scales")
        if tuple(scales.shape) != (b, self.num_scales):
            raise CodecError(f"scales must be [{b}, {self.num_scales}], got {list(scales.shape)}")
        return scales


def _np_scales(absmax: np.ndarray, qmax: int) -> np.ndarray:
    """fp16 scales >= absmax / qmax (rounded up so nothing clips); zero rows get scale 1."""
    s = (absmax / qmax).astype(np.float16)
    too_small = s.astype(np.float32) * qmax < absmax
    s = np.where(too_small, np.nextafter(s, np.float16(np.inf)), s)
    return np.where(s > 0, s, np.float16(1.0)).astype(np.float16)


def _torch_scales(absmax: torch.Tensor, qmax: int) -> torch.Tensor:
    """Torch twin of `_np_scales`, bit-identical."""
    import torch

    s = (absmax / qmax).to(torch.float16)
    too_small = s.float() * qmax < absmax
    s = torch.where(too_small, torch.nextafter(s, torch.tensor(float("inf"), dtype=torch.float16, device=s.device)), s)
    return torch.where(s > 0, s, torch.ones_like(s))


def bytes_per_image(num_tokens: int, width: int, quantization: str, group_size: Optional[int] = None) -> int:
    """Stored bytes of one [num_tokens, width] matrix under a codec."""
    return TokenCodec(CodecConfig(quantization, group_size), num_tokens, width).bytes_per_image


def main(argv=None) -> None:
    """Print the stored bytes per image of a token matrix under every codec."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m edje.schemas.codecs", description=main.__doc__)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per image (m)")
    ap.add_argument("--width", type=int, default=384, help="token width (the language model's width)")
    ap.add_argument("--group-size", type=int, default=128, help="int4 scale group size for the grouped row")
    args = ap.parse_args(argv)
    rows = [("fp32", None), ("fp16", None), ("int8", None), ("int4", None), ("int4", args.group_size)]
    print(f"{'codec':<22}{'bytes/image':>14}")
    for quant, group in rows:
        name = quant + (f" (group {group})" if group else " (per token)" if quant in ("int8", "int4") else "")
        print(f"{name:<22}{bytes_per_image(args.tokens, args.width, quant, group):>14,}")


if __name__ == "__main__":
    main()
