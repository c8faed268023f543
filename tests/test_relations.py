"""Relations end to end without Ray: same-side scenes, caption grounding, pairs bucketed by what differs
between two scenes (with family-bootstrap intervals), and the joint encoder's relation parts
(fixed image positions, role embeddings, the route, the grounding head) with a warm start they leave unchanged."""
from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import TINY_BERT

from edje.evaluation.scene_pairs import bootstrap_ci, pairs_by_scene, scene_difference
from edje.sampleworld.grounding import NOUN_WORDS, caption_grounding
from edje.sampleworld.phrases import bare
from edje.sampleworld.scene import Scene, SceneObject
from edje.sampleworld.world import WorldConfig, generate, sample_records

BG = (120, 120, 120)


VOCAB = tuple(sorted(NOUN_WORDS))  # the diagnostic role parse's word list


def obj(shape, colour, size, cell, center):
    return SceneObject(shape, colour, size, cell, center)


def two(a_cell, b_cell, a=("circle", "red", "small"), b=("square", "blue", "small"), ac=(0.25, 0.5), bc=(0.75, 0.5)):
    return Scene((obj(*a, a_cell, ac), obj(*b, b_cell, bc)), BG)


def test_scene_difference_names_a_place_swap_a_relation_whatever_swaps_made_it():
    base = two((0, 1), (2, 1))
    # colour swap + shape swap of two equal-sized objects: the same objects, places exchanged
    both = two((0, 1), (2, 1), a=("square", "blue", "small"), b=("circle", "red", "small"))
    assert scene_difference(base, both) == "relation"
    assert scene_difference(base, two((0, 1), (2, 1), a=("circle", "blue", "small"), b=("square", "red", "small"))) == "colour"
    assert scene_difference(base, two((0, 1), (2, 1), a=("circle", "red", "large"))) == "size"
    # colour and shape swapped between objects of different sizes: two things differ
    big = two((0, 1), (2, 1), b=("square", "blue", "large"))
    assert scene_difference(big, two((0, 1), (2, 1), a=("square", "blue", "small"), b=("circle", "red", "large"))) == "two swaps"
    assert scene_difference(base, two((2, 1), (0, 1), ac=(0.75, 0.5), bc=(0.25, 0.5))) == "relation"


def test_pairs_by_scene_buckets_relation_pairs_by_side_axis_objects_and_form():
    a = two((0, 1), (2, 1))  # both sides
    mirror = two((2, 1), (0, 1), ac=(0.75, 0.5), bc=(0.25, 0.5))
    same = two((0, 1), (2, 1), ac=(0.2, 0.5), bc=(0.45, 0.5))  # both left of the centre
    same_mirror = two((2, 1), (0, 1), ac=(0.8, 0.5), bc=(0.55, 0.5))
    colour = two((0, 1), (2, 1), a=("circle", "blue", "small"), b=("square", "red", "small"))
    scenes = [a, mirror, colour, same, same_mirror]
    group = np.array([0, 0, 0, 1, 1])
    rankings = np.array([[0, 1, 2], [1, 0, 2], [4, 3, 0]])
    answers = [np.array([0]), np.array([0]), np.array([3])]
    captions = ["a red circle left of a blue square", "there is a blue square and, to its left, a red circle",
                "a red circle left of a blue square"]
    out = pairs_by_scene(rankings, answers, group, scenes, 3, lambda q, item: captions[q])
    # query 0: beats its mirror and colour twin; query 1: loses to the mirror, beats the colour twin;
    # query 2 (family 1, same side): loses to its mirror
    assert out["by_kind"]["relation"]["pairs"] == 3 and out["by_kind"]["relation"]["accuracy"] == pytest.approx(33.33)
    assert out["by_kind"]["colour"] == {"accuracy": 100.0, "pairs": 2, "families": 1, "ci95": [100.0, 100.0]}
    sub = out["relation_subsets"]
    assert sub["side: same side"]["accuracy"] == 0.0 and sub["side: same side"]["pairs"] == 1
    assert sub["side: both sides"]["accuracy"] == 50.0 and sub["axis: horizontal"]["pairs"] == 3
    assert sub["form: pronoun"]["pairs"] == 1 and sub["objects: 2"]["families"] == 2


