"""The global-vector ITM baseline (JointEncoderConfig.itm_input="global"): BERT over the caption
alone, the image as one vector (the mean of the adapter's tokens) fused with the text [CLS]."""
from __future__ import annotations

import json

import pytest
import torch

from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint
from edje.schemas.config import AdapterConfig, BackboneConfig, EDJEConfig, JointEncoderConfig, from_dict
from edje.training.masking import PieceGroups, WordGroups

BERT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=30522,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
CAPTIONS = ["a large red circle to the left of a small blue square",
            "there is a little violet disc and, to its right, a big green plus sign",
            "a large red circle to the left of a small blue square"]
N, D = 9, 16  # backbone tokens per image (a 3 x 3 grid), their width

from edje.sampleworld.grounding import NOUN_WORDS  # noqa: E402

VOCAB = tuple(sorted(NOUN_WORDS))  # the diagnostic role parse's word list


def _config(minilm_path, itm_input: str, word_context: int = 3) -> EDJEConfig:
    return EDJEConfig(
        backbone=BackboneConfig("edje-tiny-convvit"),
        adapter=AdapterConfig(kind="local", input_dim=D, output_dim=32, hidden_dim=48),
        encoder=JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, num_image_tokens=N, text_embed_dim=8,
                                   word_context=word_context, itm_input=itm_input))


def _model(minilm_path, itm_input: str) -> EDJEModel:
    torch.manual_seed(0)
    model = EDJEModel(_config(minilm_path, itm_input), load_language_model=False).eval()
    with torch.no_grad():  # zero-initialised layers (word context, MLM fusion) would hide what they read
        for p in model.parameters():
            if not p.abs().sum():
                p.normal_(0, 0.05)
    return model


@pytest.fixture(scope="module")
def global_model(minilm_path):
    return _model(minilm_path, "global")


@pytest.fixture(scope="module")
def token_model(minilm_path):
    return _model(minilm_path, "tokens")


@pytest.fixture(scope="module")
def images():
    return torch.randn(len(CAPTIONS), N, D, generator=torch.Generator().manual_seed(1))


def test_the_global_option_scores_pairs_one_logit_each(global_model, images):
    enc = global_model.encoder
    assert enc.global_itm and enc.mlm_fusion is not None
    with torch.no_grad():
        logits = global_model.score_backbone_tokens(CAPTIONS, images)
    assert logits.shape == (len(CAPTIONS),) and torch.isfinite(logits).all()
    # The same caption with the same image scores the same (distinct captions run through BERT once).
    with torch.no_grad():
        again = global_model.score_backbone_tokens(CAPTIONS, images[[0, 1, 0]])
    assert torch.allclose(again[0], again[2], atol=1e-6) and torch.allclose(again[0], logits[0], atol=1e-6)
    # The image does reach the logit.
    with torch.no_grad():
        other = global_model.score_backbone_tokens(CAPTIONS, images.flip(0))
    assert not torch.allclose(other, logits)


def test_global_mode_is_blind_to_the_order_of_the_image_tokens_the_token_mode_is_not(global_model, token_model, images):
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        g, g_perm = (global_model.score_backbone_tokens(CAPTIONS, x) for x in (images, images[:, perm]))
        t, t_perm = (token_model.score_backbone_tokens(CAPTIONS, x) for x in (images, images[:, perm]))
    # Only the mean of the adapter's tokens is read: no token-level access.
    assert torch.allclose(g, g_perm, atol=1e-5), (g, g_perm)
    # The joint encoder reads each token at its own position.
    assert (t - t_perm).abs().max() > 1e-3, (t, t_perm)


