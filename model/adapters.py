"""Adapters from backbone tokens [B, n, d_v] to language-model tokens [B, m, d_lm]."""
from __future__ import annotations

import torch
from torch import nn

from edje.model.pointer import cell_centres
from edje.schemas.config import AdapterConfig


def grid_position(num_tokens: int, width: int) -> torch.Tensor:
    """[num_tokens, width] fixed 2-D sine-cosine embedding of row-major cells of a square grid: half the
    channels encode the column, half the row, each at geometric frequencies (MAE's 2-D sin-cos)."""
    side = int(round(num_tokens ** 0.5))
    if side * side != num_tokens or width % 4:
        raise ValueError(f"2-D positions need a square token grid and a width divisible by 4, got {num_tokens} x {width}")
    quarter = width // 4
    freq = 1.0 / (100.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    coord = torch.arange(side, dtype=torch.float32)
    row, col = torch.meshgrid(coord, coord, indexing="ij")

    def embed(x: torch.Tensor) -> torch.Tensor:
        angles = x.reshape(-1, 1) * freq
        return torch.cat([angles.sin(), angles.cos()], dim=1)
    return torch.cat([embed(col), embed(row)], dim=1) / (width / 2) ** 0.5  # unit norm per cell


class GridPosition(nn.Module):
    """Adds gain x `grid_position` to backbone tokens; the gain is learned because token norms differ
    by backbone (unit-norm scene tokens, ViT outputs of norm ~sqrt(width)). The table is rebuilt for
    the token count seen, not stored."""

    def __init__(self, width: int, gain: float = 1.0):
        super().__init__()
        self.width = width
        self.gain = nn.Parameter(torch.tensor(float(gain)))
        self.table: torch.Tensor | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        if self.table is None or self.table.shape[0] != n or self.table.device != tokens.device:
            self.table = grid_position(n, self.width).to(tokens.device)
        return tokens + (self.gain * self.table).to(tokens.dtype)


class LocalAdapter(nn.Module):
    """EDJE local: a per-token MLP Linear(d_v, hidden) -> GELU -> Linear(hidden, d_lm); keeps all n tokens."""

    def __init__(self, cfg: AdapterConfig):
        super().__init__()
        self.config = cfg
        self.mlp = nn.Sequential(nn.Linear(cfg.input_dim, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, cfg.output_dim))
        self.position = GridPosition(cfg.input_dim, cfg.position_gain) if cfg.position == "2d" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = check_tokens(tokens, self.config.input_dim)
        return self.mlp(self.position(x) if self.position is not None else x)


class CompressionAdapter(nn.Module):
    """EDJE token compression: m learnable queries attend over K = X W_K, V = X W_V;
    O = H + MLP(LayerNorm(H)); Y = O W_proj (into the language model's width), plus, with position_out_std > 0,
    W_xy x_hat: x_hat the centred grid cell centre each query's attention (mean over heads) expects. With
    query_grid > 0 the queries sit on a square grid and each one's attention is biased towards its own region."""

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
        self.position = GridPosition(d, cfg.position_gain) if cfg.position == "2d" else None
        self.position_out = None
        if cfg.position_out_std > 0:
            self.position_out = nn.Linear(2, cfg.output_dim, bias=False)
            nn.init.normal_(self.position_out.weight, std=cfg.position_out_std)
        self.cell_decoder = CellDecoder(cfg.output_dim, cfg.recover_cells) if cfg.recover_cells > 0 else None
        self._bias: dict = {}  # query-grid attention bias by number of backbone cells, rebuilt never stored

    def region_bias(self, num_cells: int) -> torch.Tensor | None:
        """[num_queries, num_cells] additive attention logits that keep each query of the grid near its region."""
        if self.config.query_grid <= 0:
            return None
        if num_cells not in self._bias:
            q, k = cell_centres(self.config.num_queries), cell_centres(num_cells)
            sigma = self.config.query_grid / self.config.num_queries ** 0.5
            self._bias[num_cells] = -torch.cdist(q, k).square() / (2 * sigma ** 2)
        return self._bias[num_cells]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = check_tokens(tokens, self.config.input_dim)
        if self.position is not None:
            x = self.position(x)
        query = self.query.expand(x.shape[0], -1, -1)
        want = self.position_out is not None
        bias = self.region_bias(x.shape[1])
        h, weights = self.attention(query, self.key(x), self.value(x), need_weights=want, average_attn_weights=True,
                                    attn_mask=None if bias is None else bias.to(x.device, x.dtype))
        o = h + self.mlp(self.layernorm(h))
        y = self.projection(o)
        if want:
            centred = (cell_centres(x.shape[1]) - 0.5).to(weights.device, weights.dtype)
            y = y + self.position_out(weights @ centred)
        return y

    def recover_cells(self, compressed: torch.Tensor) -> torch.Tensor:
        """The cell decoder's rebuild [B, cells, d_lm] of a local adapter's tokens from this adapter's output."""
        if self.cell_decoder is None:
            raise ValueError("this adapter has no cell decoder (recover_cells=0)")
        return self.cell_decoder(compressed)


class CellDecoder(nn.Module):
    """Learned cell queries attend over the compressed tokens; a linear map gives each cell's token."""

    def __init__(self, width: int, cells: int, heads: int = 4):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, cells, width))
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.out = nn.Linear(width, width)

    def forward(self, compressed: torch.Tensor) -> torch.Tensor:
        query = self.query.expand(compressed.shape[0], -1, -1)
        return self.out(self.attention(query, compressed, compressed, need_weights=False)[0])


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
