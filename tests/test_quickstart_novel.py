"""The quickstart's honest unseen seed and held-out mode: test meanings that repeat a training scene of the
checkpoint's world are counted (evaluation/novelty.py), and a checkpoint that names its held-out combinations is
tested on a world made only of them, or without them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edje.evaluation import novelty
from edje.jobs import quickstart as qs
from edje.sampleworld.held_out import HeldOut
from edje.sampleworld.world import WorldConfig, generate, load_world, sample_records

ROOT = Path(__file__).resolve().parent.parent
COMBOS = ["red+circle", "large+square"]


def test_world_100_repeats_138_of_seed_9494s_test_meanings():
    # The figure: 13.8 % of an "unseen" seed's test scenes mean exactly what a world-100 training scene does.
    seen = novelty.parse_reference("100").signatures()
    assert len(seen) == 12000  # every training meaning of a world is unique
    test = [r for r in sample_records(qs.world_config(qs.QuickstartConfig(seed=9494), ())) if r.split == "test"]
    novel = novelty.novel_images([r.scene for r in test], seen)
    assert novelty.counts(novel) == {"images": 1000, "novel_images": 862, "repeated_images": 138, "repeated_pct": 13.8}
    assert type(novelty.counts(novel)["repeated_pct"]) is float  # plain JSON, not a numpy scalar


def test_sampled_reference_scenes_are_the_generated_worlds(tmp_path):
    config = WorldConfig(seed=7, n_train=40, n_val=8, n_test=8, image_size=32)
    generate(config, tmp_path / "w")
    sampled = novelty.ReferenceWorld(config=config).signatures()
    for path in (tmp_path / "w", tmp_path / "w" / "world.json"):
        assert novelty.ReferenceWorld(path=str(path)).signatures() == sampled
    train = {r.scene.signature() for r in load_world(tmp_path / "w").images if r.split == "train"}
    assert sampled == train and len(train) == 40  # the train split only: val and test are not seen
    assert novelty.parse_reference(str(tmp_path / "w")).path == str(tmp_path / "w")
    with pytest.raises(ValueError, match="neither a seed"):
        novelty.parse_reference(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="exactly one"):
        novelty.ReferenceWorld()


def test_query_subsets_and_counts_by_hand():
    novel = np.array([True, False, True])
    caption_image = np.array([0, 0, 1, 1, 2])
    assert novelty.query_subset("t2i", novel, caption_image).tolist() == [0, 1, 4]
    assert novelty.query_subset("i2t", novel, caption_image).tolist() == [0, 2]
    assert novelty.counts(novel) == {"images": 3, "novel_images": 2, "repeated_images": 1, "repeated_pct": 33.33}
    with pytest.raises(ValueError, match="direction"):
        novelty.query_subset("x", novel, caption_image)


def test_reference_world_follows_the_options_and_the_checkpoints_held_out():
    ref = qs.reference_world(qs.QuickstartConfig(train_world_n_train=800), ())
    assert (ref.config.seed, ref.config.n_train, ref.config.n_val, ref.config.held_out) == (100, 800, 500, ())
    # A checkpoint that never saw some combinations was trained on a world without them (ex100 for the twins).
    held = qs.reference_world(qs.QuickstartConfig(train_world_seed=5), tuple(COMBOS))
    assert held.config.seed == 5 and held.config.held_out == tuple(COMBOS) and held.config.held_out_mode == "exclude"
    assert "--held-out red+circle large+square --held-out-mode exclude" in held.describe()
    assert qs.reference_world(qs.QuickstartConfig(train_world_seed=qs.NO_SPLIT), ()) is None
    assert qs.seed_or_none("none") == qs.NO_SPLIT and qs.seed_or_none("12") == 12


@pytest.fixture
def held_ckpt(tmp_path):
    """A copy of a shipped checkpoint whose config.json names two held-out combinations, and one that names none."""
    plain = tmp_path / "plain"
    shutil.copytree(ROOT / "checkpoints" / "edje-c16-bind", plain)
    held = tmp_path / "held"
    shutil.copytree(plain, held)
    cfg = json.loads((held / "config.json").read_text())
    (held / "config.json").write_text(json.dumps({**cfg, "held_out": COMBOS}))
    return held, plain


def test_checkpoint_held_out_is_read_and_checked(held_ckpt, tmp_path):
    held, plain = held_ckpt
    assert qs.checkpoint_held_out(str(held)) == tuple(COMBOS)
    assert qs.checkpoint_held_out(str(plain)) == ()
    with pytest.raises(ValueError, match="no `held_out` key"):
        qs.checkpoint_held_out(str(plain), required=True)
    cfg = json.loads((held / "config.json").read_text())
    for bad, match in (("red+circle", "list of VALUE"), (["red+hexagon"], "unknown attribute")):
        (held / "config.json").write_text(json.dumps({**cfg, "held_out": bad}))
        with pytest.raises(ValueError, match=match):
            qs.checkpoint_held_out(str(held))


def test_held_out_mode_without_the_key_fails_before_anything_starts(held_ckpt, capsys):
    _, plain = held_ckpt
    with pytest.raises(SystemExit) as e:
        qs.main(["--checkpoint", str(plain), "--held-out-mode", "only"])
    assert e.value.code == 2 and "no `held_out` key" in capsys.readouterr().err


def test_the_world_step_makes_only_and_exclude_worlds(tmp_path):
    held = HeldOut.parse(COMBOS)
    only_cfg = qs.world_config(qs.QuickstartConfig(seed=9898, test_images=38, held_out_mode="only"), tuple(COMBOS))
    assert (only_cfg.n_train, only_cfg.n_val, only_cfg.n_test) == (0, 0, 40)  # whole families
    world = qs.prepare_world(tmp_path, only_cfg, 38)
    records = load_world(world).images
    assert len(records) == 40 and all(held.in_scene(r.scene) for r in records)
    # Only the images the run reads are drawn: the test split's first 38.
    assert sorted(p.name for p in (world / "images").iterdir()) == sorted(f"{r.image_id}.jpg" for r in records[:38])
    assert json.loads((world / "world.json").read_text())["config"]["held_out"] == COMBOS
    # The first images of the 1,000-image held-out world (BENCHMARKS' t9898 for seed 9898), whatever N is.
    full = sample_records(WorldConfig(seed=9898, n_train=0, n_val=0, n_test=1000, same_side_rate=0.25,
                                      held_out=tuple(COMBOS), held_out_mode="only"))
    assert [r.scene.signature() for r in records] == [r.scene.signature() for r in full[:40]]

    # Asked again for the same world: reused as it is.
    stamp = (world / "world.json").stat().st_mtime_ns
    assert qs.prepare_world(tmp_path, only_cfg, 38) == world and (world / "world.json").stat().st_mtime_ns == stamp
    # More test images asked of the same world: the missing ones are drawn, the world is kept.
    assert qs.prepare_world(tmp_path, only_cfg, None) == world and (world / "world.json").stat().st_mtime_ns == stamp
    assert len(list((world / "images").iterdir())) == 40
    # Another world: regenerated, and the tables encoded from the old one are removed.
    (tmp_path / "raw").mkdir()
    compressed = qs.compressed_folder(tmp_path, str(ROOT / "checkpoints" / "edje-c16-bind"), "int8")
    compressed.mkdir()
    ex_cfg = qs.world_config(qs.QuickstartConfig(seed=9797, test_images=40, held_out_mode="exclude"), tuple(COMBOS))
    qs.prepare_world(tmp_path, ex_cfg, 40)
    assert not (tmp_path / "raw").exists() and not compressed.exists()
    records = load_world(world).images
    assert len(records) == 40 and not any(held.in_scene(r.scene) for r in records)
    # Without --held-out-mode the seed's default world, as before.
    assert qs.world_config(qs.QuickstartConfig(seed=3), tuple(COMBOS)) == WorldConfig(seed=3, same_side_rate=0.25)


def test_the_report_gives_the_novel_split_in_the_evaluations_tables():
    stage = {"r1": 50.0, "r5": 100.0, "r10": 100.0}
    pairs = {"accuracy": 80.0, "pairs": 5, "families": 2, "ci95": [60.0, 100.0]}
    fam = {"first_stage": {"accuracy": 25.0, "queries": 4}, "reranked": {"accuracy": 75.0, "queries": 4},
           "by_kind": {"first_stage": {"relation": pairs}, "reranked": {"relation": pairs}},
           "relation_subsets": {"reranked": {"side: same side": pairs, "axis: vertical": pairs}}}
    block = {"queries": 4, "first_stage": stage, "reranked": stage, "within_family": fam}
    novel = {"against": "the train split of world 100", "images": 10, "novel_images": 4, "repeated_images": 6,
             "repeated_pct": 60.0, "t2i": block, "i2t": block}
    out = qs.recall_report({"t2i": block, "i2t": block, "novel": novel})
    assert "| text→image | reranked | 50.00 | 100.00 | 100.00 | 75.00 |" in out  # within-family beside recall
    assert "Novel meanings: 4 of 10 images" in out and "6 (60.0 %) repeat one exactly" in out
    assert "| text→image | reranked | 50.00 | 100.00 | 100.00 | 75.00 | 4 |" in out.split("Novel meanings")[1]
    # by twin kind and, of the relation subsets, the side ones, for all answers and again for the novel ones
    assert out.count("| t2i | 80.0 → 80.0 (5) [60, 100] |") == 2 and out.count("| side: same side | 80.0 [60, 100]") == 2
    assert "axis: vertical" not in out
    none = {**novel, "novel_images": 0, "repeated_images": 10, "t2i": {"queries": 0}, "i2t": {"queries": 0}}
    assert "No test image is novel" in qs.recall_report({"t2i": block, "i2t": block, "novel": none})


def test_every_option_reaches_the_config(monkeypatch):
    runs = []
    monkeypatch.setattr(qs, "run", runs.append)
    qs.main([])
    qs.main(["--seed", "5", "--test-images", "40", "--train-world-seed", "none", "--keep-serving", "--quant", "int4"])
    assert runs[0] == qs.QuickstartConfig()
    assert runs[1] == qs.QuickstartConfig(seed=5, test_images=40, train_world_seed=qs.NO_SPLIT, keep_serving=True,
                                          quant="int4")


@pytest.mark.slow
def test_quickstart_held_out_only_end_to_end(held_ckpt, tmp_path, capsys):
    held, _ = held_ckpt
    qs.main(["--checkpoint", str(held), "--held-out-mode", "only", "--test-images", "40", "--seed", "9898",
             "--output", str(tmp_path / "qs")])
    out = capsys.readouterr().out
    assert "held-out combinations" in out and "red+circle, large+square" in out and "--held-out-mode only" in out
    metrics = json.loads((tmp_path / "qs" / "eval" / "metrics.json").read_text())
    # The reference world withheld the same combinations, so no image of an only-world can repeat its meanings.
    assert metrics["novel"]["images"] == 40 and metrics["novel"]["repeated_images"] == 0
    assert "held-out red+circle large+square --held-out-mode exclude" in metrics["novel"]["against"]
    assert metrics["novel"]["t2i"]["reranked"] == metrics["t2i"]["reranked"]
    assert "Novel meanings: 40 of 40 images" in (tmp_path / "qs" / "eval" / "metrics.md").read_text()


def test_a_rerun_serves_the_world_on_the_port_its_url_list_names(tmp_path):
    # The encode plans digest the urls: a rerun into the same folder must serve on the same port to resume them.
    urls = tmp_path / "test_urls.tsv"
    assert qs.previous_port(urls) == 0
    urls.write_text("url\tcaption\timage_id\nhttp://127.0.0.1:41234/images/sw_000000.jpg\ta red circle\tsw_000000\n")
    assert qs.previous_port(urls) == 41234
    urls.write_text("url\tcaption\timage_id\n")
    assert qs.previous_port(urls) == 0