def test_global_mlm_reads_the_image_vector_and_never_the_token_order(global_model, images):
    enc = global_model.encoder
    groups = PieceGroups(WordGroups.sample_world(), enc.tokenizer)
    tokens = global_model.adapter(images)

    def run(x):
        return enc.mlm_logits(CAPTIONS, x, mask_policy=groups.mask_policy, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, labels = run(tokens)
        logits_perm, labels_perm = run(tokens[:, torch.randperm(N, generator=torch.Generator().manual_seed(4))])
        logits_other, _ = run(tokens.flip(0))
    assert logits.shape == (len(labels), enc.bert.config.vocab_size) and (labels != -100).any()
    assert torch.equal(labels, labels_perm) and torch.allclose(logits, logits_perm, atol=1e-4)
    assert not torch.allclose(logits, logits_other)  # conditioned on the image vector
    # Text-only layout: the masked words are caption words, found via the same group policy as the token mode.
    masked_words = set(enc.tokenizer.convert_ids_to_tokens(labels[labels != -100].tolist()))
    assert masked_words <= set(enc.tokenizer.tokenize(" ".join(CAPTIONS)))


def test_global_mode_trains_through_score_and_mlm(minilm_path, images):
    model = _model(minilm_path, "global").train()
    enc = model.encoder
    tokens = model.adapter(images)
    loss = enc.score(CAPTIONS, tokens).sum() + enc.mlm_logits(CAPTIONS, tokens)[0].logsumexp(-1).sum()
    loss.backward()
    for name in ("itm_head.mlp.0.weight", "itm_head.image_proj.weight", "mlm_fusion.mlp.2.weight"):
        assert dict(enc.named_parameters())[name].grad.abs().sum() > 0, name
    assert model.adapter.mlp[0].weight.grad.abs().sum() > 0  # the adapter shapes the image vector


def test_global_mode_round_trips_through_a_checkpoint(global_model, images, tmp_path):
    save_checkpoint(global_model, str(tmp_path / "ckpt"))
    stored = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert stored["config"]["encoder"]["itm_input"] == "global"
    loaded = load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded.encoder.global_itm
    with torch.no_grad():
        assert torch.allclose(loaded.score_backbone_tokens(CAPTIONS, images),
                              global_model.score_backbone_tokens(CAPTIONS, images), atol=1e-6)


def test_configs_and_checkpoints_without_the_field_are_the_token_mode(minilm_path, token_model, images, tmp_path):
    assert JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT).itm_input == "tokens"
    with pytest.raises(ValueError, match="itm_input"):
        JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, itm_input="pooled")
    save_checkpoint(token_model, str(tmp_path / "old"))
    path = tmp_path / "old" / "config.json"
    meta = json.loads(path.read_text())
    del meta["config"]["encoder"]["itm_input"]  # as every checkpoint written before the option
    path.write_text(json.dumps(meta))
    assert from_dict(EDJEConfig, meta["config"]).encoder.itm_input == "tokens"
    loaded = load_checkpoint(str(tmp_path / "old"))
    assert not loaded.encoder.global_itm and loaded.encoder.mlm_fusion is None
    with torch.no_grad():
        assert torch.equal(loaded.score_backbone_tokens(CAPTIONS, images), token_model.score_backbone_tokens(CAPTIONS, images))


def test_the_shipped_checkpoint_loads_as_the_token_mode():
    """The shipped reranker loads strictly (same weights, same keys) in the token mode (a config.json from before
    the option loads the same way: the test above)."""
    from pathlib import Path
    shipped = Path(__file__).resolve().parent.parent / "checkpoints" / "edje-local-bind"
    assert json.loads((shipped / "config.json").read_text())["config"]["encoder"].get("itm_input", "tokens") == "tokens"
    model = load_checkpoint(str(shipped))
    assert model.config.encoder.itm_input == "tokens" and not model.encoder.global_itm
    assert "encoder.itm_head.1.weight" in model.state_dict() and model.encoder.mlm_fusion is None


def test_a_global_baseline_starts_from_a_token_models_bert(token_model, images, tmp_path):
    """`--init-encoder-from <token model> --itm-input global`: BERT and the word context are copied, the heads
    that read the image start fresh (the baseline gets the same text encoder as the EDJE it is compared with)."""
    from dataclasses import replace

    from edje.schemas.token_table import TableMetadata
    from edje.training.config import ModelSpec
    from edje.training.model_init import build_model

    # a token model with the relation parts, as the shipped ones: the global mode cannot have them
    cfg = token_model.config
    source = EDJEModel(replace(cfg, encoder=replace(cfg.encoder, relation_roles=True, role_vocabulary=VOCAB, route_layer=0,
                                                    ground_layer=0)), load_language_model=False)
    source.load_state_dict(token_model.state_dict(), strict=False)
    save_checkpoint(source, str(tmp_path / "tokens"))
    meta = TableMetadata(kind="raw", backbone="edje-tiny-convvit", pretrained=None, feature_layer="final",
                         num_tokens=N, width=D, quantization="fp16", embed_dim=8)
    spec = ModelSpec(adapter="local", adapter_hidden=48, itm_input="global")
    model = build_model(spec, meta, init_encoder_from=str(tmp_path / "tokens"))
    enc, src = model.encoder, token_model.encoder
    assert enc.global_itm and enc.mlm_fusion is not None
    assert torch.equal(enc.bert.bert.encoder.layer[0].attention.self.query.weight,
                       src.bert.bert.encoder.layer[0].attention.self.query.weight)
    assert torch.equal(enc.word_context.conv.weight, src.word_context.conv.weight)
    assert not enc.mlm_fusion.mlp[2].weight.abs().sum()  # fresh: the MLM starts text-only
    with torch.no_grad():
        assert model.score_backbone_tokens(CAPTIONS, images).shape == (len(CAPTIONS),)
    # without the flag the source's mode is kept
    save_checkpoint(token_model, str(tmp_path / "plain"))
    assert not build_model(ModelSpec(adapter="local", adapter_hidden=48), meta,
                           init_encoder_from=str(tmp_path / "plain")).encoder.global_itm
