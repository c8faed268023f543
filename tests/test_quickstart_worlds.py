"""The quickstart's --world: each world's defaults from its preset (jobs/quickstart_worlds.py), options given over
them, the backbone read from the checkpoint, a missing default file reported before Ray starts, and the open world's
test world, training world, held-out combinations, rerank request and report."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from edje.jobs import quickstart as qs
from edje.jobs.quickstart_worlds import WORLD_PRESETS, per_world, preset
from edje.sampleworld.registry import world_config

ROOT = Path(__file__).resolve().parent.parent


def test_each_world_takes_its_presets_defaults():
    shapes = qs.world_defaults(qs.QuickstartConfig())
    assert (shapes.checkpoint, shapes.same_side_rate) == (str(ROOT / "checkpoints/edje-c16-caprel"), 0.25)
    assert (shapes.train_world_seed, shapes.train_world_n_train, shapes.train_world_n_val) == (100, 12000, 500)
    open_ = qs.world_defaults(qs.QuickstartConfig(world="open"))
    assert open_.checkpoint == str(ROOT / "checkpoints/edje-open-c16")
    assert (open_.train_world_seed, open_.train_world_n_train, open_.train_world_n_val) == (300, 12000, 1000)
    assert open_.same_side_rate is None  # the open kind's own default, as `sampleworld generate --world open`
    assert preset("open").held_out_template_queries == 1 and preset("shapes").held_out_template_queries == 0
    assert qs.world_defaults(open_) == open_  # resolving twice changes nothing
    with pytest.raises(ValueError, match="world must be one of"):
        preset("moon")
    assert per_world("train_world_seed") == "shapes 100, open 300"
    assert per_world("same_side_rate") == "shapes 0.25, open as `sampleworld generate --world open` draws"


def test_options_given_stay_over_the_worlds_defaults():
    given = qs.QuickstartConfig(world="open", checkpoint="ck", same_side_rate=0.0, train_world_seed=7,
                                train_world_n_train=0, train_world_n_val=3)
    assert qs.world_defaults(given) == given
    assert qs.reference_world(dataclasses.replace(given, train_world_seed=qs.NO_SPLIT), ()) is None


def test_the_help_says_which_options_follow_the_world(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens: one line per option
    with pytest.raises(SystemExit):
        qs.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--world {shapes,open}" in out
    for text in ("checkpoints/edje-c16-caprel, open checkpoints/edje-open-c16",
                 "checkpoints/edje-tiny-convvit-sw.safetensors, open checkpoints/edje-open-convvit-128.safetensors",
                 "shapes 100, open 300", "shapes 12000, open 12000", "shapes 500, open 1000"):
        assert text in out
    assert out.count("the chosen world's") >= 6


def _checkpoint(tmp_path: Path, folder: str, **backbone) -> Path:
    """A copy of a shipped checkpoint whose config.json records `backbone`'s fields instead."""
    ck = tmp_path / folder
    shutil.copytree(ROOT / "checkpoints" / "edje-c16-bind", ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["config"]["backbone"].update(backbone)
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


def test_the_backbone_is_the_one_the_checkpoint_names(tmp_path):
    shipped = qs.resolve_models(qs.QuickstartConfig())
    assert shipped == qs.Models(str(ROOT / "checkpoints/edje-c16-caprel"), "edje-tiny-convvit",
                                str(ROOT / "checkpoints/edje-tiny-convvit-sw.safetensors"))
    # Another checkpoint: its backbone by name, and the weights it records (found beside it, here or in the repo).
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    ck = _checkpoint(tmp_path, "other", name="edje-tiny-convvit-128", pretrained=str(weights))
    for world in ("shapes", "open"):
        assert qs.resolve_models(qs.QuickstartConfig(world=world, checkpoint=str(ck))) == qs.Models(
            str(ck), "edje-tiny-convvit-128", str(weights))
    # --backbone-weights wins over what the checkpoint records and over the world's file.
    given = qs.QuickstartConfig(checkpoint=str(ck), backbone_weights="elsewhere.safetensors")
    assert qs.resolve_models(given).backbone_weights == "elsewhere.safetensors"
    gone = _checkpoint(tmp_path, "gone", pretrained=str(tmp_path / "no.safetensors"))
    with pytest.raises(qs.MissingFile, match="no.safetensors.*are not on this machine; --backbone-weights"):
        qs.resolve_models(qs.QuickstartConfig(checkpoint=str(gone)))


@pytest.fixture
def unshipped_open(monkeypatch):
    """The open world's preset pointing at a reranker and weights that are not there (as before they ship)."""
    monkeypatch.setitem(WORLD_PRESETS, "open", dataclasses.replace(
        WORLD_PRESETS["open"], checkpoint="checkpoints/no-such-c16", backbone_weights="checkpoints/no-such.safetensors"))


def test_missing_open_world_files_stop_the_run_before_ray_starts(unshipped_open, monkeypatch, tmp_path):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray, "init", no_ray)
    with pytest.raises(SystemExit) as e:
        qs.main(["--world", "open", "--test-images", "40", "--output", str(tmp_path / "qs")])
    message = str(e.value.code)
    assert message == ("quickstart: the open world's default reranker checkpoints/no-such-c16 (no config.json there) "
                       "and backbone weights file checkpoints/no-such.safetensors are missing; --checkpoint and "
                       "--backbone-weights choose others")
    assert not (tmp_path / "qs").exists()  # nothing written either
    with pytest.raises(qs.MissingFile, match=r"reranker checkpoints/no-such-c16 \(no config.json there\) is missing"):
        qs.resolve_models(qs.QuickstartConfig(world="open", backbone_weights="w.safetensors"))
    # --held-out-mode on a missing checkpoint: the missing file is what is reported, not a missing `held_out`.
    with pytest.raises(SystemExit) as e:
        qs.main(["--world", "open", "--held-out-mode", "only"])
    assert "no-such-c16 (no config.json there)" in str(e.value.code)
    # The world's reranker there, its backbone weights not.
    monkeypatch.setitem(WORLD_PRESETS, "open", dataclasses.replace(WORLD_PRESETS["open"],
                                                                   checkpoint="checkpoints/edje-c16-bind"))
    with pytest.raises(qs.MissingFile, match=r"^the open world's default backbone weights file "
                       r"checkpoints/no-such.safetensors is missing; --checkpoint and --backbone-weights"):
        qs.resolve_models(qs.QuickstartConfig(world="open"))


