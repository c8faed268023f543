"""Linear probes of backbone outputs (evaluation/probes.py, benchmarks/probe_tokens.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edje.evaluation.probes import local_features, presence_labels, run_probes
from edje.sampleworld import WorldConfig, generate
from edje.sampleworld.world import sample_records

ROOT = Path(__file__).resolve().parent.parent


def _planted_outputs(scenes, grid: int = 8, width: int = 32, noise: float = 0.15, seed: int = 0):
    """Tokens and pooled vectors that carry exactly what the probes ask (plus noise): one-hot colour and
    shape written into the token under each object's centre, presence vectors as the pooled embedding."""
    rng = np.random.default_rng(seed)
    tokens = noise * rng.normal(size=(len(scenes), grid * grid, width))
    for i, s in enumerate(scenes):
        for o in s.objects:
            cx, cy = min(grid - 1, int(o.center[0] * grid)), min(grid - 1, int(o.center[1] * grid))
            onehot = np.concatenate([presence_labels([type(s)((o,), s.background)], "colour")[0],
                                     presence_labels([type(s)((o,), s.background)], "shape")[0]])
            tokens[i, cy * grid + cx, :14] += onehot
    pooled = np.hstack([presence_labels(scenes, "colour"), presence_labels(scenes, "shape")])
    pooled = pooled + noise * rng.normal(size=pooled.shape)
    return tokens.astype(np.float32), pooled.astype(np.float32)


def test_probes_read_what_is_planted_and_nothing_when_nothing_is():
    scenes = [r.scene for r in sample_records(WorldConfig(seed=5, n_train=600, n_val=0, n_test=200))]
    train, test = scenes[:600], scenes[600:]
    planted = {r.name: r for r in run_probes((*_planted_outputs(train), train), (*_planted_outputs(test, seed=1), test))}
    for name in ("colour_present", "shape_present", "local_colour", "local_shape"):
        assert planted[name].accuracy > 0.95, planted[name]
    rng = np.random.default_rng(0)
    blind = lambda n: (rng.normal(size=(n, 64, 32)).astype(np.float32), rng.normal(size=(n, 16)).astype(np.float32))
    empty = {r.name: r for r in run_probes((*blind(600), train), (*blind(200), test))}
    # Pure noise: presence probes stay near "always absent", local probes near chance.
    assert empty["shape_present"].accuracy < empty["shape_present"].baseline + 0.05
    assert empty["local_shape"].accuracy < 0.35
    assert 0.5 < empty["shape_present"].baseline < 0.7


def test_local_features_take_the_window_around_each_object():
    scenes = [r.scene for r in sample_records(WorldConfig(seed=5, n_train=8, n_val=0, n_test=0))]
    tokens = np.arange(8 * 64 * 2, dtype=np.float32).reshape(8, 64, 2)
    x, y = local_features(tokens, scenes, "shape", window=3)
    assert x.shape == (sum(len(s.objects) for s in scenes), 9 * 2) and y.sum(1).tolist() == [1.0] * len(x)
    o = scenes[0].objects[0]
    cx, cy = int(o.center[0] * 8), int(o.center[1] * 8)
    assert x[0][8] == tokens[0, cy * 8 + cx, 0]  # the window's centre is the object's own token
    with pytest.raises(ValueError, match="square grid"):
        local_features(tokens[:, :60], scenes, "shape", window=3)


def test_probe_benchmark_runs_end_to_end_on_a_small_world(tmp_path, monkeypatch):
    generate(WorldConfig(seed=9, n_train=96, n_val=0, n_test=32), tmp_path / "world")
    import probe_tokens

    out = tmp_path / "probe.json"
    rc = probe_tokens.main(["--world", str(tmp_path / "world"), "--backbone", "edje-tiny-convvit", "--pretrained",
                            str(ROOT / "checkpoints" / "edje-tiny-convvit-sw.safetensors"), "--train-images", "96",
                            "--test-images", "32", "--json", str(out), "--threads", "1"])
    result = json.loads(out.read_text())
    assert rc == 0 and [p["name"] for p in result["probes"]] == ["colour_present", "shape_present", "local_colour",
                                                                 "local_shape"]
    by = {p["name"]: p for p in result["probes"]}
    assert by["colour_present"]["accuracy"] > by["colour_present"]["baseline"]  # the shipped backbone sees colour
    assert all(0 <= p["accuracy"] <= 100 and p["n_test"] > 0 for p in result["probes"])
    # The first stage's zero-shot recall on the same test images: far above chance (R@10 of 32 images: 31 %).
    assert set(result["zero_shot"]) == {"t2i", "i2t"} and result["zero_shot"]["t2i"]["r10"] > 60
