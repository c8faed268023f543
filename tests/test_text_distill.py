"""A backbone's text tower distilled into the packaged MiniLM on captions alone: the student keeps the teacher's image
tower bit for bit and its language model's lower layers as packaged, moves towards the teacher's caption embeddings,
resumes from its checkpoint to the same weights as a run never stopped, and loads in serving as any backbone."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from minilm_layers import assert_image_tower_kept_and_top_layer_alone_trained
from safetensors.torch import load_file, save_file

from edje.model.backbone import VisionBackbone
from edje.model.backbone_registry import open_clip_registry
from edje.model.image_decode import load_image_files
from edje.sampleworld import generate
from edje.sampleworld.open_world import open_world_config
from edje.schemas.annotations import load_annotations
from edje.schemas.config import BackboneConfig
from edje.training.backbone import image_embeddings, text_embeddings
from edje.training.text_distill import TextDistillConfig, distill_text_tower, length_bucketed_order

MODEL = "edje-tiny-convvit-128-minilm"
TEACHER = "checkpoints/edje-open-convvit-128.safetensors"


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(open_world_config(seed=23, n_train=24, n_val=8, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("open"))


def _config(world, tmp_path, name: str, **kw) -> TextDistillConfig:
    return TextDistillConfig(train_annotations=(str(world.root / "flickr30k_train.json"),),
                             output=str(tmp_path / f"{name}.safetensors"), **{
                                 "teacher": TEACHER, "eval_annotations": str(world.root / "flickr30k_val.json"), "epochs": 2,
                                 "batch_size": 16, "lr": 1e-3, "warmup_steps": 2, "unlocked_text_layers": 1,
                                 "text_augment": 0.5, **kw})


def _agreement(path: str, captions: list) -> float:
    """Mean cosine between a backbone's caption embeddings and the teacher's."""
    open_clip = open_clip_registry()
    teacher = open_clip.create_model("edje-tiny-convvit-128", pretrained=TEACHER)
    student = open_clip.create_model(MODEL, pretrained=path)
    a = text_embeddings(teacher, open_clip.get_tokenizer("edje-tiny-convvit-128"), captions)
    b = text_embeddings(student, open_clip.get_tokenizer(MODEL), captions)
    return float((a * b).sum(1).mean())


def test_the_student_learns_the_teachers_captions_on_its_image_tower_and_resumes(world, tmp_path, minilm_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    cfg = _config(world, tmp_path, "whole", storage_path=str(tmp_path / "runs"), checkpoint_every=2)
    # The start: the packaged MiniLM with a fresh projection (one step at lr 0 writes it out).
    start = distill_text_tower(replace(cfg, output=str(tmp_path / "start.safetensors"), epochs=1, lr=0.0,
                                       storage_path=None), log=quiet)
    record = distill_text_tower(cfg, log=quiet)
    assert record["complete"] and [r["epoch"] for r in record["history"]] == [1, 2]
    assert record["history"][-1]["teacher_recall"]["t2i"]["r1"] > 0 and "recall" in record["history"][-1]
    captions = load_annotations(str(world.root / "flickr30k_train.json")).captions
    before, after = _agreement(str(tmp_path / "start.safetensors"), captions), _agreement(cfg.output, captions)
    assert after > before + 0.2, (before, after, start["history"])

    assert_image_tower_kept_and_top_layer_alone_trained(TEACHER, cfg.output, minilm_path)
    student = load_file(cfg.output)

    # Stopped after its third step (its checkpoint at step 2), then rerun: the weights of the run never stopped.
    def stop_at_third(line: str) -> None:
        if "batch 3/" in line:
            raise Stop
    stopped = replace(cfg, output=str(tmp_path / "stopped.safetensors"), name="stopped")
    with pytest.raises(Stop):
        distill_text_tower(stopped, log=stop_at_third)
    lines = []
    distill_text_tower(stopped, log=lines.append)
    assert any("resumed from" in line and "at step 2 (epoch 1, batch 2)" in line for line in lines), lines
    again = load_file(stopped.output)
    assert all(torch.equal(again[k], student[k]) for k in student)
    with pytest.raises(ValueError, match="written by a different run"):
        distill_text_tower(replace(stopped, lr=5e-4), log=quiet)

    # Serving's backbone loads the student as any backbone and reads captions as it does.
    backbone = VisionBackbone.create(BackboneConfig(name=MODEL, pretrained=cfg.output))
    clip = open_clip_registry().create_model(MODEL, pretrained=cfg.output)
    want = torch.from_numpy(text_embeddings(clip, open_clip_registry().get_tokenizer(MODEL), captions[:5]))
    assert torch.allclose(backbone.encode_text(captions[:5]), want, atol=1e-5)


def test_an_image_bank_teaches_the_teachers_order_of_images(world, tmp_path):
    torch.set_num_threads(1)
    train = str(world.root / "flickr30k_train.json")
    lines = []
    cfg = _config(world, tmp_path, "bank", image_bank=train, epochs=3)
    plain = replace(cfg, image_bank=None, output=str(tmp_path / "plain.safetensors"))
    distill_text_tower(plain, log=lambda s: None)
    distill_text_tower(cfg, log=lines.append)
    assert any(line.startswith("an image bank of 24 images from ") for line in lines), lines

    # KL from the teacher's softmax over the bank's images to the student's, over the training captions.
    open_clip = open_clip_registry()
    teacher = open_clip.create_model("edje-tiny-convvit-128", pretrained=TEACHER)
    ann = load_annotations(train)
    pixels = torch.from_numpy(load_image_files(ann.image_paths, 128))
    bank = torch.from_numpy(image_embeddings(teacher, pixels))
    scale = float(teacher.logit_scale.detach().exp())
    want = F.softmax(scale * torch.from_numpy(
        text_embeddings(teacher, open_clip.get_tokenizer("edje-tiny-convvit-128"), ann.captions)) @ bank.T, dim=-1)

    def kl(path: str) -> float:
        student = open_clip.create_model(MODEL, pretrained=path)
        own = torch.from_numpy(text_embeddings(student, open_clip.get_tokenizer(MODEL), ann.captions))
        return float(F.kl_div(F.log_softmax(scale * own @ bank.T, dim=-1), want, reduction="batchmean"))

    # The cosine alone brings the order part of the way; the bank's KL beyond it.
    assert kl(cfg.output) < 0.7 * kl(plain.output)
    with pytest.raises(ValueError, match="bank_weight must be >= 0"):
        replace(cfg, bank_weight=-1.0)


def test_a_teacher_or_student_that_cannot_pair_is_refused(world, tmp_path):
    quiet = lambda s: None
    with pytest.raises(ValueError, match="image tower is not edje-tiny-convvit.s"):
        distill_text_tower(_config(world, tmp_path, "a", teacher="checkpoints/edje-tiny-convvit-sw.safetensors"),
                           log=quiet)
    with pytest.raises(ValueError, match="names no hf_model_name"):
        distill_text_tower(_config(world, tmp_path, "b", model="edje-tiny-convvit-128"), log=quiet)
    bare = tmp_path / "bare.safetensors"
    save_file({"w": torch.zeros(1)}, str(bare))
    with pytest.raises(ValueError, match="names no model in its metadata"):
        distill_text_tower(_config(world, tmp_path, "c", teacher=str(bare)), log=quiet)
    with pytest.raises(ValueError, match="text_augment must be in"):
        _config(world, tmp_path, "d", text_augment=2.0)


def test_batches_are_cut_from_windows_sorted_by_length():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 50, 1000)
    order = length_bucketed_order(lengths, 64, rng, window=4)
    assert sorted(order.tolist()) == list(range(1000))  # every caption once
    batches = [lengths[order[i:i + 64]] for i in range(0, 960, 64)]
    random = [lengths[rng.permutation(1000)[:64]] for _ in range(15)]
    # Padding to the batch's longest caption wastes far less than in random batches.
    assert np.mean([b.max() - b.mean() for b in batches]) < 0.5 * np.mean([b.max() - b.mean() for b in random])
