"""Adapters and joint encoder: shapes, position extension, checks; checkpoints round trip."""
import json

import pytest
import torch
from conftest import TINY_BERT

from edje.model.adapters import CompressionAdapter, LocalAdapter
from edje.model.edje import CheckpointError, EDJEModel, load_checkpoint, save_checkpoint
from edje.model.joint_encoder import JointEncoder
from edje.schemas.config import AdapterConfig, EDJEConfig, JointEncoderConfig


@pytest.mark.parametrize("m", [32, 64])
def test_compression_adapter_shapes(m):
    cfg = AdapterConfig(kind="compressed", input_dim=128, output_dim=384, hidden_dim=512, num_queries=m, num_heads=8)
    ad = CompressionAdapter(cfg)
    out = ad(torch.randn(3, 65, 128))
    assert out.shape == (3, m, 384)
    assert ad.query.shape == (1, m, 128)
    assert isinstance(ad.attention, torch.nn.MultiheadAttention) and ad.attention.num_heads == 8


def test_local_adapter_is_a_per_token_mlp_with_8192_hidden_by_default():
    ad = LocalAdapter(AdapterConfig(kind="local", input_dim=96, output_dim=384))
    assert ad.mlp[0].out_features == 8192 and isinstance(ad.mlp[1], torch.nn.GELU)
    x = torch.randn(2, 64, 96)
    out = ad(x)
    assert out.shape == (2, 64, 384)
    # per token: permuting tokens permutes outputs
    perm = torch.randperm(64)
    assert torch.allclose(ad(x[:, perm]), out[:, perm], atol=1e-5)


