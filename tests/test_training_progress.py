"""Progress where people wait: the training loop's `step N/total, s/step, eta` and the backbone's in-epoch lines."""
from __future__ import annotations

import json
import re

import torch

from edje.training.loop import format_duration, progress_text


def test_format_duration_is_hours_minutes_seconds():
    assert format_duration(0) == "0:00:00"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3 * 3600 + 7 * 60 + 5) == "3:07:05"
    assert format_duration(30 * 3600) == "30:00:00"
    assert format_duration(-4) == "0:00:00"


def test_progress_text_eta_is_the_mean_step_time_times_the_steps_left():
    # 10 steps in 25 s since the (re)start, 40 of 100 done: 60 left x 2.5 s.
    assert progress_text(40, 100, 10, 25.0) == "step 40/100 (40%), 2.50 s/step, eta 0:02:30"
    assert progress_text(100, 100, 100, 50.0) == "step 100/100 (100%), 0.50 s/step, eta 0:00:00"


def test_progress_text_without_a_total_or_a_timed_step():
    assert progress_text(7, None, 7, 3.5) == "step 7, 0.50 s/step"  # a streamed epoch of unknown length
    assert progress_text(30, 60, 0, 0.0) == "step 30/60 (50%)"  # resumed, nothing timed yet


def test_backbone_training_reports_within_each_epoch(tmp_path):
    from edje.sampleworld import WorldConfig, generate
    from edje.training.backbone import BackboneTrainConfig, train_backbone

    torch.set_num_threads(1)
    world = generate(WorldConfig(seed=3, n_train=48, n_val=0, n_test=0, image_size=64), tmp_path / "world")
    lines = []
    cfg = BackboneTrainConfig(str(world.root / "flickr30k_train.json"), str(tmp_path / "bb.safetensors"),
                              epochs=1, batch_size=8, warmup_steps=2)
    train_backbone(cfg, log=lines.append)
    progress = [m.groups() for m in map(re.compile(r"epoch 1/1 batch (\d+)/6: running loss ([\d.]+), "
                                                   r"(\d+) images/s, epoch eta \d+ s").fullmatch, lines) if m]
    # Six batches: a line after each but the last, which the epoch's JSON line reports.
    assert [int(b) for b, _, _ in progress] == [1, 2, 3, 4, 5]
    assert all(float(loss) > 0 and int(rate) > 0 for _, loss, rate in progress)
    assert json.loads(lines[-1])["step"] == 6
