"""Backbone training (training/backbone.py) on an open world, stopped and resumed from its checkpoint: the
resumed run ends with the weights of a run never stopped."""
from __future__ import annotations

import collections
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from edje.sampleworld import generate
from edje.sampleworld.open_scene import OpenScene
from edje.sampleworld.open_world import open_world_config
from edje.training.backbone import CHECKPOINT, BackboneTrainConfig, train_backbone, world_records


class Killed(Exception):
    """Stands in for the process being killed mid-run."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate(open_world_config(seed=13, n_train=48, n_val=16, n_test=0, image_size=64, family_size=4),
                    tmp_path_factory.mktemp("open"))


def _config(world, tmp_path, name: str, **kw) -> BackboneTrainConfig:
    # Neighbour batches from epoch 2 on: their clusters come from the weights, so a resume must restore them exactly.
    return BackboneTrainConfig(str(world.root / "flickr30k_train.json"), str(tmp_path / f"{name}.safetensors"), **{
        "eval_annotations": str(world.root / "flickr30k_val.json"), "model": "edje-tiny-convvit", "epochs": 2,
        "batch_size": 16, "eval_every": 1, "neighbour_fraction": 0.5, "cluster_size": 4, "neighbour_start": 2,
        "world": str(world.root / "world.json"), "storage_path": str(tmp_path / "runs"), "name": name, **kw})


def _kill_at(prefix: str):
    def log(line: str) -> None:
        if line.startswith(prefix):
            raise Killed(line)
    return log


def _final_state(tmp_path, name: str) -> dict:
    return torch.load(tmp_path / "runs" / name / CHECKPOINT, weights_only=True)


def _same_run(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] == 6 and a["epoch"] == b["epoch"] == 2
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), "weights differ"
    assert a["numpy_rng"] == b["numpy_rng"]
    strip = lambda h: [{k: v for k, v in row.items() if k != "elapsed_s"} for row in h]
    assert strip(a["history"]) == strip(b["history"])


def test_a_stopped_run_resumes_to_the_weights_of_an_unstopped_one(world, tmp_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    train_backbone(_config(world, tmp_path, "whole"), log=quiet)
    whole = _final_state(tmp_path, "whole")

    # Killed mid-epoch 2 (step 5 of 3 + 3): the checkpoint of step 4 holds epoch 2's batch plan one batch in.
    cfg = _config(world, tmp_path, "killed", checkpoint_every=2)
    with pytest.raises(Killed):
        train_backbone(cfg, log=_kill_at("epoch 2/2 batch 2/"))
    stopped = _final_state(tmp_path, "killed")
    assert (stopped["step"], stopped["epoch"], stopped["batch"]) == (4, 1, 1) and stopped["plan"] is not None
    assert not any(torch.equal(stopped["model"][k], whole["model"][k]) for k in ("logit_scale", "text_projection"))
    lines = []
    record = train_backbone(cfg, log=lines.append)
    assert any("resumed from" in s and "at step 4 (epoch 2, batch 1)" in s for s in lines), lines
    _same_run(_final_state(tmp_path, "killed"), whole)
    assert (tmp_path / "killed.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()
    assert record["complete"] and [h["epoch"] for h in record["history"]] == [1, 2]

    # Stopped at an epoch's end (--stop-after 1), continued later with the whole schedule.
    first = _config(world, tmp_path, "staged", stop_after=1)
    assert train_backbone(first, log=quiet)["final_recall"] is not None
    assert _final_state(tmp_path, "staged")["plan"] is None
    train_backbone(replace(first, stop_after=None), log=quiet)
    _same_run(_final_state(tmp_path, "staged"), whole)
    record = json.loads((tmp_path / "staged.json").read_text())
    assert [h["epoch"] for h in record["history"]] == [1, 2] and record["complete"]


def test_a_checkpoint_of_another_recipe_is_refused(world, tmp_path):
    torch.set_num_threads(1)
    cfg = _config(world, tmp_path, "one", stop_after=1, eval_annotations=None)
    train_backbone(cfg, log=lambda s: None)
    with pytest.raises(ValueError, match=r"different run \(lr: 0.001 there, 0.002 now\)"):
        train_backbone(replace(cfg, lr=2e-3), log=lambda s: None)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        replace(cfg, checkpoint_every=0)


def test_the_shapes_caption_levers_are_refused_on_an_open_world(world, tmp_path):
    # The family mask reads an open world's families as it reads a shapes world's: a base and its three twins.
    families, scenes = world_records(str(world.root / "world.json"), [r.image_id for r in world.images if r.split == "train"])
    assert sorted(collections.Counter(families.tolist()).values()) == [4] * 12 and all(isinstance(s, OpenScene) for s in scenes)
    cfg = _config(world, tmp_path, "levers", shape_caption_rate=0.3)
    with pytest.raises(ValueError, match="is an open world: the shape- and colour-only caption rates"):
        train_backbone(cfg, log=lambda s: None)
    assert not (tmp_path / "runs" / "levers").exists()


def test_a_run_from_init_starts_from_those_weights(world, tmp_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    base = _config(world, tmp_path, "base", epochs=1, storage_path=None)
    train_backbone(base, log=quiet)
    # At lr 0 the weights never move (AdamW's decay scales with lr): every trained tensor is the init's, bit for bit;
    # only BatchNorm's running statistics follow the batches.
    frozen = _config(world, tmp_path, "frozen", epochs=1, lr=0.0, init=base.output, storage_path=None)
    train_backbone(frozen, log=quiet)
    fresh = _config(world, tmp_path, "fresh", epochs=1, lr=0.0, storage_path=None)
    train_backbone(fresh, log=quiet)
    a, b, c = (load_file(cfg.output) for cfg in (base, frozen, fresh))
    trained = [k for k in a if "running_" not in k and "num_batches" not in k]
    assert len(trained) > 20 and all(torch.equal(a[k], b[k]) for k in trained)
    assert not all(torch.equal(a[k], c[k]) for k in trained)
    assert json.loads((tmp_path / "frozen.json").read_text())["config"]["init"] == base.output
    with pytest.raises(ValueError, match="holds weights of edje-tiny-convvit, not edje-tiny-convvit-128"):
        train_backbone(replace(frozen, model="edje-tiny-convvit-128", output=str(tmp_path / "other.safetensors")),
                       log=quiet)


def test_a_locked_image_tower_starts_a_wider_text_tower_of_another_model(world, tmp_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    base = _config(world, tmp_path, "base128", model="edje-tiny-convvit-128", epochs=1, storage_path=None)
    train_backbone(base, log=quiet)
    lines = []
    wide = _config(world, tmp_path, "wide", model="edje-tiny-convvit-128-t128", epochs=1, init=base.output,
                   lock_image=True, storage_path=None)
    train_backbone(wide, log=lines.append)
    a, b = load_file(base.output), load_file(wide.output)
    visual = [k for k in a if k.startswith("visual.")]
    assert len(visual) > 20 and all(torch.equal(a[k], b[k]) for k in visual)
    assert a["token_embedding.weight"].shape[1] == 64 and b["token_embedding.weight"].shape[1] == 128
    assert f"the image tower of edje-tiny-convvit-128 from {base.output}, locked; a fresh edje-tiny-convvit-128-t128 " \
        "text tower" in lines
    # Only a locked image tower carries over from another model, and only one of the same shape.
    with pytest.raises(ValueError, match="with --lock-image its image tower can start a new text tower"):
        train_backbone(replace(wide, lock_image=False, output=str(tmp_path / "unlocked.safetensors")), log=quiet)
    with pytest.raises(ValueError, match="whose image tower is not edje-tiny-convvit's"):
        train_backbone(replace(wide, model="edje-tiny-convvit", output=str(tmp_path / "small.safetensors")), log=quiet)


def test_a_locked_image_tower_trains_the_text_tower_alone_and_resumes(world, tmp_path):
    torch.set_num_threads(1)
    quiet = lambda s: None
    base = _config(world, tmp_path, "base", epochs=1, storage_path=None)
    train_backbone(base, log=quiet)
    # Mirror rows and neighbour batches (epoch 2) both read the cached embeddings; rewritten captions draw from the rng.
    locked = dict(init=base.output, lock_image=True, text_augment=0.5, mirror_fraction=0.5, lr=5e-3)
    train_backbone(_config(world, tmp_path, "lit", **locked), log=quiet)
    a, b = load_file(base.output), load_file(str(tmp_path / "lit.safetensors"))
    visual = [k for k in a if k.startswith("visual.")]
    # Every image-tower tensor, BatchNorm's running statistics included: tables encoded with the init stay valid.
    assert len(visual) > 20 and all(torch.equal(a[k], b[k]) for k in visual)
    assert not torch.equal(a["text_projection"], b["text_projection"]) and not torch.equal(
        a["token_embedding.weight"], b["token_embedding.weight"])
    assert json.loads((tmp_path / "lit.json").read_text())["config"]["lock_image"] is True

    cfg = _config(world, tmp_path, "lit_killed", checkpoint_every=2, **locked)
    with pytest.raises(Killed):
        train_backbone(cfg, log=_kill_at("epoch 2/2 batch 2/"))
    train_backbone(cfg, log=quiet)
    _same_run(_final_state(tmp_path, "lit_killed"), _final_state(tmp_path, "lit"))
    with pytest.raises(ValueError, match="lock_image keeps the image tower of --init"):
        _config(world, tmp_path, "no_init", lock_image=True)
    with pytest.raises(ValueError, match="text_augment must be in"):
        _config(world, tmp_path, "rate", text_augment=2.0)
