"""Adapters from backbone tokens [B, n, d_v] to language-model tokens [B, m, d_lm]."""
from __future__ import annotations

import torch
from torch import nn

from schemas.config import AdapterConfig


class LocalAdapter(nn.Module):
    """EDJE local: a per-token MLP Linear(d_v, hidden) -> GELU -> Linear(hidden, d_lm); keeps all n tokens."""

    def __init__(self, cfg: AdapterConfig):
        super().__init__()
        self.config = cfg
        self.mlp = nn.Sequential(nn.Linear(cfg.input_dim, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, cfg.output_dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(check_tokens(tokens, self.config.input_dim))


class CompressionAdapter(nn.Module):
    """EDJE token compression: m learnable queries attend over K = X W_K, V = X W_V;
    O = H + MLP(LayerNorm(H)); Y = O W_proj (into the language model's width)."""

    def __init__(self, cfg: AdapterConfig):
        super().__init__()
        self.config = cfg
        d = cfg.input_dim
        self.query = nn.Parameter(torch.randn(1, cfg.num_queries, d))
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.attention = nn.MultiheadAttention(d, cfg.num_heads, batch_first=True)
        self.layernorm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, d))
        self.projection = nn.Linear(d, cfg.output_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = check_tokens(tokens, self.config.input_dim)
        query = self.query.expand(x.shape[0], -1, -1)
        h = self.attention(query, self.key(x), self.value(x), need_weights=False)[0]
        o = h + self.mlp(self.layernorm(h))
        return self.projection(o)


def build_adapter(cfg: AdapterConfig) -> nn.Module:
    """The adapter a config names."""
    return LocalAdapter(cfg) if cfg.kind == "local" else CompressionAdapter(cfg)


def check_tokens(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Reject anything but a floating [B, n, width] tensor with a message that names the problem."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 3 or tokens.shape[-1] != width:
        raise ValueError(f"tokens must be [B, n, {width}], got {list(tokens.shape)}")
    if not tokens.is_floating_point():
        raise TypeError(f"tokens must be floating point, got {tokens.dtype}")
    return tokens