def test_the_open_world_is_the_kinds_default_world(tmp_path):
    from edje.sampleworld import load_world
    from edje.sampleworld.open_world import parse_open_held_out

    cfg = qs.QuickstartConfig(world="open", seed=4)
    assert qs.world_config(cfg, ()) == world_config("open", seed=4)  # `generate --world open --seed 4`
    assert qs.world_config(dataclasses.replace(cfg, same_side_rate=0.5), ()).same_side_rate == 0.5
    combos = ("dog+large", "animal+two")
    only = qs.world_config(dataclasses.replace(cfg, held_out_mode="only", test_images=38), combos)
    assert (only.kind, only.n_train, only.n_val, only.n_test, only.held_out) == ("open", 0, 0, 40, combos)
    records = load_world(qs.prepare_world(tmp_path, only, 38)).images
    held = parse_open_held_out(combos, "only")
    assert len(records) == 40 and all(any(held.hits(o.thing) for o in r.scene.objects) for r in records)


def test_an_open_checkpoints_held_out_combinations_are_checked_as_the_open_kind(tmp_path):
    ck = _checkpoint(tmp_path, "held")
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "held_out": ["dog+large"]}))
    assert qs.checkpoint_held_out(str(ck), kind="open") == ("dog+large",)
    with pytest.raises(ValueError, match="unknown attribute value 'dog'"):
        qs.checkpoint_held_out(str(ck))  # a shapes checkpoint knows no dogs
    (ck / "config.json").write_text(json.dumps({**cfg, "held_out": ["red+circle"]}))
    with pytest.raises(ValueError, match="unknown open-world value 'red'"):
        qs.checkpoint_held_out(str(ck), kind="open")


