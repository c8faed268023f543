"""Binding levers: attribute-group MLM masking and the word-context convolution of the joint encoder."""
from __future__ import annotations

import json

import pytest
import torch

from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint
from edje.model.joint_encoder import JointEncoder
from edje.schemas.config import JointEncoderConfig
from edje.training.masking import PieceGroups, WordGroups

BERT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=30522,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CAPTIONS = ["a large red circle to the left of a small blue square",
            "there is a little violet disc and, to its right, a big green plus sign",
            "nothing of the sort here"]


@pytest.fixture(scope="module")
def encoder(minilm_path):
    torch.manual_seed(0)
    return JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, num_image_tokens=4, text_embed_dim=8),
                        load_weights=False)


def _words(encoder, ids, mask):
    return encoder.tokenizer.convert_ids_to_tokens(ids[mask].tolist())


def test_group_masking_hides_every_word_of_one_group_and_nothing_else(encoder):
    groups = PieceGroups(WordGroups.sample_world(), encoder.tokenizer)
    batch = encoder.tokenize_pairs(CAPTIONS, 4)
    want = {"colour": {"red", "blue", "violet", "green"}, "shape": {"circle", "square", "disc", "plus", "sign"},
            "size": {"large", "small", "little", "big"}, "relation": {"left", "right"}}
    seen = set()
    for seed in range(40):
        masked, pick = groups.group_mask(batch.input_ids, batch.text_mask, torch.Generator().manual_seed(seed))
        assert not (masked & ~batch.text_mask).any()  # never special or image positions
        assert pick[2] == -1 and not masked[2].any()  # a caption without group words is left alone
        for row in range(2):
            name = groups.names[int(pick[row])]
            seen.add(name)
            words = _words(encoder, batch.input_ids[row], masked[row])
            caption_words = set(_words(encoder, batch.input_ids[row], batch.text_mask[row]))
            # all of the group's words in the caption, and only those
            assert set(words) == want[name] & caption_words
    assert seen == set(want)


def test_binding_readout_counts_synonyms_as_one_word(encoder):
    groups = PieceGroups(WordGroups.sample_world(), encoder.tokenizer)
    ids = encoder.tokenizer.convert_tokens_to_ids
    labels = torch.tensor([ids("disc"), ids("red"), ids("large"), -100])
    logits = torch.zeros(4, len(groups.group))
    logits[0, ids("circle")] = 5.0  # the synonym: right
    logits[1, ids("blue")] = 5.0  # another colour: wrong
    logits[2, ids("big")] = 5.0  # synonym: right
    logits[2, ids("the")] = 9.0  # not a size word: ignored by the read-out
    assert groups.readout_accuracy(logits, labels).item() == pytest.approx(2 / 3)
    assert groups.readout(logits, labels) == {"colour": 0.0, "shape": 1.0, "size": 1.0}


def test_word_groups_load_from_json(tmp_path):
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"colour": ["red", "crimson"], "object": {"car": "car", "automobile": "car"}}))
    g = WordGroups.load(str(path))
    assert g.names == ("colour", "object") and g.to_json()["object"] == {"car": "car", "automobile": "car"}
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError, match="no word groups"):
        WordGroups.load(str(tmp_path / "empty.json"))


def test_mlm_with_a_policy_labels_exactly_the_policys_positions(encoder):
    groups = PieceGroups(WordGroups.sample_world(), encoder.tokenizer)
    tokens = torch.randn(3, 4, 32)
    logits, labels = encoder.mlm_logits(CAPTIONS, tokens, generator=torch.Generator().manual_seed(1),
                                        mask_policy=groups.mask_policy)
    batch = encoder.tokenize_pairs(CAPTIONS, 4)
    masked, _ = groups.group_mask(batch.input_ids, batch.text_mask, torch.Generator().manual_seed(1))
    assert sorted(labels[labels != -100].tolist()) == sorted(batch.input_ids[masked].tolist())
    assert logits.shape[0] == labels.shape[0]