def test_bootstrap_interval_resamples_families_and_brackets_the_mean():
    hits = np.array([1] * 30 + [0] * 30)
    families = np.repeat(np.arange(20), 3)
    lo, hi = bootstrap_ci(hits, families)
    assert lo < 50.0 < hi and hi - lo > 10
    assert bootstrap_ci(np.ones(10, bool), np.arange(10)) == [100.0, 100.0]


def _same_side(scene: Scene) -> bool:
    rel = scene.relations[0]
    axis = 0 if rel.predicate in ("left_of", "right_of") else 1
    return len({c[axis] > 0.5 for c in (o.center for o in scene.objects)}) == 1


def test_same_side_worlds_put_both_objects_on_one_side_and_keep_the_relations(tmp_path):
    recs = sample_records(WorldConfig(seed=5, n_train=0, n_val=400, n_test=0, same_side_rate=1.0))
    pairs = [r for r in recs if len(r.scene.objects) == 2]
    assert len(pairs) > 50 and all(_same_side(r.scene) for r in pairs)
    for r in pairs:  # the cells still decide the relation, and every object stays inside the frame
        xs = [c for o in r.scene.objects for c in o.center]
        assert all(0.15 <= c <= 0.85 for c in xs), r.scene
        a, b = r.scene.objects
        assert (a.center[0] < b.center[0]) == (a.cell[0] < b.cell[0]) or a.cell[0] == b.cell[0]
    # Without same-side scenes a world is drawn from the random stream it always was.
    plain = sample_records(WorldConfig(seed=5, n_train=0, n_val=400, n_test=0))
    default = sample_records(WorldConfig(seed=5, n_train=0, n_val=400, n_test=0, same_side_rate=0.0))
    assert [r.scene for r in plain] == [r.scene for r in default]
    assert sum(_same_side(r.scene) for r in plain if len(r.scene.objects) == 2) == 0
    world = generate(WorldConfig(seed=5, n_train=0, n_val=8, n_test=0, image_size=32), tmp_path)
    assert "same_side_rate" not in json.loads(world.world_json.read_text())["config"]


def test_caption_grounding_names_each_phrase_word_with_its_objects_centre(tmp_path):
    recs = sample_records(WorldConfig(seed=3, n_train=40, n_val=0, n_test=0))
    grounded = 0
    for r in recs:
        for c in r.captions:
            words = c.split()
            for w, x, y in caption_grounding(c, r.scene):
                assert bare(words[int(w)]) in NOUN_WORDS
                assert any((o.center == (x, y)) for o in r.scene.objects)
                grounded += 1
    assert grounded > 40 * 5 * 4  # at least two words of two phrases per caption
    world = generate(WorldConfig(seed=3, n_train=8, n_val=4, n_test=0, image_size=32), tmp_path)
    from edje.schemas.annotations import load_grounding
    g = load_grounding(world.annotations["train"])
    assert len(g) == 8 * 5 and all(v.shape[1] == 3 for v in g.values())
    assert len(load_grounding(world.annotations["val"])) == 4 * 5


@pytest.fixture(scope="module")
def encoders(minilm_path):
    from edje.model.joint_encoder import JointEncoder
    from edje.schemas.config import JointEncoderConfig
    torch.manual_seed(0)
    plain = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, num_image_tokens=4,
                                            text_embed_dim=8, word_context=3)).eval()
    cfg = replace(plain.config, relation_roles=True, role_vocabulary=VOCAB, route_layer=1, ground_layer=1)
    grown = JointEncoder(cfg, tokenizer=plain.tokenizer, load_weights=False).eval()
    missing, unexpected = grown.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["ground_head.bias", "ground_head.weight", "role_embedding.weight", "route.weight"]
    return plain, grown


CAPTIONS = ["a red circle to the left of a blue square", "there is a blue square and, to its right, a red circle",
            "a big star"]


def test_relation_parts_start_at_zero_so_a_warm_start_scores_as_before(encoders):
    plain, grown = encoders
    tokens = torch.randn(3, 4, 64)
    with torch.no_grad():
        torch.testing.assert_close(plain.score(CAPTIONS, tokens), grown.score(CAPTIONS, tokens))
        logits, centres = grown.score_and_ground(CAPTIONS, tokens)
    torch.testing.assert_close(logits, plain.score(CAPTIONS, tokens))
    assert centres.shape[:2] == grown.tokenize_pairs(CAPTIONS, 4).input_ids.shape and centres.shape[2] == 2
    with pytest.raises(ValueError, match="no grounding head"):
        plain.score_and_ground(CAPTIONS, tokens)


