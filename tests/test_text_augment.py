"""Caption augmentation for text-tower training (model/text_augment.py): EDA's swap and deletion, AEDA's
punctuation, drawn from the caller's generator."""
from __future__ import annotations

from collections import Counter

import numpy as np

from edje.model.text_augment import PUNCTUATION, augment_batch, augment_caption

CAPTION = "a small dog facing left next to two large cars on the right"


def test_each_operation_keeps_the_captions_words_in_its_own_way():
    words = CAPTION.split()
    seen = Counter()
    for seed in range(60):
        out = augment_caption(CAPTION, np.random.default_rng(seed)).split()
        if Counter(out) == Counter(words) and out != words:
            seen["swap"] += 1
        elif len(out) < len(words):
            assert not (Counter(out) - Counter(words)), "a deletion only removes words"
            seen["delete"] += 1
        elif len(out) > len(words):
            assert [w for w in out if w not in PUNCTUATION] == words and len(out) - len(words) <= len(words) // 3
            seen["punctuate"] += 1
    assert set(seen) == {"swap", "delete", "punctuate"}, seen


def test_the_same_generator_state_rewrites_the_same_way():
    a = augment_batch([CAPTION] * 8, 0.5, np.random.default_rng(3))
    b = augment_batch([CAPTION] * 8, 0.5, np.random.default_rng(3))
    assert a == b and 0 < len(a[1]) < 8
    assert all(a[0][r] == CAPTION for r in range(8) if r not in a[1])
    assert augment_batch([CAPTION] * 8, 0.0, np.random.default_rng(3)) == ([CAPTION] * 8, [])


def test_a_one_word_caption_is_left_as_it_is():
    assert augment_caption("dog", np.random.default_rng(0)) == "dog"
