"""The held-out-combination split: a training world that never shows some attribute combinations, a test
world made only of them, and default worlds unchanged."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS
from edje.sampleworld.grounding import noun_phrases
from edje.sampleworld.held_out import HeldOut, object_sides
from edje.sampleworld.phrases import PRONOUN_RELATION, RELATION_WORDS, SIDE, bare
from edje.sampleworld.relations import INVERSE
from edje.sampleworld.scene import Scene, SceneObject
from edje.sampleworld.world import WorldConfig, generate, load_world, sample_records

COMBOS = ("red+circle", "large+square", "blue+star")


def _objects(records):
    return [o for r in records for o in r.scene.objects]


def test_exclude_and_only_worlds():
    held = HeldOut.parse(COMBOS)
    train = sample_records(WorldConfig(seed=3, n_train=400, n_val=40, n_test=0, held_out=COMBOS))
    assert train and not any(held.in_scene(r.scene) for r in train)
    test = sample_records(WorldConfig(seed=4, n_train=0, n_val=0, n_test=200, held_out=COMBOS, held_out_mode="only"))
    assert len(test) == 200 and all(held.in_scene(r.scene) for r in test)
    # every withheld combination shows up in the test world, and families keep their twins
    seen = {(a, b) for a, b in held.combos for o in _objects(test) if {a, b} <= {o.colour, o.shape, o.size}}
    assert seen == set(held.combos)
    assert len({r.family_id for r in test}) == 50 and {r.role for r in test} - {"base"}


def test_default_worlds_keep_their_bytes():
    a = sample_records(WorldConfig(seed=11, n_train=40, n_val=8, n_test=8))
    b = sample_records(WorldConfig(seed=11, n_train=40, n_val=8, n_test=8, held_out=()))
    assert [r.to_json() for r in a] == [r.to_json() for r in b]


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="VALUE\\+VALUE"):
        HeldOut.parse(["red-circle"])
    with pytest.raises(ValueError, match="unknown attribute"):
        HeldOut.parse(["red+hexagon"])
    with pytest.raises(ValueError, match="two different attributes"):
        HeldOut.parse(["red+blue"])
    with pytest.raises(ValueError, match="mode"):
        HeldOut.parse(["red+circle"], mode="some")


def test_cli_writes_the_split_and_world_json_records_it(tmp_path):
    out = tmp_path / "held"
    subprocess.run([sys.executable, "-m", "sampleworld", "generate", "--seed", "5", "--n-train", "0", "--n-val", "0",
                    "--n-test", "16", "--image-size", "32", "--held-out", *COMBOS, "--held-out-mode", "only",
                    "--out", str(out)], check=True, cwd=Path(__file__).resolve().parent.parent)
    cfg = json.loads((out / "world.json").read_text())["config"]
    assert cfg["held_out"] == list(COMBOS) and cfg["held_out_mode"] == "only"
    world = load_world(out)
    assert world.config.held_out == COMBOS and all(HeldOut.parse(COMBOS).in_scene(r.scene) for r in world.images)
    generate(WorldConfig(seed=6, n_train=8, n_val=0, n_test=0, image_size=32, held_out=COMBOS), tmp_path / "ex")


# --- relation values: "star+left" is a star left of another object, as the captions state relations ----------------

_WORD_VALUE = {part: value for table in (SIZE_WORDS, COLOUR_WORDS, SHAPE_WORDS)
               for value, words in table.items() for w in words for part in w.split()}
# A caption's relation phrase -> its predicate, and whose side it is: "rel" ("X left of Y": X is the subject, Y the
# reference) or "it" ("... to its left", "... on the left", "... is above it": the reference is the caption's
# first object, named before the pronoun or "between").
_PHRASES = {**{tuple(w.split()): (p, "rel") for p, ws in RELATION_WORDS.items() for w in ws},
            **{tuple(w.split()): (p, "it") for p, w in PRONOUN_RELATION.items()},
            **{tuple(w.split()): (p, "it") for p, w in SIDE.items()}}


def _object_of(words, scene):
    """The one object a noun phrase names."""
    values = {_WORD_VALUE[bare(w)] for w in words}
    (index,) = [i for i, o in enumerate(scene.objects) if values <= {o.size, o.colour, o.shape}]
    return index


def _spans(words):
    """Noun-phrase spans, cut after a comma or semicolon ("a red star; a blue circle" names two objects)."""
    out = []
    for start, end in noun_phrases(words):
        for i in range(start, end):
            if words[i][-1] in ",;" or i == end - 1:
                out.append((start, i + 1))
                start = i + 1
    return out


def _match(words, at):
    """(predicate, kind, end) of the longest relation phrase starting at word ``at``, or None."""
    for n in (4, 3, 2, 1):
        key = tuple(bare(w) for w in words[at:at + n])
        if len(key) == n and key in _PHRASES:
            return (*_PHRASES[key], at + n)
    return None


def _stated(caption, scene):
    """Every (subject, predicate, reference) a caption states, read from its words, each also the other way round."""
    words = caption.split()
    spans = _spans(words)
    first = _object_of(words[spans[0][0]:spans[0][1]], scene)
    facts, i = set(), 0
    while i < len(words):
        m = _match(words, i)
        if m is None:
            i += 1
            continue
        pred, kind, end = m
        if end < len(words) and bare(words[end]) == "it":  # "a is to the left of it"
            kind, end = "it", end + 1
        before = [s for s in spans if s[1] <= i][-1]
        after = next((s for s in spans if s[0] >= end), None)
        if kind == "rel":
            subject, reference = _object_of(words[slice(*before)], scene), _object_of(words[slice(*after)], scene)
        else:  # "there is x and, to its right, y": y is the subject; "b with a to its left": a is
            near = after if words[end - 1].endswith(",") else before
            subject, reference = _object_of(words[slice(*near)], scene), first
        facts |= {(subject, pred, reference), (reference, INVERSE[pred], subject)}
        i = end
    return facts


def _scene_facts(scene):
    """The scene's relations, each also the other way round."""
    return ({(r.subject, r.predicate, r.object) for r in scene.relations}
            | {(r.object, INVERSE[r.predicate], r.subject) for r in scene.relations})