def test_the_route_carries_subject_minus_object_to_the_relation_word_only(encoders):
    _, grown = encoders
    torch.manual_seed(1)
    with torch.no_grad():
        grown.route.weight.normal_()
        grown.role_embedding.weight.normal_()
    tokens = torch.randn(3, 4, 64)
    states = {}
    layer = grown.bert.bert.encoder.layer[0]
    handle = layer.register_forward_hook(lambda m, i, o: states.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            grown.score(CAPTIONS, tokens)
            routed = states["h"].clone()
            weight = grown.route.weight.clone()
            grown.route.weight.zero_()
            grown.score(CAPTIONS, tokens)
            bare_states = states["h"]
            grown.route.weight.copy_(weight)
    finally:
        handle.remove()
    batch = grown.tokenize_pairs(CAPTIONS, 4)
    changed = (routed - bare_states).abs().sum(-1) > 1e-6
    relation_words = batch.roles[..., 0::3].sum(-1) > 0
    assert torch.equal(changed, relation_words)  # "left" and "right", nothing in the caption without a relation
    assert not changed[2].any()


def test_fixed_image_positions_do_not_depend_on_the_caption_length(minilm_path):
    from edje.model.joint_encoder import JointEncoder
    from edje.schemas.config import JointEncoderConfig
    enc = JointEncoder(JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, num_image_tokens=4,
                                          text_embed_dim=8, max_text_tokens=16, image_positions="fixed"))
    batch = enc.tokenize_pairs(["a star", "a big red star to the left of a small blue square"], 4)
    pos = enc._position_ids(batch)
    assert pos[batch.image_mask].view(2, 4).tolist() == [[18, 19, 20, 21]] * 2
    assert torch.equal(pos[batch.text_mask], torch.nonzero(batch.text_mask)[:, 1])  # text keeps 1..n
    assert int(pos.max()) < enc.max_length
    with pytest.raises(ValueError, match="route_layer needs relation_roles"):
        JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, route_layer=1)


def test_relation_parts_survive_a_checkpoint_and_threads(encoders, tiny_edje_config, tmp_path):
    from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint
    cfg = replace(tiny_edje_config, encoder=replace(tiny_edje_config.encoder, relation_roles=True, role_vocabulary=VOCAB, route_layer=2,
                                                     ground_layer=1, image_positions="fixed"))
    model = EDJEModel(cfg, load_language_model=False).eval()
    with torch.no_grad():
        model.encoder.route.weight.normal_()
        model.encoder.role_embedding.weight.normal_()
    save_checkpoint(model, str(tmp_path / "ck"))
    back = load_checkpoint(str(tmp_path / "ck"))
    assert back.config.encoder.route_layer == 2 and back.config.encoder.image_positions == "fixed"
    tokens = torch.randn(3, cfg.adapter.num_queries, cfg.adapter.input_dim)
    with torch.no_grad():
        want = model.encoder.score(CAPTIONS, model.adapter(tokens))
        got = back.encoder.score(CAPTIONS, back.adapter(tokens))
        torch.testing.assert_close(want, got)
        # Threads share one encoder (serving): each forward's roles are its own.
        results = {}

        def run(i):
            results[i] = back.encoder.score([CAPTIONS[i % 3]] * 3, back.adapter(tokens))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i, r in results.items():
        torch.testing.assert_close(r, back.encoder.score([CAPTIONS[i % 3]] * 3, back.adapter(tokens)))


