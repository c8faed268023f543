"""Vision backbone over open_clip: native and timm towers, feature layers, local checkpoints."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edje.model.backbone import VisionBackbone
from edje.model.backbone_registry import open_clip_registry
from edje.schemas.config import BackboneConfig

open_clip = open_clip_registry()  # with the project's configs (edje-tiny-clip, ...) registered


@pytest.mark.parametrize("name,shape", [("edje-tiny-clip", (65, 128)), ("edje-tiny-timm", (64, 96))])
@pytest.mark.parametrize("layer", ["final", "penultimate"])
def test_token_shapes_for_native_and_timm_towers(name, shape, layer):
    bb = VisionBackbone.create(BackboneConfig(name, feature_layer=layer))
    assert bb.is_timm == (name == "edje-tiny-timm")
    images = torch.randint(0, 256, (3, 64, 64, 3), dtype=torch.uint8)
    tokens, pooled = bb.encode(images)
    assert tuple(tokens.shape) == (3, *shape) and bb.token_shape == shape
    assert torch.allclose(pooled.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert torch.allclose(bb.encode_image(images), pooled, atol=1e-5)
    assert torch.allclose(bb.encode_tokens(images), tokens)
    text = bb.encode_text(["a red circle", "a blue square"])
    assert text.shape == (2, bb.embed_dim) and torch.allclose(text.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert not any(p.requires_grad for p in bb.parameters()) and not bb.training


def test_final_layer_is_post_norm_and_penultimate_differs():
    final = VisionBackbone.create(BackboneConfig("edje-tiny-clip", feature_layer="final"))
    pen = VisionBackbone.create(BackboneConfig("edje-tiny-clip", feature_layer="penultimate"))
    pen.load_state_dict(final.state_dict())
    x = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    t_final, t_pen = final.encode_tokens(x), pen.encode_tokens(x)
    assert not torch.allclose(t_final, t_pen)
    # final tokens come out of ln_post: per-token mean ~ bias, so they are LayerNorm-normalised
    ln = final.visual.ln_post
    manual = ln(final.visual.forward_intermediates(final.normalize(x), indices=[3], output_fmt="NLC",
                                                   output_extra_tokens=True)["image_intermediates"][0])
    assert torch.allclose(t_final[:, 1:], manual, atol=1e-5)


def test_preprocessing_belongs_to_the_model():
    bb = VisionBackbone.create(BackboneConfig("edje-tiny-clip"))
    assert bb.preprocess.size == 64
    assert bb.preprocess.mean == tuple(open_clip.OPENAI_DATASET_MEAN)
    big = torch.randint(0, 256, (1, 128, 128, 3), dtype=torch.uint8)
    assert bb.normalize(big).shape == (1, 3, 64, 64)


def test_loads_a_local_safetensors_checkpoint(tmp_path):
    src = open_clip.create_model("edje-tiny-clip")
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    bb = VisionBackbone.create(BackboneConfig("edje-tiny-clip", pretrained=str(path)))
    x = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    ref = VisionBackbone(src, BackboneConfig("edje-tiny-clip"))
    assert torch.allclose(bb.encode_image(x), ref.encode_image(x), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VisionBackbone.create(BackboneConfig("edje-tiny-clip", pretrained=str(tmp_path / "missing" / "x.safetensors")))


def test_bad_images_get_clear_errors():
    bb = VisionBackbone.create(BackboneConfig("edje-tiny-clip"))
    with pytest.raises(ValueError, match=r"\[B, H, W, 3\]"):
        bb.encode(torch.zeros((2, 64, 64, 4), dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8 or floating"):
        bb.encode(torch.zeros((2, 64, 64, 3), dtype=torch.int32))
    with pytest.raises(ValueError, match="4-d"):
        bb.encode(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="feature_layer"):
        BackboneConfig("edje-tiny-clip", feature_layer="middle")
    with pytest.raises(TypeError, match="list of strings"):
        bb.encode_text("not a list")


def test_backbone_is_built_and_probed_on_the_weights_device():
    """The meta device stands in for a GPU: weights, buffers and the probe must all be on it (the probe
    once ran on the CPU against weights open_clip had already moved, and crashed every GPU encode worker)."""
    bb = VisionBackbone.create(BackboneConfig("edje-tiny-clip"), device="meta")
    assert {t.device.type for t in [*bb.parameters(), *bb.buffers()]} == {"meta"}
    assert bb.token_shape[0] > 0 and bb.embed_dim > 0


def test_a_weights_file_replaced_in_place_is_refused(tmp_path):
    # A retrained backbone written over the shipped file must not silently pair with tables and
    # checkpoints made from the old weights: the recorded sha256 catches it.
    from edje.schemas.token_table import TableMetadata
    from edje.schemas.weights import weights_sha256
    from edje.training.model_init import ModelSpec, check_backbone, edje_config

    path = tmp_path / "tiny.safetensors"
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in open_clip.create_model("edje-tiny-clip").state_dict().items()}, str(path))
    old = weights_sha256(str(path))
    cfg = BackboneConfig("edje-tiny-clip", pretrained=str(path), weights_sha256=old)
    VisionBackbone.create(cfg)  # the recorded weights: fine
    meta = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained=str(path), feature_layer="final",
                         num_tokens=65, width=128, quantization="fp16", embed_dim=64, pretrained_sha256=old)
    model_cfg = edje_config(ModelSpec(adapter="local", bert_config=(("hidden_size", 32), ("num_hidden_layers", 1),
                                                                    ("num_attention_heads", 2), ("intermediate_size", 64))), meta)
    assert model_cfg.backbone.weights_sha256 == old  # a checkpoint records the tables' weights
    torch.manual_seed(1)
    save_file({k: v.contiguous() for k, v in open_clip.create_model("edje-tiny-clip").state_dict().items()}, str(path))
    new = weights_sha256(str(path))
    assert new != old
    with pytest.raises(ValueError, match="was replaced"):
        VisionBackbone.create(cfg)
    with pytest.raises(ValueError, match="was replaced"):
        VisionBackbone.create(meta.first_stage_backbone())  # the query tower of a table made with the old weights
    retrained = TableMetadata(**{**meta.__dict__, "pretrained_sha256": new})
    with pytest.raises(ValueError, match="retrained backbone needs a retrained adapter"):
        check_backbone(model_cfg, retrained, "old checkpoint")
    assert weights_sha256("openai") is None and weights_sha256(None) is None  # tags have no file to hash


def test_a_reranker_starts_whole_on_a_backbone_trained_on_only_when_asked(tmp_path):
    """`--init CK --init-on-new-backbone`: a checkpoint made on one backbone's weights starts a run on tables of the
    same backbone with other weights, or of a tower with tokens of the same shape, its adapter kept, and what it
    trains names the tables' backbone; without the flag the run is refused, and the flag without --init is refused."""
    from edje.model.edje import EDJEModel, save_checkpoint
    from edje.schemas.token_table import TableMetadata
    from edje.training.launch import build_parser, config_from_args
    from edje.training.model_init import ModelSpec, build_model, edje_config

    bert = (("hidden_size", 32), ("num_hidden_layers", 1), ("num_attention_heads", 2), ("intermediate_size", 64))
    old = TableMetadata(kind="raw", backbone="edje-tiny-clip", pretrained="a.safetensors", feature_layer="final",
                        num_tokens=65, width=128, quantization="fp16", embed_dim=64, pretrained_sha256="a" * 64)
    new = TableMetadata(**{**old.__dict__, "pretrained": "b.safetensors", "pretrained_sha256": "b" * 64})
    spec = ModelSpec(adapter="local", bert_config=bert)
    torch.manual_seed(0)
    save_checkpoint(EDJEModel(edje_config(spec, old)), str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="retrained backbone needs a retrained adapter"):
        build_model(spec, new, init_checkpoint=str(tmp_path / "ck"))
    start = build_model(spec, old, init_checkpoint=str(tmp_path / "ck"))
    moved = build_model(spec, new, init_checkpoint=str(tmp_path / "ck"), new_backbone=True)
    assert (moved.config.backbone.pretrained, moved.config.backbone.weights_sha256) == ("b.safetensors", "b" * 64)
    assert start.config.backbone.weights_sha256 == "a" * 64
    assert all(torch.equal(v, start.state_dict()[k]) for k, v in moved.state_dict().items())
    save_checkpoint(moved, str(tmp_path / "moved"))
    build_model(spec, new, init_checkpoint=str(tmp_path / "moved"))  # its checkpoints pair with the new tables
    # A deeper tower grown from the one trained on: another name, tokens of the same count and width.
    deeper = TableMetadata(**{**new.__dict__, "backbone": "edje-tiny-clip-d8"})
    with pytest.raises(ValueError, match="trained on edje-tiny-clip/final tokens, the tables hold edje-tiny-clip-d8"):
        build_model(spec, deeper, init_checkpoint=str(tmp_path / "ck"))
    grown = build_model(spec, deeper, init_checkpoint=str(tmp_path / "ck"), new_backbone=True)
    assert grown.config.backbone.name == "edje-tiny-clip-d8"
    assert all(torch.equal(v, start.state_dict()[k]) for k, v in grown.state_dict().items())
    for other in ({"num_tokens": 64}, {"width": 96}):
        with pytest.raises(ValueError, match="adapter reads"):
            build_model(spec, TableMetadata(**{**deeper.__dict__, **other}), init_checkpoint=str(tmp_path / "ck"),
                        new_backbone=True)
    parse = build_parser("d", 3e-4, ("itm",)).parse_args
    assert config_from_args(parse(["--tables", "t", "--storage-path", "s", "--name", "n", "--init", "ck",
                                   "--init-on-new-backbone"])).init_on_new_backbone
    with pytest.raises(ValueError, match="init_on_new_backbone qualifies --init"):
        config_from_args(parse(["--tables", "t", "--storage-path", "s", "--name", "n", "--init-on-new-backbone"]))
