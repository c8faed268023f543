"""The joint encoder's pair layout (distinct texts tokenised once, tensor layout, wordpiece cache) gives
exactly the batches and scores of the old per-row layout kept in research/legacy_pairs.py."""
import copy
import random

import pytest
import torch
from conftest import TINY_BERT

from edje.model import wordpieces
from edje.model.joint_encoder import JointEncoder, PairBatch
from edje.research.legacy_pairs import (
    legacy_embed_pairs,
    legacy_mlm_logits,
    legacy_score,
    legacy_text_embedding,
    legacy_text_inputs,
    legacy_tokenize_pairs,
)
from edje.schemas.config import JointEncoderConfig


@pytest.fixture(scope="module")
def encoder(minilm_path):
    torch.manual_seed(0)
    return JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=dict(TINY_BERT, max_position_embeddings=512),
                                           num_image_tokens=16, text_embed_dim=8)).eval()


def mixed_texts(tok, n: int, seed: int):
    """Random captions: empty, blank, one word, exactly 64 and over 64 wordpieces (truncated), accents, repeats."""
    rng = random.Random(seed)
    vocab = [w for w in tok.get_vocab() if w.isalpha()][:3000]
    fixed = ["", "   ", "red", " ".join(["blue"] * 64), " ".join(["green"] * 300), "Crème brûlée, naïve café!",
             "a small red circle left of a large blue square"]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 90))) for _ in range(n)] + fixed
    texts += [rng.choice(texts) for _ in range(n)]  # repeats, as in rerank requests and training batches
    rng.shuffle(texts)
    return texts


def assert_same(new: PairBatch, old: PairBatch):
    for f in PairBatch.__dataclass_fields__:
        a, b = getattr(new, f), getattr(old, f)
        if a is None or b is None:  # roles: only encoders with relation roles lay them out
            assert a is b, f
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, f
        assert torch.equal(a, b), f


@pytest.mark.parametrize("m", [1, 16, 64])
def test_layout_is_bit_identical_to_the_per_row_one(encoder, m):
    for seed in range(3):
        texts = mixed_texts(encoder.tokenizer, 40, seed)
        assert_same(encoder.tokenize_pairs(texts, m), legacy_tokenize_pairs(encoder, texts, m))
    # all distinct, one text, one query repeated (a rerank request)
    for texts in (["a b c", "d", ""], [""], ["a red square"] * 50):
        assert_same(encoder.tokenize_pairs(texts, m), legacy_tokenize_pairs(encoder, texts, m))


@torch.inference_mode()
def test_scores_mlm_and_text_embedding_equal_the_old_path(encoder):
    texts = mixed_texts(encoder.tokenizer, 20, 7)
    tokens = torch.randn(len(texts), 16, encoder.hidden_size)
    assert torch.equal(encoder.score(texts, tokens), legacy_score(encoder, texts, tokens))
    one_query = ["a small red circle"] * len(texts)  # every image run starts at the same position
    assert torch.equal(encoder.score(one_query, tokens), legacy_score(encoder, one_query, tokens))
    batch = encoder.tokenize_pairs(texts, 16)
    assert torch.equal(encoder.embed_pairs(batch, tokens), legacy_embed_pairs(encoder, batch, tokens))
    new = encoder.mlm_logits(texts, tokens, generator=torch.Generator().manual_seed(3))
    old = legacy_mlm_logits(encoder, texts, tokens, generator=torch.Generator().manual_seed(3))
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert torch.equal(encoder.text_embedding(texts), legacy_text_embedding(encoder, texts))
    ids, attention = wordpieces.text_rows([encoder.tokenizer("x y", add_special_tokens=False)["input_ids"]],
                                          encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id,
                                          encoder.tokenizer.pad_token_id)
    old_ids, old_attention = legacy_text_inputs(encoder, ["x y"])
    assert torch.equal(ids, old_ids) and torch.equal(attention, old_attention)


def test_image_token_gradients_equal_the_old_path(encoder):
    texts = mixed_texts(encoder.tokenizer, 10, 9)
    batch = encoder.tokenize_pairs(texts, 16)
    weights = torch.randn(len(texts), batch.input_ids.shape[1], encoder.hidden_size)
    grads = []
    for embed in (encoder.embed_pairs, lambda b, x: legacy_embed_pairs(encoder, b, x)):
        tokens = torch.randn(len(texts), 16, encoder.hidden_size, generator=torch.Generator().manual_seed(1),
                             requires_grad=True)
        (embed(batch, tokens) * weights).sum().backward()
        grads.append(tokens.grad)
    assert torch.equal(grads[0], grads[1])


class CountingTokenizer:
    """Wraps a tokenizer and records the texts of every call."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def __call__(self, texts, **kw):
        self.calls.append(list(texts))
        return self.tok(texts, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_each_distinct_text_is_tokenised_once_per_call_and_cached_across_calls(minilm_path):
    enc = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, num_image_tokens=4, text_embed_dim=8))
    enc.tokenizer = counting = CountingTokenizer(enc.tokenizer)
    captions = [f"caption number {i}" for i in range(128)]
    k = 7
    batch = captions + [c for c in captions for _ in range(k)] + [captions[(i * 5) % 128] for i in range(128 * k)]
    enc.tokenize_pairs(batch, 4)
    assert counting.calls == [captions]  # one tokenizer call, on the 128 distinct captions
    enc.tokenize_pairs(batch[::-1], 4)
    enc.text_embedding(captions[:3])
    assert len(counting.calls) == 1  # the next step's captions come from the cache
    enc.tokenize_pairs(["a new query"] * 1024, 4)
    assert counting.calls[1:] == [["a new query"]]


def test_cache_is_bounded_lru_and_survives_copies():
    cache = wordpieces.WordpieceCache(maxsize=3)
    calls = []

    def tok(texts):
        calls.append(list(texts))
        return [[len(t)] for t in texts]
    assert cache.lookup(["a", "bb", "ccc"], tok, "s") == [[1], [2], [3]]
    cache.lookup(["a"], tok, "s")  # "a" is now the most recent; "bb" the least
    cache.lookup(["dddd"], tok, "s")
    assert len(cache) == 3 and calls[-1] == ["dddd"]
    cache.lookup(["a", "ccc", "bb"], tok, "s")
    assert calls[-1] == ["bb"]  # evicted, so tokenised again
    cache.lookup(["a"], tok, "another tokenizer")
    assert calls[-1] == ["a"]  # a different source empties the cache
    clone = copy.deepcopy(cache)
    assert clone.maxsize == 3 and len(clone) == 0


def test_encoder_deepcopies_and_rejects_an_empty_batch(encoder):
    clone = copy.deepcopy(encoder)
    assert_same(clone.tokenize_pairs(["x"], 2), encoder.tokenize_pairs(["x"], 2))
    with pytest.raises(ValueError, match="no texts"):
        encoder.tokenize_pairs([], 2)
