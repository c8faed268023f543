"""The held-out-combination split: a training world that never shows some attribute combinations, a test
world made only of them, and default worlds unchanged."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edje.sampleworld.held_out import HeldOut
from edje.sampleworld.world import WorldConfig, generate, load_world, sample_records

COMBOS = ("red+circle", "large+square", "blue+star")


def _objects(records):
    return [o for r in records for o in r.scene.objects]


def test_exclude_and_only_worlds():
    held = HeldOut.parse(COMBOS)
    train = sample_records(WorldConfig(seed=3, n_train=400, n_val=40, n_test=0, held_out=COMBOS))
    assert train and not any(held.in_scene(r.scene) for r in train)
    test = sample_records(WorldConfig(seed=4, n_train=0, n_val=0, n_test=200, held_out=COMBOS, held_out_mode="only"))
    assert len(test) == 200 and all(held.in_scene(r.scene) for r in test)
    # every withheld combination shows up in the test world, and families keep their twins
    seen = {(a, b) for a, b in held.combos for o in _objects(test) if {a, b} <= {o.colour, o.shape, o.size}}
    assert seen == set(held.combos)
    assert len({r.family_id for r in test}) == 50 and {r.role for r in test} - {"base"}


def test_default_worlds_keep_their_bytes():
    a = sample_records(WorldConfig(seed=11, n_train=40, n_val=8, n_test=8))
    b = sample_records(WorldConfig(seed=11, n_train=40, n_val=8, n_test=8, held_out=()))
    assert [r.to_json() for r in a] == [r.to_json() for r in b]


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="VALUE\\+VALUE"):
        HeldOut.parse(["red-circle"])
    with pytest.raises(ValueError, match="unknown attribute"):
        HeldOut.parse(["red+hexagon"])
    with pytest.raises(ValueError, match="two different attributes"):
        HeldOut.parse(["red+blue"])
    with pytest.raises(ValueError, match="mode"):
        HeldOut.parse(["red+circle"], mode="some")


def test_cli_writes_the_split_and_world_json_records_it(tmp_path):
    out = tmp_path / "held"
    subprocess.run([sys.executable, "-m", "sampleworld", "generate", "--seed", "5", "--n-train", "0", "--n-val", "0",
                    "--n-test", "16", "--image-size", "32", "--held-out", *COMBOS, "--held-out-mode", "only",
                    "--out", str(out)], check=True, cwd=Path(__file__).resolve().parent.parent)
    cfg = json.loads((out / "world.json").read_text())["config"]
    assert cfg["held_out"] == list(COMBOS) and cfg["held_out_mode"] == "only"
    world = load_world(out)
    assert world.config.held_out == COMBOS and all(HeldOut.parse(COMBOS).in_scene(r.scene) for r in world.images)
    generate(WorldConfig(seed=6, n_train=8, n_val=0, n_test=0, image_size=32, held_out=COMBOS), tmp_path / "ex")
