"""A backbone whose text tower is a pretrained language model (open_clip's HF text tower): its config names the
packaged all-MiniLM-L6-v2 by hub id and builds offline from the package's copy; LiT trains its top layers on a locked
image tower; serving's backbone loads what training wrote and reads each caption as training did."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from minilm_layers import assert_image_tower_kept_and_top_layer_alone_trained

from edje.model.backbone import VisionBackbone, is_hf_text, trim_padding
from edje.model.backbone_registry import PACKAGED_LANGUAGE_MODEL, open_clip_registry
from edje.sampleworld import generate
from edje.sampleworld.open_world import open_world_config
from edje.schemas.config import BackboneConfig
from edje.training.backbone import BackboneTrainConfig, train_backbone

MODEL = "edje-tiny-convvit-128-minilm"
CAPTIONS = ["a small dog (facing left) left of a large cat", "two cats", "three right-facing wolves above a taxi"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(open_world_config(seed=17, n_train=32, n_val=8, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("open"))


def _config(world, tmp_path, name: str, **kw) -> BackboneTrainConfig:
    return BackboneTrainConfig(str(world.root / "flickr30k_train.json"), str(tmp_path / f"{name}.safetensors"), **{
        "eval_annotations": str(world.root / "flickr30k_val.json"), "epochs": 1, "batch_size": 16,
        "world": str(world.root / "world.json"), **kw})


def test_the_config_naming_the_packaged_language_model_builds_from_its_copy(minilm_path):
    from transformers import AutoModel

    open_clip = open_clip_registry()
    text_cfg = open_clip.get_model_config(MODEL)["text_cfg"]
    assert text_cfg["hf_model_name"] == text_cfg["hf_tokenizer_name"] == minilm_path != PACKAGED_LANGUAGE_MODEL
    clip = open_clip.create_model(MODEL)
    assert is_hf_text(clip) and not is_hf_text(open_clip.create_model("edje-tiny-convvit-128"))
    pretrained = AutoModel.from_pretrained(minilm_path).state_dict()
    built = clip.text.transformer.state_dict()
    assert all(torch.equal(built[k], pretrained[k]) for k in built), "the text tower is not the packaged MiniLM"


def test_trimmed_padding_leaves_every_text_embedding_as_it_was():
    open_clip = open_clip_registry()
    for name, trimmed in ((MODEL, True), ("edje-tiny-convvit-128", False)):
        clip = open_clip.create_model(name).eval()
        ids = open_clip.get_tokenizer(name)(CAPTIONS)
        short = trim_padding(clip, ids)
        # The longest caption's last token is the last column kept; a CLIP tower's ids pass through untouched.
        assert (short.shape[1] < ids.shape[1]) == trimmed and torch.equal(short, ids[:, :short.shape[1]])
        with torch.no_grad():
            assert torch.allclose(clip.encode_text(short), clip.encode_text(ids), atol=1e-5)


def test_lit_trains_the_pretrained_tower_top_layers_on_the_locked_image_tower(world, tmp_path, minilm_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    base = _config(world, tmp_path, "base", model="edje-tiny-convvit-128")
    train_backbone(base, log=quiet)
    lines = []
    lit = _config(world, tmp_path, "lit", model=MODEL, init=base.output, lock_image=True, mirror_fraction=0.5,
                  orientation_negatives=True, unlocked_text_layers=1, lr=1e-3)
    record = train_backbone(lit, log=lines.append)
    assert f"the image tower of edje-tiny-convvit-128 from {base.output}, locked; a pretrained {MODEL} text tower" \
        in lines and record["final_recall"]["t2i"]["r1"] >= 0
    # Below the top layer the tower is MiniLM as packaged (stored fp16); the top layer and the projection trained.
    assert_image_tower_kept_and_top_layer_alone_trained(base.output, lit.output, minilm_path)

    # Serving's backbone loads the file and embeds a caption as the trained model does.
    backbone = VisionBackbone.create(BackboneConfig(name=MODEL, pretrained=lit.output))
    clip = open_clip_registry().create_model(MODEL, pretrained=lit.output).eval()
    with torch.no_grad():
        want = F.normalize(clip.encode_text(open_clip_registry().get_tokenizer(MODEL)(CAPTIONS)), dim=-1)
    assert torch.allclose(backbone.encode_text(CAPTIONS), want, atol=1e-5)

    with pytest.raises(ValueError, match="not a BERT-style encoder with that many layers"):
        train_backbone(replace(lit, unlocked_text_layers=7, output=str(tmp_path / "x.safetensors")), log=quiet)
    with pytest.raises(ValueError, match="edje-tiny-convvit-128's text tower is not one"):
        train_backbone(replace(lit, model="edje-tiny-convvit-128", output=str(tmp_path / "y.safetensors")), log=quiet)