def _star_left_in_image(scene):
    """A star left of another object in one row of cells (the grid the captions' relations come from)."""
    objs = scene.objects
    return any(a.shape == "star" and a.cell[1] == b.cell[1] and a.cell[0] < b.cell[0] for a in objs for b in objs)


def _states_star_left(facts, scene):
    """Whether the facts hold a star left of something."""
    return any(p == "left_of" and scene.objects[s].shape == "star" for s, p, _ in facts)


def _scene(*placed):
    """A scene of (shape, cell) objects with distinct colours."""
    colours = ("red", "blue", "green")
    return Scene(tuple(SceneObject(shape, colours[k], "small", cell, (0.5, 0.5)) for k, (shape, cell) in enumerate(placed)),
                 (128, 128, 128))


def test_a_relation_value_parses_and_names_the_side_the_captions_state():
    held = HeldOut.parse(["star+left", "red+above"])
    assert held.combos == (("star", "left"), ("red", "above"))
    star_left = HeldOut.parse(["star+left"])
    assert star_left.in_scene(_scene(("star", (0, 1)), ("circle", (1, 1))))  # "a star left of a circle"
    assert star_left.in_scene(_scene(("circle", (2, 1)), ("star", (1, 1))))  # "a circle right of a star"
    assert not star_left.in_scene(_scene(("star", (2, 1)), ("circle", (1, 1))))
    assert not star_left.in_scene(_scene(("star", (1, 0)), ("circle", (1, 1))))  # above is not left
    # three in an L: the star is left of the anchor only; the object above the anchor is diagonal, unrelated
    ell = _scene(("star", (0, 1)), ("circle", (1, 1)), ("square", (1, 0)))
    assert object_sides(ell, 0) == {"left"} and object_sides(ell, 1) == {"right", "below"}
    assert not HeldOut.parse(["star+below"]).in_scene(ell) and HeldOut.parse(["square+above"]).in_scene(ell)


def test_an_exclude_world_neither_shows_nor_states_a_star_left_of_anything(tmp_path):
    config = WorldConfig(seed=21, n_train=200, n_val=0, n_test=0, image_size=32, held_out=("star+left",),
                         same_side_rate=0.25)
    world = load_world(generate(config, tmp_path / "ex").root)
    assert len(world.images) == 200 and sum(any(o.shape == "star" for o in r.scene.objects) for r in world.images) > 40
    for r in world.images:
        assert not _star_left_in_image(r.scene)
        for caption in r.captions:
            facts = _stated(caption, r.scene)
            assert facts == _scene_facts(r.scene), caption  # the reading of the words is the scene's relations
            assert not _states_star_left(facts, r.scene), caption
    # stars still stand right of, above and below things
    assert {s for r in world.images for i, o in enumerate(r.scene.objects) if o.shape == "star"
            for s in object_sides(r.scene, i)} == {"right", "above", "below"}


def test_an_only_world_shows_and_states_it_in_every_image(tmp_path):
    config = WorldConfig(seed=22, n_train=0, n_val=0, n_test=40, image_size=32, held_out=("star+left",),
                         held_out_mode="only", same_side_rate=0.25)
    world = load_world(generate(config, tmp_path / "only").root)
    assert len(world.images) == 40 and {r.role for r in world.images} - {"base"}  # twins too
    for r in world.images:
        assert _star_left_in_image(r.scene)
        for caption in r.captions:
            facts = _stated(caption, r.scene)
            assert facts == _scene_facts(r.scene) and _states_star_left(facts, r.scene), caption


def test_two_relation_values_or_an_unknown_one_are_refused():
    with pytest.raises(ValueError, match="both are relation values.*two different attributes"):
        HeldOut.parse(["left+above"])
    with pytest.raises(ValueError, match="unknown attribute value 'up'"):
        HeldOut.parse(["star+up"])
    with pytest.raises(ValueError, match="unknown attribute value 'left_of'"):
        HeldOut.parse(["star+left_of"])
