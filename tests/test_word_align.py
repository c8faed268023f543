"""Word-to-image-token alignment (word_align, FILIP's fine-grained loss): the loss on hand-made vectors, its gradient
through EDJEObjectives into the adapter and the content words' embedding rows alone, the per-word grouping of a
caption's wordpieces, and the config's checks."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_BERT
from torch.nn import functional as F

from edje.schemas.token_table import TableMetadata
from edje.training.batches import TrainBatch
from edje.training.config import OBJECTIVES, ModelSpec, TrainJobConfig
from edje.training.losses import word_alignment_loss
from edje.training.model_init import build_model
from edje.training.negatives import Negatives
from edje.training.objectives import EDJEObjectives, same_image

META = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=None, feature_layer="final", num_tokens=16,
                     width=32, quantization="fp16", embed_dim=16)
TINY = tuple(sorted(TINY_BERT.items()))
CAPTIONS = ["a red circle to the left of a blue square", "the green star above a yellow heart",
            "a hexagon of the moon"]
FUNCTION = ("a", "the", "of", "to")


def _model(adapter: str = "local"):
    """A tiny random EDJE model (local adapter: 16 cell tokens; compressed: 4 queries)."""
    return build_model(ModelSpec(adapter=adapter, num_queries=4, adapter_hidden=64, bert_config=TINY), META)


def _batch(captions=CAPTIONS):
    """One row per caption, each its own image, with k = 1 negative per direction (the next row's)."""
    n = len(captions)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randn(n, META.num_tokens, META.width, generator=g)
    batch = TrainBatch([f"i{k}" for k in range(n)], list(captions), tokens, torch.zeros(n, 16), torch.zeros(n, 16))
    others = [(k + 1) % n for k in range(n)]
    return batch, Negatives(tokens[others][:, None].clone(), [[captions[j]] for j in others])


# ---------------------------------------------------------------------------------------- the loss
def _hand_made():
    """Three captions over one-hot vectors e0..e3: caption 0 says e0 e1, caption 1 e2 (its second slot padding),
    caption 2 nothing (its slots padding); image 0 shows e0 e1, image 1 e0 e2, image 2 e3 twice."""
    e = torch.eye(4)
    words = torch.stack([torch.stack([e[0], e[1]]), torch.stack([e[2], e[0]]), torch.stack([e[3], e[3]])])
    valid = torch.tensor([[True, True], [True, False], [False, False]])
    images = torch.stack([torch.stack([e[0], e[1]]), torch.stack([e[0], e[2]]), torch.stack([e[3], e[3]])])
    return words, valid, images


def _ce(logits, target):
    return -math.log(math.exp(logits[target]) / sum(math.exp(x) for x in logits))


def test_word_alignment_loss_is_the_symmetric_cross_entropy_of_mean_best_cosines():
    words, valid, images = _hand_made()
    # S over the kept captions 0 and 1: [[1, 1/2, 0], [0, 1, 0]]; tau 1/2 doubles it. Caption 2 is no row, and no
    # candidate of an image.
    loss, acc = word_alignment_loss(words, valid, images, same_image(["i0", "i1", "i2"]), 0.5)
    t2i = (_ce([2, 1, 0], 0) + _ce([0, 2, 0], 1)) / 2
    i2t = (_ce([2, 0], 0) + _ce([1, 2], 1)) / 2
    assert loss.item() == pytest.approx((t2i + i2t) / 2, rel=1e-6)
    assert acc.item() == 1.0 and not acc.requires_grad
    # The scale of a vector does not count (cosine), nor do padding slots or a caption without words.
    other = words.clone()
    other[0] *= 3
    other[1, 1] = torch.tensor([5.0, -1.0, 2.0, 0.0])
    other[2] = torch.randn(2, 4)
    assert word_alignment_loss(other, valid, images, same_image(["i0", "i1", "i2"]), 0.5)[0].item() == pytest.approx(
        loss.item(), rel=1e-6)
    # Images swapped: each kept caption's top S is the other's image.
    swapped = images[[1, 0, 2]]
    assert word_alignment_loss(words, valid, swapped, same_image(["i0", "i1", "i2"]), 0.5)[1].item() == 0.0


def test_rows_of_the_same_image_are_no_negatives_of_each_other():
    words, valid, images = _hand_made()
    apart = word_alignment_loss(words, valid, images, same_image(["i0", "i1", "i2"]), 0.5)[0]
    together = same_image(["x", "x", "i2"])
    assert together.tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    loss, acc = word_alignment_loss(words, valid, images, together, 0.5)
    # Rows 0 and 1 leave each other's softmax in both directions: the image side has one candidate left.
    t2i = (_ce([2, 0], 0) + _ce([2, 0], 0)) / 2
    assert loss.item() == pytest.approx((t2i + 0.0) / 2, rel=1e-6) and loss.item() != pytest.approx(apart.item())
    assert acc.item() == 1.0


def test_no_caption_with_a_word_gives_zero_with_a_graph():
    words, valid, images = _hand_made()
    words.requires_grad_(True)
    loss, acc = word_alignment_loss(words, torch.zeros_like(valid), images, same_image(["i0", "i1", "i2"]), 0.5)
    assert loss.item() == 0.0 and loss.requires_grad and acc is None


# ---------------------------------------------------------------------------------------- through the objectives
@pytest.mark.parametrize("adapter", ["local", "compressed"])
def test_word_align_trains_the_adapter_and_the_word_embeddings(adapter):
    torch.manual_seed(0)
    model = _model(adapter).eval()  # no dropout: the loss below is recomputed from the same adapter output
    batch, neg = _batch()
    objectives = EDJEObjectives(model, ("itm", "word_align"), {}, align_temperature=0.1)
    out = objectives(batch, neg)
    loss = out["loss_word_align"]
    assert torch.isfinite(loss) and loss.item() > 0 and "word_align_acc" in out
    with torch.no_grad():  # the captions' content words against the positives' adapter tokens, at the given tau
        vecs, valid = model.encoder.content_word_vectors(batch.captions, model.encoder.config.num_image_tokens,
                                                       torch.device("cpu"))
        expected = word_alignment_loss(vecs, valid, model.adapter(batch.tokens), same_image(batch.image_ids), 0.1)
    assert loss.item() == pytest.approx(expected[0].item(), rel=1e-5)
    assert valid.sum(1).tolist() == [5, 5, 2]
    assert out["loss"].item() == pytest.approx(out["loss_itm"].item() + loss.item(), rel=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.adapter.parameters())
    table = model.encoder.bert.get_input_embeddings().weight
    assert table.grad is not None and table.grad.abs().sum() > 0


@pytest.mark.parametrize("adapter", ["local", "compressed"])
def test_only_content_words_get_a_gradient(adapter):
    torch.manual_seed(0)
    model = _model(adapter)
    batch, neg = _batch()
    out = EDJEObjectives(model, ("word_align",), {"word_align": 2.0})(batch, neg)
    assert out["loss"].item() == pytest.approx(2 * out["loss_word_align"].item(), rel=1e-6)
    out["loss"].backward()
    tok = model.encoder.tokenizer
    grad = model.encoder.bert.get_input_embeddings().weight.grad
    touched = set(grad.abs().sum(1).nonzero().squeeze(1).tolist())
    content = {"red", "circle", "left", "blue", "square", "green", "star", "above", "yellow", "heart", "moon"}
    expected = set(tok.convert_tokens_to_ids(sorted(content) + tok.tokenize("hexagon")))
    assert touched == expected
    assert not touched & set(tok.convert_tokens_to_ids(list(FUNCTION)))


# ---------------------------------------------------------------------------------------- one vector per word
def test_a_words_vector_is_the_mean_of_its_wordpieces_rows():
    model = _model()
    tok = model.encoder.tokenizer
    pieces = tok.tokenize("hexagon")
    assert len(pieces) > 1 and pieces[0] == "he"  # "he" alone is a function word: a piece of hexagon is not
    with torch.no_grad():
        vecs, valid = model.encoder.content_word_vectors(["a hexagon to the left of the star", "it is what it is"], 16,
                                                       torch.device("cpu"))
    table = model.encoder.bert.get_input_embeddings().weight.detach()
    rows = table[tok.convert_tokens_to_ids(pieces)]
    assert vecs.shape == (2, 3, model.encoder.hidden_size)
    assert valid.tolist() == [[True, True, True], [False, False, False]]
    assert torch.allclose(vecs[0, 0], rows.mean(0), atol=1e-6) and not torch.allclose(vecs[0, 0], rows[0])
    assert torch.allclose(vecs[0, 1], table[tok.convert_tokens_to_ids("left")], atol=1e-6)
    assert torch.allclose(vecs[0, 2], table[tok.convert_tokens_to_ids("star")], atol=1e-6)


# ---------------------------------------------------------------------------------------- the encoder's term
def test_the_alignment_term_adds_g_times_the_word_alignment_to_every_scoring_path():
    from dataclasses import replace

    from edje.model.edje import EDJEModel

    torch.manual_seed(0)
    plain = _model().eval()
    cfg = replace(plain.config, encoder=replace(plain.config.encoder, word_alignment=4.0, relation_roles=True,
                                                route_layer=1))
    model = EDJEModel(cfg, load_language_model=False).eval()
    own = model.state_dict()
    model.load_state_dict({**{k: v for k, v in plain.state_dict().items()}, **{k: own[k] for k in own
                                                                                 if k not in plain.state_dict()}})
    batch, _ = _batch()
    tokens = model.adapter(batch.tokens)
    with torch.no_grad():
        term = model.encoder.word_alignment(batch.captions, tokens)
        vecs, valid = model.encoder.content_word_vectors(batch.captions, tokens.shape[1], tokens.device)
        by_hand = torch.stack([torch.stack([F.cosine_similarity(vecs[i, w][None], tokens[i]).max()
                                            for w in range(int(valid[i].sum()))]).mean() for i in range(3)])
        torch.testing.assert_close(term, by_hand, atol=1e-5, rtol=0)
        without = plain.encoder.score(batch.captions, plain.adapter(batch.tokens))
        torch.testing.assert_close(model.encoder.score(batch.captions, tokens), without + 4.0 * term)
        torch.testing.assert_close(model.encoder.score_and_route(batch.captions, tokens)[0], without + 4.0 * term)
    model.encoder.score(batch.captions, tokens).sum().backward()
    assert model.encoder.alignment_scale.grad is not None and model.encoder.alignment_scale.grad.abs() > 0
    with pytest.raises(ValueError, match="itm_input 'tokens'"):
        EDJEModel(replace(cfg, encoder=replace(cfg.encoder, itm_input="global", relation_roles=False, route_layer=0)),
                  load_language_model=False)


def test_an_init_checkpoint_grows_the_alignment_term_with_its_weights_kept(tmp_path):
    from edje.model.edje import load_checkpoint, save_checkpoint
    from edje.training.model_init import with_relations

    torch.manual_seed(0)
    model = _model().eval()
    save_checkpoint(model, str(tmp_path / "ck"))
    grown = with_relations(load_checkpoint(str(tmp_path / "ck")), ModelSpec(word_alignment=20.0)).eval()
    assert grown.config.encoder.word_alignment == 20.0 and grown.encoder.alignment_scale.item() == 20.0
    batch, _ = _batch()
    with torch.no_grad():
        tokens = model.adapter(batch.tokens)
        torch.testing.assert_close(grown.encoder.score(batch.captions, tokens), model.encoder.score(batch.captions, tokens)
                                   + 20.0 * grown.encoder.word_alignment(batch.captions, tokens))


# ---------------------------------------------------------------------------------------- the config
def test_the_config_takes_word_align_and_a_positive_temperature():
    assert "word_align" in OBJECTIVES
    job = TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "word_align"),
                         align_temperature=0.1, loss_weights=(("word_align", 0.5),))
    assert job.align_temperature == 0.1 and job.weight("word_align") == 0.5
    assert TrainJobConfig(tables=["t"], storage_path="s", name="n").align_temperature == 0.05
    for tau in (0.0, -0.05):
        with pytest.raises(ValueError, match="align_temperature must be > 0"):
            TrainJobConfig(tables=["t"], storage_path="s", name="n", objectives=("itm", "word_align"),
                           align_temperature=tau)
