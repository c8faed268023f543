"""Attribute-swap negatives from captions alone: the size words and counts a caption names, one mention replaced with
its article fitted, replacements only from the same context and never a second word for a value the caption already
names, the weights that balance each context, a blind model of word pairs at chance, and the objective's loss and
gradient."""
from __future__ import annotations

import blind_attribute_swap as bas
import blind_noun_swap as bns
import blind_prior as bp
import numpy as np
import pytest
import torch
from test_word_align import _batch, _model

from edje.training.attribute_swaps import AttributeSwaps, attribute_slots, replace_slot
from edje.training.objectives import EDJEObjectives


def _draws(swaps, caption, n=60):
    rng = np.random.default_rng(0)
    return {s[0] for s in (swaps.swap(caption, rng) for _ in range(n)) if s is not None}


def test_slots_are_size_words_and_counts_of_plurals_each_mention_apart():
    slots = attribute_slots("A big dog left of two small cats and a big cat; 3 huge owls")
    assert [(s.word, s.kind) for s in slots] == [("big", "size"), ("two", "count"), ("small", "size"),
                                                 ("big", "size"), ("3", "count"), ("huge", "size")]
    assert slots[0].context == ("size", "a", "dog") and slots[1].context == ("count", "of", "small")
    assert attribute_slots("a dog to the left of one cat") == ()  # "one" is a singular, not a count to swap


def test_one_mention_is_replaced_and_the_article_fitted():
    caption = "A huge ant above a big cat, the big cat on the left"
    assert replace_slot(caption, attribute_slots(caption)[1], "little") == \
        "A huge ant above a little cat, the big cat on the left"
    assert replace_slot("a big egg", attribute_slots("a big egg")[0], "enormous") == "an enormous egg"
    assert replace_slot("Big dogs", attribute_slots("Big dogs")[0], "small") == "Small dogs"


def test_replacements_come_from_the_same_context_with_another_value():
    captions = ["a big dog above a cat", "a small dog above a cat", "a large dog above a cat", "a tiny owl",
                "two big dogs", "three big dogs"]
    swaps = AttributeSwaps(captions)
    assert _draws(swaps, "a big dog above a cat") == {"a small dog above a cat"}  # "large" is the same value
    assert _draws(swaps, "a small dog above a cat") == {"a big dog above a cat", "a large dog above a cat"}
    assert _draws(swaps, "two big dogs") == {"three big dogs"}
    assert swaps.swap("a tiny owl", np.random.default_rng(0)) is None  # nothing else seen before "owl"


def test_a_caption_keeps_its_own_word_for_a_value_it_already_names():
    captions = ["a big dog and a little cat", "a small dog and a large cat", "a little dog and a big cat",
                "a large dog and a small cat"]
    swaps = AttributeSwaps(captions)
    # "big" and "little" are this caption's words: "big" becomes "little", never "small".
    assert _draws(swaps, "a big dog and a little cat") == {"a little dog and a little cat", "a big dog and a big cat"}


def test_weights_give_each_value_as_much_weight_among_swaps_as_among_true_captions():
    swaps = AttributeSwaps(["a big dog"] * 3 + ["a small dog"] + ["a large dog"])
    # "big" and "large" are one value (4 captions) against "small" (1): min(4, 1) / 4 and min(1, 4) / 1.
    assert [swaps.weight(attribute_slots(f"a {w} dog")[0]) for w in ("big", "large", "small")] == [0.25, 0.25, 1.0]
    assert swaps.weight(attribute_slots("a big owl")[0]) == 0.0  # a context never seen


@pytest.mark.parametrize("world", ["open", "shapes"])
def test_a_blind_model_of_word_pairs_is_at_chance_on_held_out_families(world):
    recs = bp.records_of(world, 100, 4000, 1000)
    weighted = bns.held_out(recs, bas.attribute_swap(True))
    assert weighted["ci95"][0] <= 50 <= weighted["ci95"][1] and weighted["swapped"] > 50, weighted
    if world == "open":  # the shapes world names no counts; the open world's count contexts are uneven
        counts = bns.held_out(recs, bas.attribute_swap(True, kinds=("count",)))
        assert counts["ci95"][0] <= 50 <= counts["ci95"][1] and counts["n"] > 1000, counts


def test_the_attribute_swap_objective_scores_weighted_swaps_on_the_same_image_and_trains_the_encoder():
    torch.manual_seed(0)
    model = _model().eval()
    batch, neg = _batch(["a big red circle to the left of a small blue square",
                         "a small red star to the left of a big blue heart",
                         "two big red moons to the left of a small blue square"])
    swaps = AttributeSwaps(list(batch.captions) + ["three big red moons to the left of a small blue square"])
    objectives = EDJEObjectives(model, ("itm", "attribute_swap"), {"attribute_swap": 2.0}, attribute_swaps=swaps,
                                seed=3)
    out = objectives(batch, neg)
    assert torch.isfinite(out["loss_attribute_swap"]) and 0 <= out["attribute_swap_acc"] <= 1
    assert out["loss"].item() == pytest.approx(out["loss_itm"].item() + 2 * out["loss_attribute_swap"].item(),
                                               rel=1e-5)
    out["loss_attribute_swap"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    with pytest.raises(ValueError, match="AttributeSwaps"):
        EDJEObjectives(model, ("itm", "attribute_swap"), {})
    with pytest.raises(ValueError, match="itm"):
        EDJEObjectives(model, ("mlm", "attribute_swap"), {}, attribute_swaps=swaps)
