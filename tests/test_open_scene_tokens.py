"""Perfect scene tokens of the open world (sampleworld/open_scene_tokens.py) and their tables."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edje.sampleworld.open_glyphs import GlyphTable, load_glyphs
from edje.sampleworld.open_scene import GROUP_OFFSETS
from edje.sampleworld.open_scene_tokens import OpenSceneTokenizer
from edje.sampleworld.open_world import OPEN_WORLD, open_world_config
from edje.sampleworld.scene_token_grid import SCENE_TOKENS_BACKBONE, SceneTokenConfig
from edje.sampleworld.shapes_world import SHAPES_WORLD
from edje.sampleworld.world import sample_records


@pytest.fixture(scope="module")
def tok() -> OpenSceneTokenizer:
    return OpenSceneTokenizer()


@pytest.fixture(scope="module")
def records():
    return sample_records(open_world_config(seed=5, n_train=120, n_val=0, n_test=0, family_size=5))


def _nearest(tok: OpenSceneTokenizer, tokens: np.ndarray, table: dict) -> list:
    # The nearest attribute vector (all unit) is the one with the largest projection.
    names = list(table)
    proj = (tokens - tok.position) @ np.stack([table[n] for n in names]).T
    return [names[i] for i in proj.argmax(1)]


def _owned(tok: OpenSceneTokenizer, scene) -> list[np.ndarray]:
    """Per thing: the cells it covers and no later thing covers (later things are drawn over it)."""
    masks = [cells.ravel() for cells, _ in tok.paint(scene)]
    return [m & ~np.logical_or.reduce([np.zeros_like(m), *masks[i + 1:]]) for i, m in enumerate(masks)]


def test_each_things_cells_decode_its_noun_and_attributes_exactly(tok, records):
    g = tok.cfg.grid
    for r in records:
        t = tok.tokens(r.scene)
        assert t.shape == (64, 128) and t.dtype == np.float32
        nouns, sizes, counts = (_nearest(tok, t, table) for table in (tok.noun, tok.size, tok.count))
        facing = (t - tok.position) @ np.stack([tok.facing["left"], tok.facing["right"]]).T
        for o, own in zip(r.scene.objects, _owned(tok, r.scene)):
            cells = np.flatnonzero(own)
            assert len(cells), f"{o.noun} is covered by later things everywhere"
            assert {nouns[c] for c in cells} == {o.noun}
            assert {sizes[c] for c in cells} == {o.size} and {counts[c] for c in cells} == {o.count}
            if o.facing:
                assert {("left", "right")[int(facing[c].argmax())] for c in cells} == {o.facing}
            else:  # no direction: no facing vector at all
                assert np.abs(facing[cells]).max() < 1e-5
        # Each copy's sprite centre lies in a cell its thing covers, as open_render.py places them.
        for o, (cells, _) in zip(r.scene.objects, tok.paint(r.scene)):
            for dx, dy in GROUP_OFFSETS[o.count]:
                x, y = o.center[0] + dx * o.radius, o.center[1] + dy * o.radius
                assert cells[min(int(y * g), g - 1), min(int(x * g), g - 1)]


def test_neighbour_group_nouns_get_independent_vectors_and_noun_twins_differ(tok, records):
    dog, wolf = tok.noun["dog"], tok.noun["wolf"]
    assert "wolf" in load_glyphs().neighbours("dog")
    assert abs(float(dog @ wolf)) < 0.5  # as unrelated as any two random vectors
    nouns = np.stack(list(tok.noun.values()))
    cos = nouns @ nouns.T - np.eye(len(nouns))
    assert cos.max() < 0.8  # every noun is its own nearest, by a margin
    twins = [(r, next(x for x in records if x.family_id == r.family_id and x.role == "base")) for r in records
             if r.role == "noun_swap"]
    assert twins
    for twin, base in twins:
        changed = [i for i, (a, b) in enumerate(zip(base.scene.objects, twin.scene.objects)) if a.noun != b.noun]
        own = _owned(tok, twin.scene)[changed[0]]
        diff = np.linalg.norm(tok.tokens(twin.scene) - tok.tokens(base.scene), axis=1)
        assert (diff[own] > 0.5).all()


def test_background_cells_are_the_background_plus_position(tok, records):
    for r in records[:40]:
        t = tok.tokens(r.scene)
        free = ~np.logical_or.reduce([cells.ravel() for cells, _ in tok.paint(r.scene)])
        assert free.any()
        np.testing.assert_allclose(t[free], (tok.background + tok.position)[free], atol=1e-6)
    assert np.array_equal(OpenSceneTokenizer().tokens(records[0].scene), tok.tokens(records[0].scene))  # fixed


def test_vectors_come_from_the_seed_and_nouns_from_their_name_alone(tok, records):
    other = OpenSceneTokenizer(SceneTokenConfig(seed=1))
    assert not np.allclose(other.tokens(records[0].scene), tok.tokens(records[0].scene))
    # A noun keeps its vector when the glyph table is reordered (or grows).
    reordered = OpenSceneTokenizer(table=GlyphTable(tuple(reversed(load_glyphs().glyphs))))
    assert all(np.array_equal(reordered.noun[n], v) for n, v in tok.noun.items())
    assert tok.pretrained_tag == "scene-graph/open/grid8/w128/seed0"
    with pytest.raises(ValueError, match="width"):
        OpenSceneTokenizer(SceneTokenConfig(width=24))


def test_each_kind_builds_its_own_tokenizer():
    assert isinstance(OPEN_WORLD.scene_tokenizer(SceneTokenConfig()), OpenSceneTokenizer)
    shapes = SHAPES_WORLD.scene_tokenizer(SceneTokenConfig())
    assert shapes.pretrained_tag == SceneTokenConfig().pretrained_tag == "scene-graph/grid8/w128/seed0"


def test_scene_token_tables_of_an_open_world_keep_its_backbones_embeddings(tmp_path):
    from edje.evaluation.tables import main
    from edje.sampleworld.world import generate, load_world
    from edje.schemas.shipped import SHIPPED_BACKBONE_WEIGHTS
    from edje.schemas.token_table import decode_tokens, read_token_table, vector_matrix

    world = generate(replace(open_world_config(seed=13, n_train=0, n_val=0, n_test=4), family_size=4), tmp_path / "world")
    ann = str(tmp_path / "world" / "flickr30k_test.json")
    backbone = ["--annotations", ann]  # the open world's own backbone, found from its world.json
    main([*backbone, "--output", str(tmp_path / "real.parquet")])
    main([*backbone, "--output", str(tmp_path / "scene.parquet"), "--scene-tokens", str(tmp_path / "world")])
    real, _ = read_token_table(str(tmp_path / "real.parquet"))
    scene, meta = read_token_table(str(tmp_path / "scene.parquet"))
    assert meta.backbone == SCENE_TOKENS_BACKBONE and meta.pretrained == "scene-graph/open/grid8/w128/seed0"
    assert meta.embedding_backbone == "edje-tiny-convvit-128"
    assert meta.embedding_pretrained.endswith(SHIPPED_BACKBONE_WEIGHTS["edje-tiny-convvit-128"])
    # The first stage is the open backbone's, row for row; the tokens are the scene's.
    ids = scene.column("image_id").to_pylist()
    assert ids == real.column("image_id").to_pylist() and len(ids) == len(world.images)
    np.testing.assert_array_equal(vector_matrix(scene.column("image_embedding")), vector_matrix(real.column("image_embedding")))
    by_id = load_world(tmp_path / "world").by_id()
    want = OpenSceneTokenizer().batch([by_id[i].scene for i in ids])
    np.testing.assert_allclose(decode_tokens(scene, meta), want, atol=2e-3)