def test_compressed_tokens_carry_where_their_queries_look():
    """position_out_std > 0: each token gains W_xy x_hat, x_hat the centred cell centre of its head-averaged
    attention; a mirrored grid moves x_hat's x and leaves its y."""
    torch.manual_seed(0)
    cfg = AdapterConfig(kind="compressed", input_dim=32, output_dim=16, hidden_dim=32, num_queries=3, num_heads=4)
    plain = CompressionAdapter(cfg)
    carry = CompressionAdapter(AdapterConfig(**{**cfg.__dict__, "position_out_std": 1.0}))
    missing, unexpected = carry.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["position_out.weight"] and not unexpected
    tokens = torch.randn(2, 16, 32)
    with torch.no_grad():
        _, weights = plain.attention(plain.query.expand(2, -1, -1), plain.key(tokens), plain.value(tokens))
        xy = weights @ torch.stack([(torch.arange(16) % 4 + 0.5) / 4, (torch.arange(16) // 4 + 0.5) / 4], 1).sub(0.5)
        assert torch.allclose(carry(tokens), plain(tokens) + xy @ carry.position_out.weight.T, atol=1e-5)
        mirrored = tokens.view(2, 4, 4, 32).flip(2).reshape(2, 16, 32)
        _, w2 = plain.attention(plain.query.expand(2, -1, -1), plain.key(mirrored), plain.value(mirrored))
    # Attention over the mirrored grid is the same weights, mirrored: x_hat's x flips sign, y stays.
    xy2 = w2 @ torch.stack([(torch.arange(16) % 4 + 0.5) / 4, (torch.arange(16) // 4 + 0.5) / 4], 1).sub(0.5)
    assert torch.allclose(xy2[..., 0], -xy[..., 0], atol=1e-5) and torch.allclose(xy2[..., 1], xy[..., 1], atol=1e-5)
    with pytest.raises(ValueError, match="position_out_std"):
        AdapterConfig(kind="local", input_dim=32, output_dim=16, position_out_std=1.0)


def test_adapters_reject_wrong_shapes():
    ad = CompressionAdapter(AdapterConfig(kind="compressed", input_dim=128, output_dim=64, hidden_dim=32, num_queries=4, num_heads=4))
    with pytest.raises(ValueError, match=r"\[B, n, 128\], got \[2, 65, 96\]"):
        ad(torch.randn(2, 65, 96))
    with pytest.raises(TypeError, match="floating"):
        ad(torch.zeros(2, 65, 128, dtype=torch.long))
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        AdapterConfig(kind="compressed", input_dim=100, output_dim=64, num_heads=8)


@pytest.mark.parametrize("m", [576, 64])
def test_joint_encoder_forward_with_576_and_64_image_tokens(minilm_path, m):
    bert = dict(TINY_BERT, max_position_embeddings=512)
    je = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=bert, num_image_tokens=m, text_embed_dim=32))
    # 64 caption wordpieces + [CLS][SEP][SEP] + m image tokens; 576 exceeds BERT's 512 positions
    assert je.bert.config.max_position_embeddings == max(512, 64 + 3 + m)
    long_caption = " ".join(["red"] * 200)
    texts = [long_caption, "a small blue square"]
    logits = je.score(texts, torch.randn(2, m, 64))
    assert logits.shape == (2,)
    batch = je.tokenize_pairs(texts, m)
    assert int(batch.text_mask[0].sum()) == 64  # captions truncated to 64 wordpieces
    assert int(batch.image_mask.sum(dim=1).min()) == m
    assert bool((batch.token_type_ids[batch.image_mask] == 1).all())
    assert bool((batch.token_type_ids[batch.text_mask] == 0).all())
    lg, labels = je.mlm_logits(texts, torch.randn(2, m, 64), generator=torch.Generator().manual_seed(0))
    assert lg.shape[0] == labels.shape[0] == int(batch.text_mask.sum())
    assert je.text_embedding(texts).shape == (2, 32)


def test_position_extension_keeps_trained_rows(minilm_path):
    je = JointEncoder(JointEncoderConfig(language_model=minilm_path, num_image_tokens=576, text_embed_dim=16))
    w = je.bert.bert.embeddings.position_embeddings.weight
    assert w.shape[0] == 643  # 64 text tokens + 3 specials + 576 image tokens
    # Rows 0-511 are MiniLM's own trained positions, bit for bit; the new rows repeat the last one.
    from transformers import BertModel
    trained = BertModel.from_pretrained(minilm_path).embeddings.position_embeddings.weight
    assert trained.shape[0] == 512
    assert torch.equal(w[:512], trained)
    assert torch.equal(w[512:], trained[-1].expand(643 - 512, -1))


def test_joint_encoder_rejects_bad_inputs(minilm_path):
    je = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, num_image_tokens=16, text_embed_dim=8))
    with pytest.raises(ValueError, match="takes 16 image tokens, got 32"):
        je.score(["a"], torch.randn(1, 32, 64))
    with pytest.raises(ValueError, match="384 wide; this joint encoder is 64 wide"):
        je.score(["a"], torch.randn(1, 16, 384))
    with pytest.raises(ValueError, match="2 texts but 1 token matrices"):
        je.score(["a", "b"], torch.randn(1, 16, 64))
    with pytest.raises(TypeError, match="strings"):
        je.score([None], torch.randn(1, 16, 64))


def test_checkpoint_round_trip_and_mismatch(tmp_path, tiny_edje_config):
    model = EDJEModel(tiny_edje_config).eval()
    save_checkpoint(model, str(tmp_path / "ckpt"))
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["config.json", "model.safetensors", "tokenizer"]
    loaded = load_checkpoint(str(tmp_path / "ckpt"), expected=tiny_edje_config)
    x = torch.randn(2, 65, 128)
    texts = ["a red circle", "a blue star"]
    with torch.no_grad():
        assert torch.allclose(model.score_backbone_tokens(texts, x), loaded.score_backbone_tokens(texts, x), atol=1e-6)
    assert loaded.adapter_hash() == model.adapter_hash()
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["adapter_hash"] == model.adapter_hash()
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["bert_config"]["hidden_size"] == 64
    save_checkpoint(model, str(tmp_path / "half"), dtype=torch.float16)
    half = load_checkpoint(str(tmp_path / "half"))
    assert (tmp_path / "half" / "model.safetensors").stat().st_size < 0.6 * (tmp_path / "ckpt" / "model.safetensors").stat().st_size
    assert next(half.parameters()).dtype == torch.float32
    # tables written with the loaded (fp16-rounded) adapter must match the hash the checkpoint records
    assert json.loads((tmp_path / "half" / "config.json").read_text())["adapter_hash"] == half.adapter_hash()
    with torch.no_grad():
        assert torch.allclose(model.score_backbone_tokens(texts, x), half.score_backbone_tokens(texts, x), atol=5e-2)

    other = EDJEConfig(tiny_edje_config.backbone,
                       AdapterConfig(**{**tiny_edje_config.adapter.__dict__, "num_queries": 32}),
                       JointEncoderConfig(**{**tiny_edje_config.encoder.__dict__, "num_image_tokens": 32}))
    with pytest.raises(CheckpointError, match="adapter.num_queries: 16 != 32"):
        load_checkpoint(str(tmp_path / "ckpt"), expected=other)
    # weights that do not fit the config: a config edited after the fact
    cfg_path = tmp_path / "ckpt" / "config.json"
    meta = json.loads(cfg_path.read_text())
    meta["config"]["adapter"]["hidden_dim"] = 512
    cfg_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"adapter\.mlp\.0\.(bias|weight) has shape \[256"):
        load_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="not an EDJE checkpoint"):
        load_checkpoint(str(tmp_path))


def test_a_student_built_on_a_copied_encoder_feeds_it_at_its_width(tiny_edje_config, tmp_path):
    """jobs/distill.py copies the teacher's encoder: the student's adapter must output that encoder's width,
    not the default language model's (384) that the command line's (absent) BERT flags imply."""
    from edje.schemas.token_table import TableMetadata
    from edje.training.config import ModelSpec
    from edje.training.model_init import build_model

    teacher = EDJEModel(tiny_edje_config)
    save_checkpoint(teacher, str(tmp_path / "teacher"))
    meta = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer=teacher.config.backbone.feature_layer,
                         num_tokens=65, width=128, quantization="fp16", embed_dim=128)
    student = build_model(ModelSpec(adapter="compressed", num_queries=8, adapter_hidden=64, adapter_heads=4), meta,
                          init_encoder_from=str(tmp_path / "teacher"))
    assert student.config.adapter.output_dim == student.encoder.hidden_size == 64
    assert torch.equal(student.encoder.bert.bert.embeddings.word_embeddings.weight,
                       teacher.encoder.bert.bert.embeddings.word_embeddings.weight)
    out = student.adapter(torch.randn(2, 65, 128))
    assert out.shape == (2, 8, 64)
    assert student.encoder.score(["a red circle", "a blue square"], out).shape == (2,)
