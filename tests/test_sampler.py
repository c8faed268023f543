"""Batch composition for EDJE training (shuffled, then neighbour clusters) and the step-based LR schedule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edje.training.config import TrainJobConfig
from edje.training.hard_batches import mixed_batches, neighbour_clusters, same_words_mask
from edje.training.loop import learning_rate
from edje.training.sampler import BatchPlanner, CurriculumConfig


def _families(n_families: int, size: int = 4, dim: int = 16, seed: int = 0):
    """Image ids in id order with families of near-identical embeddings (like the sample world's twins)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_families, dim))
    emb = np.repeat(centres, size, axis=0) + 0.01 * rng.normal(size=(n_families * size, dim))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = [f"img{i:04d}" for i in range(n_families * size)]
    return ids, emb.astype(np.float32)


def test_curriculum_ramps_from_zero_to_its_maximum():
    c = CurriculumConfig(max_fraction=0.5, start=100, end=300, cluster_size=4)
    assert c.fraction(0) == 0.0 and c.fraction(99) == 0.0
    assert c.fraction(200) == pytest.approx(0.25)
    assert c.fraction(300) == c.fraction(10_000) == 0.5
    assert CurriculumConfig().fraction(10_000) == 0.0


def test_shuffled_batches_do_not_follow_table_order():
    # Table order puts a family's 4 images side by side: an unshuffled batch of 32 is 8 whole families.
    ids, emb = _families(64)
    planner = BatchPlanner(ids, emb, batch_size=32, curriculum=CurriculumConfig(), seed=0)
    batches = planner.epoch(0, first_step=0)
    assert len(batches) == planner.batches_per_epoch == 8
    families_per_batch = [len({r // 4 for r in b}) for b in batches]
    assert min(families_per_batch) > 16, families_per_batch
    rows = np.concatenate(batches)
    assert len(set(rows.tolist())) == len(rows) == 256  # each image once per epoch
    # Deterministic per (seed, epoch), different across epochs: a resumed run rebuilds the same batches.
    again = planner.epoch(0, first_step=0)
    assert all((a == b).all() for a, b in zip(batches, again))
    assert not all((a == b).all() for a, b in zip(batches, planner.epoch(1, first_step=8)))


def test_cluster_share_brings_near_neighbours_into_one_batch():
    ids, emb = _families(64)
    cur = CurriculumConfig(max_fraction=1.0, start=0, end=0, cluster_size=4)
    planner = BatchPlanner(ids, emb, batch_size=32, curriculum=cur, seed=0)
    for batch in planner.epoch(0, first_step=0):
        # Whole families (each other's nearest neighbours) sit together in the batch.
        fams, counts = np.unique(batch // 4, return_counts=True)
        assert (counts == 4).mean() > 0.7, counts


def test_caption_rows_are_drawn_per_image():
    ids, emb = _families(16)
    # Five caption rows per image, as a per-caption training table holds them.
    rows_ids = [i for i in ids for _ in range(5)]
    planner = BatchPlanner(rows_ids, np.repeat(emb, 5, axis=0), batch_size=8, curriculum=CurriculumConfig(), seed=1)
    assert planner.num_images == 64 and planner.batches_per_epoch == 8
    for b in planner.epoch(0, first_step=0):
        assert len({rows_ids[r] for r in b}) == 8  # never two captions of one image in a batch


def test_neighbour_clusters_and_mixed_batches():
    ids, emb = _families(32)
    clusters = neighbour_clusters(emb, 4, np.random.default_rng(0))
    assert sum(len(set((c // 4).tolist())) == 1 for c in clusters) >= 0.8 * len(clusters)
    batches = mixed_batches(len(ids), 16, 0.5, clusters, np.random.default_rng(0))
    assert all(len(b) == 16 and len(set(b.tolist())) == 16 for b in batches)
    with pytest.raises(ValueError):
        neighbour_clusters(emb, 1, np.random.default_rng(0))


def test_same_words_mask_marks_binding_twins_only():
    caps = ["a red circle left of a blue square", "a blue circle left of a red square",
            "a red circle right of a blue square", "a red circle left of a blue square"]
    m = same_words_mask(caps)
    assert m[0, 1] and m[1, 0] and m[0, 3] and not m[0, 2] and not m[0, 0]


def test_learning_rate_is_step_based_warmup_then_cosine_to_a_floor():
    cfg = TrainJobConfig(tables=[], storage_path="", name="", lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(cfg, 0, 1000) == pytest.approx(1e-4)
    assert learning_rate(cfg, 9, 1000) == pytest.approx(1e-3)
    mid = 10 + (1000 - 10) // 2
    assert learning_rate(cfg, mid, 1000) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5), rel=1e-2)
    assert learning_rate(cfg, 1000, 1000) == pytest.approx(1e-4)
    assert learning_rate(cfg, 5000, 1000) == pytest.approx(1e-4)  # never below the floor
    # Monotone after warm-up, whatever an epoch's length.
    lrs = [learning_rate(cfg, s, 1000) for s in range(10, 1001)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and not math.isnan(sum(lrs))


def test_a_resumed_epoch_continues_with_the_first_batch_not_consumed():
    import pyarrow as pa

    from edje.training.loop import Position, planned_batches

    ids, emb = _families(32)
    table = pa.table({"image_id": ids, "row": list(range(len(ids)))})
    cur = CurriculumConfig(max_fraction=0.5, start=2, end=6, cluster_size=4)
    planner = BatchPlanner(ids, emb, batch_size=8, curriculum=cur, seed=3)
    full = [(i, b.column("image_id").to_pylist()) for i, b in planned_batches(table, planner, 16, Position(16, 1, 0))]
    assert [i for i, _ in full] == list(range(16))
    # Killed after 5 batches of epoch 1 (global step 21): the rerun starts at batch 5 with the same rows.
    resumed = [(i, b.column("image_id").to_pylist()) for i, b in planned_batches(table, planner, 16, Position(21, 1, 5))]
    assert resumed == full[5:]


def test_training_checkpoint_restores_weights_optimizer_and_position(tiny_edje_config, tmp_path):
    import torch

    from edje.model.edje import EDJEModel
    from edje.training.loop import Position, _load_training_checkpoint, build_optimizer, save_training_checkpoint

    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config)
    cfg = TrainJobConfig(tables=[], storage_path="", name="")
    opt = build_optimizer(model, cfg)
    out = model.encoder.score(["a red circle"], model.adapter(torch.randn(1, 65, 128)))
    out.sum().backward()
    opt.step()
    save_training_checkpoint(model, opt, Position(7, 1, 3), {"loss": 1.0}, str(tmp_path))
    restored, pos, opt_state = _load_training_checkpoint(str(tmp_path))
    assert pos == Position(7, 1, 3)
    for (k, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(restored.state_dict().items())):
        assert torch.equal(a, b), k
    opt2 = build_optimizer(restored, cfg)
    opt2.load_state_dict(opt_state)
    for s1, s2 in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert torch.equal(s1["exp_avg"], s2["exp_avg"]) and torch.equal(s1["exp_avg_sq"], s2["exp_avg_sq"])
        assert float(s1["step"]) == float(s2["step"])
