"""Linear probes of backbone outputs on an open world (evaluation/open_probes.py, benchmarks/probe_open_tokens.py)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from edje.evaluation.open_probes import OPEN_PROBES, run_open_probes
from edje.evaluation.probes import centre_cell
from edje.sampleworld import WorldConfig, generate
from edje.sampleworld.open_glyphs import load_glyphs
from edje.sampleworld.open_world import open_world_config, sample_open_records

GRID, CODE = 8, 64


def _vocabulary():
    table = load_glyphs()
    return list(table.nouns), {g.noun: g.group for g in table.glyphs}


def _few_nouns(scenes, nouns, groups, k: int = 12):
    """The scenes with every noun mapped onto the members of ``k`` neighbour groups, group for group, so each noun
    left has dozens of training things (a probe of 551 nouns needs thousands of images to see each often)."""
    by_group: dict = {}
    for n in nouns:
        by_group.setdefault(groups[n], []).append(n)
    names = sorted(by_group)
    kept = [by_group[g] for g in names if len(by_group[g]) >= 3][:k]
    remap = {n: kept[names.index(groups[n]) % k][i % len(kept[names.index(groups[n]) % k])] for i, n in enumerate(nouns)}
    return [replace(s, objects=tuple(replace(o, noun=remap[o.noun]) for o in s.objects)) for s in scenes]


def _planted(scenes, nouns, noise: float = 0.1, seed: int = 0):
    """Outputs that carry what the probes ask: under each thing's centre token a random code of its noun and one-hots
    of its size, count and facing; as the pooled embedding the sum of its nouns' codes. Plus noise everywhere."""
    codes = np.random.default_rng(123).choice([-1.0, 1.0], size=(len(nouns), CODE)) / np.sqrt(CODE)
    index = {n: i for i, n in enumerate(nouns)}
    rng = np.random.default_rng(seed)
    width = CODE + 2 + 3 + 2
    tokens = noise * rng.normal(size=(len(scenes), GRID * GRID, width))
    pooled = noise * rng.normal(size=(len(scenes), CODE))
    for i, s in enumerate(scenes):
        for o in s.objects:
            cx, cy = centre_cell(o.center, GRID)
            t = tokens[i, cy * GRID + cx]
            t[:CODE] += codes[index[o.noun]]
            t[CODE + ("small", "large").index(o.size)] += 1
            t[CODE + 2 + o.count - 1] += 1
            if o.facing:
                t[CODE + 5 + ("left", "right").index(o.facing)] += 1
            pooled[i] += codes[index[o.noun]]
    return tokens.astype(np.float32), pooled.astype(np.float32)


def test_open_probes_read_what_is_planted_and_nothing_when_nothing_is():
    records = sample_open_records(open_world_config(seed=5, n_train=800, n_val=0, n_test=200))
    nouns, groups = _vocabulary()
    train = _few_nouns([r.scene for r in records if r.split == "train"], nouns, groups)
    test = _few_nouns([r.scene for r in records if r.split == "test"], nouns, groups)
    results, coverage = run_open_probes((*_planted(train, nouns), train), (*_planted(test, nouns, seed=1), test), nouns, groups)
    got = {r.name: r for r in results}
    assert tuple(got) == OPEN_PROBES
    assert coverage["nouns"] == len(nouns) and coverage["test_things_with_noun_seen_in_train"] == 100
    for name in OPEN_PROBES:
        assert got[name].accuracy > 0.9, got[name]
    assert got["local_noun"].baseline < 0.15 and 0.1 < got["local_noun_in_group"].baseline < 0.6

    rng = np.random.default_rng(0)
    blind = lambda n: (rng.normal(size=(n, GRID * GRID, 16)).astype(np.float32),
                       rng.normal(size=(n, 16)).astype(np.float32))
    empty = {r.name: r for r in run_open_probes((*blind(len(train)), train), (*blind(len(test)), test), nouns, groups)[0]}
    # Pure noise: every probe stays near its baseline (the majority answer, or chance).
    for r in empty.values():
        assert r.accuracy < r.baseline + 0.1, r
    assert empty["position"].accuracy < 0.35 and empty["local_noun"].accuracy < 0.05


def test_probe_benchmark_runs_end_to_end_on_a_small_open_world(tmp_path):
    import probe_open_tokens

    generate(open_world_config(seed=9, n_train=96, n_val=0, n_test=32, image_size=64), tmp_path / "world")
    out = tmp_path / "probe.json"
    rc = probe_open_tokens.main(["--world", str(tmp_path / "world"), "--backbone", "edje-tiny-convvit",
                                 "--train-images", "96", "--test-images", "32", "--json", str(out), "--threads", "1"])
    result = json.loads(out.read_text())
    assert rc == 0 and [p["name"] for p in result["probes"]] == list(OPEN_PROBES)
    assert all(0 <= p["accuracy"] <= 100 and 0 <= p["baseline"] <= 100 and p["n_test"] > 0 for p in result["probes"])
    assert result["tokens"] == [64, 128] and result["coverage"]["nouns"] == len(load_glyphs().nouns)
    assert set(result["zero_shot"]) == {"t2i", "i2t"} and 0 <= result["zero_shot"]["t2i"]["r1"] <= 100
    generate(WorldConfig(seed=1, n_train=8, n_val=0, n_test=8, image_size=64), tmp_path / "shapes")
    with pytest.raises(ValueError, match="is not an open world"):
        probe_open_tokens.main(["--world", str(tmp_path / "shapes"), "--train-images", "8", "--test-images", "8"])
