"""A compressed adapter on a query grid: each query pools near its own region, so the compressed tokens are a coarse
cell grid that permutes when the image is mirrored and that the pointer can read; free queries stay the paper's."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_BERT

from edje.model.adapters import CompressionAdapter
from edje.schemas.config import AdapterConfig
from edje.schemas.token_table import TableMetadata
from edje.training.config import ModelSpec
from edje.training.model_init import build_model

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=64,
                     width=32, quantization="fp16", embed_dim=16)


def _adapter(query_grid: float, num_queries: int = 16) -> CompressionAdapter:
    return CompressionAdapter(AdapterConfig(kind="compressed", input_dim=32, output_dim=16, hidden_dim=64,
                                            num_queries=num_queries, num_heads=4, query_grid=query_grid)).eval()


def _mirror(tokens: torch.Tensor, side: int) -> torch.Tensor:
    """Row-major grid tokens [B, side^2, d] mirrored left-right."""
    b, n, d = tokens.shape
    return tokens.view(b, side, side, d).flip(2).reshape(b, n, d)


def test_with_equal_queries_a_mirrored_image_gives_the_mirrored_token_grid():
    torch.manual_seed(0)
    adapter = _adapter(0.5)
    with torch.no_grad():  # the queries' content alike: only the region bias tells them apart
        adapter.query.copy_(adapter.query[:, :1].expand_as(adapter.query))
    x = torch.randn(3, 64, 32)
    with torch.no_grad():
        y, y_mirror = adapter(x), adapter(_mirror(x, 8))
    torch.testing.assert_close(_mirror(y, 4), y_mirror, atol=1e-5, rtol=0)
    assert (y[:, 0] - y[:, 3]).abs().max() > 1e-2  # and the tokens differ: each pools its own region


def test_each_query_attends_mostly_to_its_own_region_and_free_queries_do_not():
    torch.manual_seed(0)
    x = torch.randn(4, 64, 32)

    def own_region_share(adapter):
        q = adapter.query.expand(x.shape[0], -1, -1)
        bias = adapter.region_bias(64)
        _, w = adapter.attention(q, adapter.key(x), adapter.value(x), attn_mask=bias, need_weights=True)
        grid = w.view(4, 4, 4, 8, 8)  # [B, query row, query col, cell row, cell col]
        own = torch.stack([grid[:, i, j, 2 * i:2 * i + 2, 2 * j:2 * j + 2].sum((-1, -2)) for i in range(4) for j in range(4)])
        return own.mean().item()
    with torch.no_grad():
        assert own_region_share(_adapter(0.5)) > 0.2  # 4 of 64 cells would take 1/16 by chance
        assert own_region_share(_adapter(0.0)) < 0.1
    assert _adapter(0.0).region_bias(64) is None


def test_the_query_grid_needs_a_compressed_adapter_with_a_square_number_of_queries():
    with pytest.raises(ValueError, match="square number of queries"):
        AdapterConfig(kind="compressed", input_dim=32, output_dim=16, num_queries=12, num_heads=4, query_grid=0.5)
    with pytest.raises(ValueError, match="query_grid"):
        AdapterConfig(kind="local", input_dim=32, output_dim=16, query_grid=0.5)
    assert AdapterConfig(kind="compressed", input_dim=32, output_dim=16, num_heads=4, num_queries=16,
                         query_grid=0.5).cell_grid
    assert not AdapterConfig(kind="compressed", input_dim=32, output_dim=16, num_heads=4, num_queries=16).cell_grid


def test_a_compressed_student_on_a_query_grid_gets_a_pointer_over_its_tokens():
    relations = dict(relation_roles=True, role_parse="english", route_layer=1, pointer=True, image_positions="fixed")
    tiny = tuple(sorted(TINY_BERT.items()))
    model = build_model(ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=64, adapter_heads=4,
                                  adapter_query_grid=0.5, bert_config=tiny, **relations), META)
    assert model.encoder.pointer.cells.shape == (16, 2)
    tokens = model.adapter(torch.randn(2, 64, 32))
    xy, valid, orders = model.encoder.pointer_readout(["a red circle to the left of a blue square"] * 2, tokens)
    first = [0, xy.shape[1] // 2]  # the first relation's subject and object (subjects come first, then objects)
    assert valid[:, first].all() and ((xy[:, first] >= 0) & (xy[:, first] <= 1)).all()
    assert torch.isfinite(model.encoder.score(["a red circle to the left of a blue square"] * 2, tokens)).all()
    with pytest.raises(ValueError, match="query grid"):
        build_model(ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=64, adapter_heads=4, bert_config=tiny,
                              **relations), META)
