"""The `content` MLM policy masks every piece of exactly one content word per caption, by a rule of English (no
function word, no part of a word), and over many draws every content word of a caption gets its turn."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from edje.model.content_words import ContentWords

CAPTIONS = ["a dog sitting to the left of a red bicycle",
            "two apples above a car",
            "an anemone beneath the tofu",
            "it is the one"]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(minilm_path)


class Batch:
    def __init__(self, tokenizer, captions):
        enc = tokenizer(captions, padding=True, return_tensors="pt")
        self.input_ids = enc["input_ids"]
        special = torch.tensor([[t in tokenizer.all_special_ids for t in row] for row in self.input_ids.tolist()])
        self.text_mask = enc["attention_mask"].bool() & ~special


def _masked_words(tokenizer, batch, masked):
    """Per caption, the masked pieces joined back into words."""
    return [tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(ids[m].tolist()))
            for ids, m in zip(batch.input_ids, masked)]


def test_one_whole_content_word_per_caption(tokenizer):
    policy, batch = ContentWords(tokenizer), Batch(tokenizer, CAPTIONS)
    generator = torch.Generator().manual_seed(0)
    seen = [Counter() for _ in CAPTIONS]
    for _ in range(200):
        masked = policy.mask_policy(batch, generator)
        assert not (masked & ~batch.text_mask).any()
        for i, word in enumerate(_masked_words(tokenizer, batch, masked)):
            seen[i][word] += 1
    assert set(seen[0]) == {"dog", "sitting", "left", "red", "bicycle"}
    assert set(seen[1]) == {"two", "apples", "above", "car"}
    # A word of several pieces is masked whole, and is a content word even when its first piece is a function word.
    assert tokenizer.tokenize("anemone")[0] == "an" and tokenizer.tokenize("tofu")[0] == "to"
    assert set(seen[2]) == {"anemone", "beneath", "tofu"}
    # "one" is a numeral; a caption of function words alone gets no mask.
    assert set(seen[3]) == {"one"}
    assert not policy.mask_policy(Batch(tokenizer, ["it is the"]), generator).any()
    # Uniform over content words: each of the first caption's five is drawn about 40 times in 200.
    assert min(seen[0].values()) > 20


def test_the_read_out_scores_masked_pieces_only():
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    labels = torch.tensor([1, -100, 0])  # right, not masked, wrong
    assert ContentWords.readout_accuracy(logits, labels).item() == 0.5
    assert ContentWords.readout_accuracy(logits, torch.full((3,), -100)).item() == 0.0
