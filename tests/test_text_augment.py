"""Caption augmentation for text-tower training (model/text_augment.py): EDA's swap and deletion, AEDA's
punctuation, drawn from the caller's generator."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

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


def test_dropping_function_words_keeps_every_content_and_spatial_word():
    from edje.model.content_words import FUNCTION_WORDS

    caption = "a small dog is to the left of a large cat and the cat is above two cars"
    content = [w for w in caption.split() if w not in FUNCTION_WORDS]
    dropped = set()
    for seed in range(20):
        out = augment_caption(caption, np.random.default_rng(seed), ops=("function_words",)).split()
        assert [w for w in out if w not in FUNCTION_WORDS] == content  # in order: who is where stays
        dropped |= set(caption.split()) - set(out)
    assert dropped and dropped <= FUNCTION_WORDS and {"left", "above", "two"}.isdisjoint(dropped)
    with pytest.raises(ValueError, match="operations"):
        augment_batch([caption], 1.0, np.random.default_rng(0), ops=("shuffle",))


def test_the_reranker_loop_rewrites_a_share_of_the_batch_the_same_way_on_a_resumed_run():
    import pyarrow as pa

    from edje.training.config import TrainJobConfig
    from edje.training.loop import rewrite_captions
    captions = [CAPTION, "the red car is above a cat", "two dogs"]
    raw = pa.table({"image_id": ["a", "b", "c"], "caption": captions})
    off = TrainJobConfig(tables=["t"], storage_path="s", name="n")
    assert rewrite_captions(raw, off, rank=0, step=5) is raw  # the default: captions as written
    cfg = TrainJobConfig(tables=["t"], storage_path="s", name="n", text_augment=1.0, text_augment_ops=("function_words",))
    outs = [rewrite_captions(raw, cfg, rank=0, step=s).column("caption").to_pylist() for s in range(20)]
    # Each (seed, rank, step) draws its own rewrites, and the same ones again when a resumed run reaches that step.
    assert rewrite_captions(raw, cfg, rank=0, step=3).column("caption").to_pylist() == outs[3]
    assert len({tuple(o) for o in outs}) > 1
    assert any(o[0] != CAPTION for o in outs) and all(o[2] == "two dogs" for o in outs)  # no function word to drop
    assert rewrite_captions(raw, cfg, rank=0, step=3).column("image_id").to_pylist() == ["a", "b", "c"]


def test_the_reranker_refuses_a_rate_outside_zero_one_and_rewrites_beside_grounding():
    from edje.training.config import TrainJobConfig
    with pytest.raises(ValueError, match="text_augment must be in"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", text_augment=1.5)
    with pytest.raises(ValueError, match="augmentation operations"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", text_augment=0.5, text_augment_ops=("shout",))
    with pytest.raises(ValueError, match="ground objective"):
        TrainJobConfig(tables=["t"], storage_path="s", name="n", text_augment=0.5, objectives=("itm", "ground"),
                       grounding=("g.json",))
