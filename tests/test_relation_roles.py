"""The parse of spatial prepositions gives each relation word its subject and object, on every caption template."""
from edje.model.relation_roles import NUM_ROLES, OBJECT, RELATION, SUBJECT, role_matrix, word_roles
from edje.sampleworld.grounding import NOUN_WORDS  # the diagnostic parse's word list, as its checkpoints record it


def roles_by_word(caption):
    names = {RELATION: "rel", SUBJECT: "subj", OBJECT: "obj"}
    return {w: sorted(f"{names[r % 3]}{r // 3}" for r in held) for w, held in zip(caption.split(), word_roles(caption, NOUN_WORDS)) if held}


def test_plain_inverse_pronoun_and_absolute_forms():
    assert roles_by_word("a red circle to the left of a blue square") == {
        "red": ["subj0"], "circle": ["subj0"], "left": ["rel0"], "blue": ["obj0"], "square": ["obj0"]}
    # "there is X and, to its right, Y": Y is right of X
    got = roles_by_word("there is a red circle and, to its right, a blue square")
    assert got["circle"] == ["obj0"] and got["square"] == ["subj0"] and got["its"] == ["obj0"]
    # "B between A on the left and C on the right": two relations with B as the object of both
    got = roles_by_word("a big star between a red circle on the left and a blue square on the right")
    assert got["star"] == ["obj0", "obj1"] and got["circle"] == ["subj0"] and got["square"] == ["subj1"]
    # "A is left of it and C is right of it"
    got = roles_by_word("there is a star; a red circle is left of it and a blue square is right of it")
    assert got["circle"] == ["subj0"] and got["square"] == ["subj1"] and got["star;"] == ["obj0", "obj1"]


def test_sample_world_captions_agree_with_their_scenes():
    from edje.sampleworld.captions import SHAPE_WORDS
    from edje.sampleworld.world import WorldConfig, sample_records

    SHAPE_OF = {piece: shape for shape, words in SHAPE_WORDS.items() for w in words for piece in w.split()}

    recs = sample_records(WorldConfig(seed=100, n_train=200, n_val=0, n_test=0))
    checked = 0
    for r in recs:
        if len(r.scene.objects) != 2:
            continue
        for c in r.captions:
            words, roles = c.split(), word_roles(c, NOUN_WORDS)
            rel = [w for w, s in zip(words, roles) if RELATION in s]
            if rel not in (["left"], ["right"]):
                continue
            shape_of = {o.shape: o for o in r.scene.objects}
            if len(shape_of) < 2:
                continue

            def named(role, words=words, roles=roles, shape_of=shape_of):
                return next(shape_of[SHAPE_OF[w.strip(",;")]] for w, s in zip(words, roles)
                            if role in s and w.strip(",;") in SHAPE_OF)
            sub, obj = named(SUBJECT), named(OBJECT)
            assert (sub.center[0] < obj.center[0]) == (rel == ["left"]), c
            checked += 1
    assert checked > 50


def test_role_matrix_spreads_word_roles_over_wordpieces():
    m = role_matrix("a rhombus left of a star", lambda w: 2 if w == "rhombus" else 1, NOUN_WORDS)
    assert m.shape == (7, NUM_ROLES)
    assert m[1, SUBJECT] == m[2, SUBJECT] == 1 and m[3, RELATION] == 1 and m[6, OBJECT] == 1