def test_the_open_worlds_training_world_is_sampled_as_the_open_kind():
    ref = qs.reference_world(qs.QuickstartConfig(world="open"), ("dog+large",))
    assert ref.config == world_config("open", seed=300, n_train=12000, n_val=1000, n_test=0, held_out=("dog+large",))
    assert "generate --world open --seed 300 --n-train 12000 --n-val 1000 --n-test 0" in ref.describe()
    assert qs.reference_world(qs.QuickstartConfig(), ()).config.kind == "shapes"


def test_the_rerank_request_and_the_page_on_an_open_world(tmp_path):
    from edje.sampleworld import generate, load_world

    world = tmp_path / "world"
    generate(world_config("open", seed=5, n_train=0, n_val=0, n_test=40), world)
    test = [r for r in load_world(world).images if r.split == "test"]
    for limit in (40, 24, None):
        query, documents, answer = qs.rerank_request(world, limit)
        shown = test[:limit]
        target = next(r for r in shown if r.image_id == answer)
        family = {r.image_id for r in shown if r.family_id == target.family_id}
        assert query == target.captions[0] and answer in documents and family <= set(documents)
        assert len(documents) == len(set(documents)) == 10 and set(documents) <= {r.image_id for r in shown}
    page = qs.page_options(world, world / "flickr30k_test.json", tmp_path)
    assert Path(page["image_dir"]).is_dir() and page["ui"] is True


def test_the_report_gives_the_held_out_template_split():
    stage = {"r1": 50.0, "r5": 100.0, "r10": 100.0}
    pairs = {"accuracy": 80.0, "pairs": 5, "families": 2, "ci95": [60.0, 100.0]}
    fam = {"first_stage": {"accuracy": 25.0, "queries": 4}, "reranked": {"accuracy": 75.0, "queries": 4},
           "by_kind": {"first_stage": {"noun": pairs}, "reranked": {"noun": pairs}},
           "relation_subsets": {"reranked": {"side: same side": pairs}}}
    block = {"queries": 4, "first_stage": stage, "reranked": stage, "within_family": fam}
    held = {"queries": 10, "held_out_queries": 4, "added_queries": 3, "t2i": block}
    out = qs.recall_report({"t2i": block, "i2t": block, "held_out_templates": held})
    after = out.split("Held-out caption templates: 4 of the 10 text queries")[1]
    assert "3 of them were added" in after and "| text→image | reranked | 50.00 | 100.00 | 100.00 | 75.00 | 4 |" in after
    assert "image→text" not in after and "| t2i | 80.0 → 80.0 (5) [60, 100] |" in after
    none = {**held, "held_out_queries": 0, "added_queries": 0, "t2i": {"queries": 0}}
    assert "Nothing to report over them" in qs.recall_report({"t2i": block, "i2t": block, "held_out_templates": none})
    assert "Held-out caption templates" not in qs.recall_report({"t2i": block, "i2t": block})  # shapes: no split


def test_the_world_option_reaches_the_config(monkeypatch):
    runs = []
    monkeypatch.setattr(qs, "run", runs.append)
    qs.main(["--world", "open", "--seed", "2", "--train-world-n-val", "9", "--test-images", "40", "--keep-serving"])
    assert runs == [qs.QuickstartConfig(world="open", seed=2, train_world_n_val=9, test_images=40, keep_serving=True)]


def test_each_adapter_encodes_its_own_compressed_tables(tmp_path):
    """A rerun with another checkpoint (a new default, --checkpoint) writes its tables beside the old adapter's, not
    into them (the encode job refuses an output folder made by another adapter)."""
    folders = {qs.compressed_folder(tmp_path, str(ROOT / "checkpoints" / name), "int8")
               for name in ("edje-c16-caprel", "edje-c16-rel", "edje-c16-bind")}
    assert len(folders) == 3 and all(f.parent == tmp_path and f.name.startswith("compressed-int8-") for f in folders)
    again = qs.compressed_folder(tmp_path, str(ROOT / "checkpoints" / "edje-c16-caprel"), "int8")
    assert again in folders and again != qs.compressed_folder(tmp_path, str(ROOT / "checkpoints" / "edje-c16-caprel"), "int4")
