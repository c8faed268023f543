"""Perfect scene tokens (the binding ceiling's token source) and their tables."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edje.sampleworld.family import sample_family
from edje.sampleworld.scene_tokens import SCENE_TOKENS_BACKBONE, SceneTokenConfig, SceneTokenizer
from edje.schemas.token_table import decode_tokens, read_token_table, vector_matrix


def _attribute_at(tok: SceneTokenizer, tokens: np.ndarray, table: dict) -> list:
    # The attribute vector with the largest projection, per cell (vectors are unit and nearly orthogonal).
    names = list(table)
    proj = (tokens - tok.position) @ np.stack([table[n] for n in names]).T
    return [names[i] for i in proj.argmax(1)]


def test_each_objects_cells_carry_its_own_attributes_and_twins_differ():
    tok = SceneTokenizer()
    rng = np.random.default_rng(3)
    for _ in range(20):
        family = sample_family(rng, 4)
        base = family[0].scene
        t = tok.tokens(base)
        assert t.shape == (64, 128) and t.dtype == np.float32
        colours, shapes = _attribute_at(tok, t, tok.colour), _attribute_at(tok, t, tok.shape)
        g = tok.cfg.grid
        for o in base.objects:
            # the cell holding the object's centre
            cell = min(int(o.center[1] * g), g - 1) * g + min(int(o.center[0] * g), g - 1)
            assert (colours[cell], shapes[cell]) == (o.colour, o.shape)
        for twin in family[1:]:
            # same words, another binding: the tokens must differ
            assert np.linalg.norm(tok.tokens(twin.scene) - t, axis=1).max() > 0.5
        assert np.array_equal(SceneTokenizer().tokens(base), t)  # deterministic


def test_the_same_bag_of_attributes_is_not_the_same_tokens():
    tok = SceneTokenizer()
    rng = np.random.default_rng(5)
    fam = next(f for f in (sample_family(rng, 4) for _ in range(100)) if any(m.role == "colour_swap" for m in f))
    twin = next(m for m in fam if m.role == "colour_swap")
    a, b = tok.tokens(fam[0].scene), tok.tokens(twin.scene)
    # The sum over cells (a bag of attributes, position-free) differs only through object areas,
    # while the per-cell binding differs where the swapped objects lie.
    assert (np.linalg.norm(a - b, axis=1) > 0.5).sum() >= 2


def test_scene_token_tables_name_their_source_and_keep_the_backbones_embeddings(tmp_path):
    import open_clip

    from edje.evaluation.tables import encode_annotations
    from edje.model.backbone import VisionBackbone
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.config import BackboneConfig, EDJEConfig
    from edje.training.config import ModelSpec
    from edje.training.model_init import check_backbone, edje_config

    generate(WorldConfig(seed=9, n_train=0, n_val=0, n_test=16), tmp_path / "world")
    torch.manual_seed(0)
    weights = tmp_path / "bb.safetensors"
    save_file({k: v.contiguous() for k, v in open_clip.create_model("edje-tiny-clip").state_dict().items()}, str(weights))
    bb = VisionBackbone.create(BackboneConfig("edje-tiny-clip", pretrained=str(weights)))
    ann = str(tmp_path / "world" / "flickr30k_test.json")
    encode_annotations(ann, bb, str(tmp_path / "real.parquet"))
    encode_annotations(ann, bb, str(tmp_path / "scene.parquet"), scene_tokens=str(tmp_path / "world"))
    real, real_meta = read_token_table(str(tmp_path / "real.parquet"))
    scene, meta = read_token_table(str(tmp_path / "scene.parquet"))
    assert meta.backbone == SCENE_TOKENS_BACKBONE and meta.pretrained == SceneTokenConfig().pretrained_tag
    assert (meta.embedding_backbone, meta.embedding_pretrained) == ("edje-tiny-clip", str(weights))
    assert meta.first_stage_backbone() == BackboneConfig("edje-tiny-clip", str(weights))
    # The first stage is the backbone's, row for row; the tokens are the scene's.
    assert scene.column("image_id").to_pylist() == real.column("image_id").to_pylist()
    np.testing.assert_array_equal(vector_matrix(scene.column("image_embedding")), vector_matrix(real.column("image_embedding")))
    from edje.sampleworld.world import load_world
    by_id = load_world(tmp_path / "world").by_id()
    want = SceneTokenizer().batch([by_id[i].scene for i in scene.column("image_id").to_pylist()])
    np.testing.assert_allclose(decode_tokens(scene, meta), want, atol=2e-3)
    # A model built on scene tokens is refused on backbone tables, and the other way round.
    scene_cfg = edje_config(ModelSpec(adapter="local", bert_config=(("hidden_size", 32), ("num_hidden_layers", 1),
                                                                     ("num_attention_heads", 2), ("intermediate_size", 64))), meta)
    assert isinstance(scene_cfg, EDJEConfig) and scene_cfg.backbone.name == SCENE_TOKENS_BACKBONE
    with pytest.raises(ValueError, match="sampleworld-scene-tokens"):
        check_backbone(scene_cfg, real_meta, "scene checkpoint")
    # ... and on another world kind's scene tokens (same name and width, another tokenizer).
    check_backbone(scene_cfg, meta, "scene checkpoint")
    with pytest.raises(ValueError, match="scene-graph/open"):
        check_backbone(scene_cfg, replace(meta, pretrained="scene-graph/open/grid8/w128/seed0"), "scene checkpoint")
    real_cfg = edje_config(ModelSpec(adapter="local", bert_config=(("hidden_size", 32), ("num_hidden_layers", 1),
                                                                   ("num_attention_heads", 2), ("intermediate_size", 64))), real_meta)
    with pytest.raises(ValueError):
        check_backbone(real_cfg, meta, "backbone checkpoint")