def test_word_context_starts_as_plain_bert_mixes_only_caption_words_and_is_kept_in_checkpoints(minilm_path, tmp_path, tiny_edje_config):
    from dataclasses import replace
    torch.manual_seed(0)
    plain = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, num_image_tokens=4, text_embed_dim=8),
                         load_weights=False).eval()
    ctx = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, num_image_tokens=4, text_embed_dim=8,
                                          word_context=3), load_weights=False).eval()
    ctx.load_state_dict(plain.state_dict(), strict=False)
    tokens = torch.randn(3, 4, 32)
    with torch.no_grad():
        # zero-initialised: the same scores as plain BERT
        torch.testing.assert_close(ctx.score(CAPTIONS, tokens), plain.score(CAPTIONS, tokens))
        torch.nn.init.normal_(ctx.word_context.conv.weight, std=0.5)
        batch = ctx.tokenize_pairs(CAPTIONS, 4)
        a, b = plain.embed_pairs(batch, tokens), ctx.embed_pairs(batch, tokens)
        changed = (a - b).abs().amax(-1) > 1e-6
        assert torch.equal(changed, batch.text_mask)  # caption words change; [CLS], [SEP], image, pad do not
        assert not torch.allclose(ctx.score(CAPTIONS, tokens), plain.score(CAPTIONS, tokens))
        assert not torch.allclose(ctx.text_embedding(CAPTIONS), plain.text_embedding(CAPTIONS))
    with pytest.raises(ValueError, match="odd kernel"):
        JointEncoderConfig(tokenizer=minilm_path, bert_config=BERT, word_context=2)
    cfg = replace(tiny_edje_config, encoder=replace(tiny_edje_config.encoder, word_context=3))
    model = EDJEModel(cfg, load_language_model=False).eval()
    torch.nn.init.normal_(model.encoder.word_context.conv.weight, std=0.5)
    save_checkpoint(model, str(tmp_path / "ck"))
    back = load_checkpoint(str(tmp_path / "ck")).eval()
    assert back.config.encoder.word_context == 3
    torch.testing.assert_close(back.encoder.word_context.conv.weight, model.encoder.word_context.conv.weight)


def test_adapter_grid_position_tells_cells_apart_and_travels_with_the_checkpoint(tiny_edje_config, tmp_path):
    from dataclasses import replace

    from edje.model.adapters import grid_position
    table = grid_position(64, 128)
    torch.testing.assert_close(table.norm(dim=1), torch.ones(64))
    assert torch.cdist(table, table).add(torch.eye(64) * 9).min() > 0.05  # every cell its own code
    # mirrored cells (column c vs 7 - c, same row) share the row half and differ in the column half
    assert torch.equal(table[8 * 2 + 1, 64:], table[8 * 2 + 6, 64:]) and not torch.equal(table[17, :64], table[22, :64])
    with pytest.raises(ValueError, match="square token grid"):
        grid_position(65, 128)
    cfg = replace(tiny_edje_config, adapter=replace(tiny_edje_config.adapter, position="2d"))
    model = EDJEModel(cfg, load_language_model=False).eval()
    plain = EDJEModel(tiny_edje_config, load_language_model=False).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    tokens = torch.randn(2, 64, 128)
    with torch.no_grad():
        assert not torch.allclose(model.adapter(tokens), plain.adapter(tokens))
        model.adapter.position.gain.fill_(0.0)  # no gain: the plain adapter
        torch.testing.assert_close(model.adapter(tokens), plain.adapter(tokens))
        model.adapter.position.gain.fill_(0.7)
    save_checkpoint(model, str(tmp_path / "ck"))
    back = load_checkpoint(str(tmp_path / "ck")).eval()
    assert back.config.adapter.position == "2d"
    with torch.no_grad():
        torch.testing.assert_close(back.adapter(tokens), model.adapter(tokens))