def test_a_warm_start_grows_relation_parts_and_seeds_fixed_cell_positions(tiny_edje_config):
    from edje.model.edje import EDJEModel
    from edje.training.config import ModelSpec
    from edje.training.model_init import IMAGE_POSITION_NORM, with_relations
    cfg = replace(tiny_edje_config, adapter=replace(tiny_edje_config.adapter, kind="local", output_dim=64))
    model = EDJEModel(cfg, load_language_model=False).eval()
    same = with_relations(model, ModelSpec())
    assert same is model  # nothing asked: the checkpoint as it is
    grown = with_relations(model, ModelSpec(relation_roles=True, route_layer=2, ground_layer=1, image_positions="fixed"))
    enc = grown.encoder.config
    assert (enc.relation_roles, enc.route_layer, enc.ground_layer, enc.image_positions) == (True, 2, 1, "fixed")
    assert enc.role_vocabulary is None  # roles by the rule of English unless the diagnostic parse is asked for
    asked = with_relations(model, ModelSpec(relation_roles=True, route_layer=2, role_parse="vocabulary"))
    assert "circle" in asked.encoder.config.role_vocabulary
    old = model.encoder.bert.bert.embeddings.position_embeddings.weight
    new = grown.encoder.bert.bert.embeddings.position_embeddings.weight
    start, m = enc.max_text_tokens + 2, enc.num_image_tokens
    added = (new - old).detach()
    # the cells' rows carry a 2-D table of the stated norm; every other row and weight is the checkpoint's
    torch.testing.assert_close(added[start:start + m].norm(dim=1), torch.full((m,), IMAGE_POSITION_NORM))
    assert float(added[:start].abs().max()) == 0 and float(added[start + m:].abs().max()) == 0
    assert float(grown.encoder.route.weight.abs().max()) == 0 and float(grown.encoder.role_embedding.weight.abs().max()) == 0
    torch.testing.assert_close(grown.adapter.mlp[0].weight, model.adapter.mlp[0].weight)


def test_group_masking_weights_make_relation_words_the_masked_group(minilm_path):
    from transformers import AutoTokenizer

    from edje.training.masking import PieceGroups, WordGroups
    tok = AutoTokenizer.from_pretrained(minilm_path)
    ids = torch.tensor([tok("a red circle to the left of a blue square")["input_ids"]] * 200)
    text = torch.ones_like(ids, dtype=torch.bool)
    text[:, 0] = text[:, -1] = False
    gen = torch.Generator().manual_seed(0)
    plain = PieceGroups(WordGroups.sample_world(), tok)
    boosted = PieceGroups(WordGroups.sample_world(), tok, weights={"relation": 1000.0})
    relation = plain.names.index("relation")
    share = [float((p.group_mask(ids, text, gen)[1] == relation).float().mean()) for p in (plain, boosted)]
    assert 0.1 < share[0] < 0.45 and share[1] > 0.95, share
    with pytest.raises(ValueError, match="unknown groups"):
        PieceGroups(WordGroups.sample_world(), tok, weights={"verbs": 2.0})


def test_flip_relations_reverses_every_spatial_word_and_nothing_else():
    from edje.training.caption_rewrites import flip_relations
    assert flip_relations("a red circle to the left of a blue square") == "a red circle to the right of a blue square"
    assert flip_relations("Above it, a star; a disc is under the star") == "Below it, a star; a disc is over the star"
    assert flip_relations("a star between a disc on the left and a cross on the right") == (
        "a star between a disc on the right and a cross on the left")
    assert flip_relations("a big red star") is None


def test_flip_objective_scores_each_relational_positive_against_its_flipped_caption(encoders):
    from edje.training.batches import TrainBatch
    from edje.training.caption_rewrites import FlipBalance, flip_relations
    from edje.training.negatives import Negatives
    from edje.training.objectives import EDJEObjectives

    class Model(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder, self.adapter = encoder, torch.nn.Identity()
    _, grown = encoders
    caps = ["a red circle to the left of a blue square", "a big star", "a disc above a cross"]
    batch = TrainBatch(["a", "b", "c"], caps, torch.randn(3, 4, 64), torch.randn(3, 8), torch.randn(3, 8))
    neg = Negatives(torch.randn(3, 1, 4, 64), [[caps[1]], [caps[2]], [caps[0]]])
    balance = FlipBalance(caps + [flip_relations(caps[0])], axis=None)
    out = EDJEObjectives(Model(grown), ("itm", "flip"), {}, flip_balance=balance)(batch, neg)
    assert float(out["loss_flip"]) > 0 and 0 <= float(out["flip_acc"]) <= 1
    with pytest.raises(ValueError, match="needs the itm objective"):
        EDJEObjectives(Model(grown), ("mlm", "flip"), {})(batch, neg)
