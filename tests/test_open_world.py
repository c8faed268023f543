"""Tests of the open-vocabulary sample world (emoji glyphs of real nouns), and that the shapes world kept its bytes."""

from __future__ import annotations

import collections
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL
import pytest
from PIL import Image

from edje.sampleworld import SPLITS, WorldConfig, generate, load_world, write_url_list
from edje.sampleworld.open_glyphs import load_glyphs
from edje.sampleworld.open_scene import TWIN_KINDS, OpenScene, apply_swap, open_difference
from edje.sampleworld.open_sprites import CELL, load_sheet, sprite
from edje.sampleworld.open_table import TABLE_PATH, build_table, noun_forms
from edje.sampleworld.open_world import OPEN_WORLD, open_world_config
from edje.sampleworld.registry import scene_from_json
from edje.sampleworld.render import render
from edje.sampleworld.world import sample_records

REPO = Path(__file__).resolve().parents[1]
SMALL = open_world_config(seed=11, n_train=96, n_val=16, n_test=64, family_size=5)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, keyed by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def combined(digests: dict[str, str], keep=lambda name: True) -> str:
    h = hashlib.sha256()
    for name, d in digests.items():
        if keep(name):
            h.update(name.encode() + b"\0" + bytes.fromhex(d))
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    return generate(SMALL, tmp_path_factory.mktemp("open"))


@pytest.fixture(scope="module")
def world_json(world) -> dict:
    return json.loads(world.world_json.read_text())


def families(world_json: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = collections.defaultdict(list)
    for r in world_json["images"]:
        out[r["family_id"]].append(r)
    return out


# --- the shapes world keeps its bytes ---------------------------------------------------------

# Recorded with the code before the open world existed (Pillow 13.0.0 for the JPEG bytes): world.json and
# annotations, the raw pixels, and every file.
PINNED = {
    "default": (WorldConfig(seed=3, n_train=24, n_val=8, n_test=8),
                "95b9f5ad40799841e03aee148a7935a88019716c6e0d42da9d7c30d49ffea619",
                "c5c072edab9b22bb1c455864c7aac2280fa6c226f1827b9cf2bf63e5023f065e",
                "47fb6f3f1ee38661e4e175777f031e321cc7161705f743279402a4519206cc04"),
    "held-out, same side": (WorldConfig(seed=5, n_train=16, n_val=8, n_test=8, image_size=64, held_out=("red+circle",),
                                        same_side_rate=0.5),
                            "6c1211fefcc1557424d3d1230e64bde5fdcff3c5a0631ac15b465c3380e35753",
                            "b1ee3209956863111862d66e11473e8dc342d3f4213658e38be5dcfe484042d1",
                            "5b1df7d8517f3649482e55b6a66d84e8576b0afd635a06cee202e64b1d4e3fb9"),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shapes_world_bytes_are_pinned(name: str, tmp_path: Path) -> None:
    config, meta, pixels, files = PINNED[name]
    digests = tree_digest(generate(config, tmp_path).root)
    assert combined(digests, lambda n: not n.endswith(".jpg")) == meta
    h = hashlib.sha256()
    for r in sample_records(config):
        h.update(render(r.scene, config.image_size, r.render_seed).tobytes())
    assert h.hexdigest() == pixels
    if PIL.__version__ == "13.0.0":  # JPEG bytes are those of one Pillow/libjpeg build
        assert combined(digests) == files


def test_cli_shapes_default_is_the_api_default(tmp_path: Path) -> None:
    config = PINNED["default"][0]
    subprocess.run([sys.executable, "-m", "edje.sampleworld", "generate", "--seed", "3", "--n-train", "24", "--n-val", "8",
                    "--n-test", "8", "--out", str(tmp_path / "cli")], check=True, capture_output=True, cwd=REPO)
    assert tree_digest(tmp_path / "cli") == tree_digest(generate(config, tmp_path / "api").root)


# --- the glyph table and sprites -------------------------------------------------------------------


def test_table_is_what_the_script_builds_and_holds_hundreds_of_nouns() -> None:
    rows = build_table()
    assert TABLE_PATH.read_text(encoding="utf-8").splitlines()[1:] == [r.tsv() for r in rows]
    table = load_glyphs()
    assert len(table.glyphs) == len(rows) >= 300
    assert len(set(table.nouns)) == len(table.nouns)
    assert len(table.categories) >= 7
    assert {"animal", "food", "vehicle", "plant", "tool", "building", "household"} <= set(table.categories)
    forms = [f for r in rows for f in set(noun_forms(r))]
    assert len(forms) == len(set(forms))  # no name belongs to two nouns
    assert table.by_noun["dog"].category == "animal" and "wolf" in table.neighbours("dog")
    assert "taxi" in table.neighbours("car") and "pear" in table.neighbours("apple")
    assert ("automobile", "automobiles") in table.by_noun["car"].synonyms
    by_cp = {r.codepoint: r for r in rows}
    assert (by_cp["U+1F43A"].unicode_name, by_cp["U+1F43A"].noun, by_cp["U+1F43A"].noun_from) == ("WOLF FACE", "wolf", "name")
    assert (by_cp["U+1F333"].unicode_name, by_cp["U+1F333"].noun, by_cp["U+1F333"].noun_from) == ("DECIDUOUS TREE", "tree", "list")
    assert all(len(table.neighbours(n)) >= 1 for n in table.nouns)


def test_every_glyph_has_a_sprite() -> None:
    table = load_glyphs()
    assert load_sheet().shape[2] == 4
    for g in table.glyphs:
        s = sprite(g.index)
        assert s.shape == (CELL, CELL, 4) and (s[..., 3] > 128).mean() > 0.1, g.noun


# --- determinism and layout ------------------------------------------------------------------------


def test_same_seed_same_bytes_different_seed_differs(tmp_path: Path, world) -> None:
    a = tree_digest(world.root)
    assert tree_digest(generate(SMALL, tmp_path / "again").root) == a
    assert len(a) == len(world.images) + 4  # images + 3 annotation files + world.json, as the shapes world
    other = tree_digest(generate(open_world_config(**{**SMALL.__dict__, "seed": 12}), tmp_path / "other").root)
    assert set(other) == set(a) and sum(a[k] != other[k] for k in a) == len(a)


def test_layout_and_annotations_match_the_shapes_world(world, world_json) -> None:
    assert world_json["config"]["kind"] == "open" and world_json["vocabulary"]["kind"] == "open"
    assert world_json["config"]["image_size"] == WorldConfig().image_size
    for s in SPLITS:
        ann = json.loads((world.root / f"flickr30k_{s}.json").read_text())
        assert ann and {"image", "caption", "image_id", "grounding"} <= set(ann[0])
        for a in ann:
            caps = [a["caption"]] if s == "train" else a["caption"]
            grounds = [a["grounding"]] if s == "train" else a["grounding"]
            for c, g in zip(caps, grounds):
                assert g and all(0 <= int(i) < len(c.split()) and 0 < x < 1 and 0 < y < 1 for i, x, y in g)
    back = load_world(world.root)
    assert back.config == SMALL and [r.to_json() for r in back.images] == world_json["images"]
    rows = (world.root / "urls.tsv")
    write_url_list(world.root, "http://127.0.0.1:1", rows)
    assert len(rows.read_text().splitlines()) == len(world.images) + 1


def test_images_decode_at_the_world_size_and_twins_differ(world, world_json) -> None:
    for fam in list(families(world_json).values())[:6]:
        pix = [np.asarray(Image.open(world.root / r["image"])) for r in fam]
        assert all(p.shape == (SMALL.image_size, SMALL.image_size, 3) for p in pix)
        assert all(np.abs(p.astype(int) - pix[0]).mean() > 0.5 for p in pix[1:])


def test_scenes_hold_one_to_four_things_with_distinct_nouns(world_json) -> None:
    sizes = collections.Counter(len(r["objects"]) for r in world_json["images"])
    assert set(sizes) == {1, 2, 3, 4}
    assert {o["count"] for r in world_json["images"] for o in r["objects"]} == {1, 2, 3}
    for r in world_json["images"]:
        nouns = [o["noun"] for o in r["objects"]]
        assert len(set(nouns)) == len(nouns)
        assert all(0 < c < 1 for o in r["objects"] for c in o["center"])


def test_relations_match_geometry_and_same_side_scenes_exist(world_json) -> None:
    same_side = 0
    for r in world_json["images"]:
        objs = r["objects"]
        for rel in r["relations"]:
            (sx, sy), (ox, oy) = objs[rel["subject"]]["center"], objs[rel["object"]]["center"]
            assert {"left_of": sx < ox, "right_of": sx > ox, "above": sy < oy, "below": sy > oy}[rel["predicate"]]
        if len(objs) == 2:
            axis = 0 if objs[0]["cell"][1] == objs[1]["cell"][1] else 1
            cs = [o["center"][axis] for o in objs]
            same_side += all(c < 0.5 for c in cs) or all(c > 0.5 for c in cs)
    assert same_side > 0


# --- twins ----------------------------------------------------------------------------------------------


def test_every_twin_differs_from_its_base_in_exactly_the_labelled_way(world_json) -> None:
    table = load_glyphs()
    kinds = collections.Counter()
    for fam in families(world_json).values():
        base = scene_from_json(fam[0])
        assert isinstance(base, OpenScene) and fam[0]["role"] == "base" and fam[0]["swaps"] == []
        sigs = {base.signature()}
        for r in fam[1:]:
            twin = scene_from_json(r)
            things = base.things
            for s in load_world_swaps(r):
                things = apply_swap(things, s)
            assert things == twin.things  # the recorded swaps make the twin
            assert [o.cell for o in twin.objects] == [o.cell for o in base.objects]  # same slots and backdrop
            assert [o.center for o in twin.objects] == [o.center for o in base.objects] and twin.backdrop == base.backdrop
            assert r["role"] == "+".join(f"{s['kind']}_swap" for s in r["swaps"])
            assert twin.signature() not in sigs
            sigs.add(twin.signature())
            assert set(r["captions"]).isdisjoint(fam[0]["captions"])
            if len(r["swaps"]) == 1:
                kind = r["swaps"][0]["kind"]
                kinds[kind] += 1
                assert open_difference(base, twin) == kind
                if kind == "noun":
                    (i,) = r["swaps"][0]["objects"]
                    old, new = base.objects[i].noun, twin.objects[i].noun
                    assert table.by_noun[old].group == table.by_noun[new].group
    assert set(kinds) == set(TWIN_KINDS)


def load_world_swaps(record: dict):
    from edje.sampleworld.records import ImageRecord

    return ImageRecord.from_json(record, OPEN_WORLD.scene_from_json, OPEN_WORLD.swap_from_json).swaps


def test_facing_only_on_directional_glyphs(world_json) -> None:
    table = load_glyphs()
    for r in world_json["images"]:
        for o in r["objects"]:
            assert bool(o["facing"]) == table.by_noun[o["noun"]].directional
        for s in r["swaps"]:
            if s["kind"] == "facing":
                assert all(table.by_noun[r["objects"][i]["noun"]].directional for i in s["objects"])
        for c in r["captions"]:
            facing_words = {w.strip(",;()") for w in c.split()} & {"left-facing", "right-facing"}
            assert len(facing_words) <= sum(bool(o["facing"]) for o in r["objects"])


def test_captions_name_every_thing_with_its_attributes(world_json) -> None:
    table = load_glyphs()
    for r in world_json["images"][:200]:
        for c in r["captions"]:
            for o in r["objects"]:
                g = table.by_noun[o["noun"]]
                names = [p if o["count"] > 1 else s for s, p in g.names]
                assert any(n in c for n in names), (c, o["noun"])
                if o["count"] > 1:
                    assert {2: "two", 3: "three"}[o["count"]] in c.split() or "(two" in c or "(three" in c


def test_evaluation_reads_open_worlds(world_json) -> None:
    """evaluation/scene_pairs.py buckets an open world's twins in the open world's own kinds (size, facing, count,
    relation, noun), and its relation subsets read open scenes."""
    from edje.evaluation.scene_pairs import KINDS, relation_subsets, scene_difference

    seen = collections.Counter()
    for fam in families(world_json).values():
        base = scene_from_json(fam[0])
        for r in fam[1:]:
            twin = scene_from_json(r)
            kind = scene_difference(base, twin)
            assert kind == open_difference(base, twin) and kind in KINDS
            seen[kind] += 1
            if kind == "relation":
                assert relation_subsets(base, twin, r["captions"][0])["objects"] == str(len(base.objects))
    assert {"size", "relation", "noun", "count", "facing"} <= set(seen), seen


# --- captions: held-out templates -----------------------------------------------------------------------


def test_held_out_templates_appear_only_in_test(world_json) -> None:
    held = set(world_json["vocabulary"]["templates"]["held_out"])
    assert held and held.isdisjoint(world_json["vocabulary"]["templates"]["train"])
    in_test = 0
    for r in world_json["images"]:
        assert len(r["caption_templates"]) == len(r["held_out_captions"]) == len(r["captions"])
        for t, h in zip(r["caption_templates"], r["held_out_captions"]):
            assert h == (t in held)
            assert not h or r["split"] == "test"
            in_test += h
    assert in_test > 0
    test_captions = {c for r in world_json["images"] if r["split"] == "test" for c, h in zip(r["captions"], r["held_out_captions"]) if h}
    train_captions = {c for r in world_json["images"] if r["split"] != "test" for c in r["captions"]}
    assert test_captions.isdisjoint(train_captions)


# --- held-out combinations -----------------------------------------------------------------------------


HELD = ("dog+large", "animal+two", "car+left", "food+three")


def _hits(obj: dict, table) -> bool:
    vals = {obj["noun"], obj["size"], {1: "one", 2: "two", 3: "three"}[obj["count"]], obj["facing"],
            table.by_noun[obj["noun"]].category}
    return any(set(c.split("+")) <= vals for c in HELD)


def test_held_out_combinations_never_appear_in_an_exclude_world() -> None:
    table = load_glyphs()
    records = sample_records(open_world_config(seed=3, n_train=400, n_val=40, n_test=80, held_out=HELD))
    assert not any(_hits(o.to_json(), table) for r in records for o in r.scene.objects)


def test_only_world_shows_a_combination_in_every_image() -> None:
    table = load_glyphs()
    records = sample_records(open_world_config(seed=4, n_train=0, n_val=0, n_test=120, held_out=HELD, held_out_mode="only"))
    assert records and all(any(_hits(o.to_json(), table) for o in r.scene.objects) for r in records)


def test_held_out_values_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown open-world value"):
        sample_records(open_world_config(n_train=4, n_val=0, n_test=0, held_out=("dog+purple",)))
    with pytest.raises(ValueError, match="two different attributes"):
        sample_records(open_world_config(n_train=4, n_val=0, n_test=0, held_out=("dog+animal",)))


# --- scale of the vocabulary -----------------------------------------------------------------------------


def test_a_thousand_image_world_uses_three_hundred_nouns() -> None:
    records = sample_records(open_world_config(seed=0, n_train=800, n_val=100, n_test=100))
    assert len(records) == 1000
    assert len({o.noun for r in records for o in r.scene.objects}) >= 300


def test_one_thing_curriculum_world() -> None:
    records = sample_records(open_world_config(seed=2, n_train=60, n_val=0, n_test=0, min_objects=1, max_objects=1,
                                               family_size=1))
    assert len(records) == 60 and all(len(r.scene.objects) == 1 and r.role == "base" for r in records)
    assert all(r.scene.relations == () for r in records)


# --- command line ----------------------------------------------------------------------------------------------


def test_cli_generate_world_open(tmp_path: Path) -> None:
    out = tmp_path / "cli-open"
    res = subprocess.run([sys.executable, "-m", "edje.sampleworld", "generate", "--world", "open", "--seed", "5",
                          "--n-train", "8", "--n-val", "4", "--n-test", "4", "--held-out", "dog+large",
                          "--out", str(out)], check=True, capture_output=True, text=True, cwd=REPO)
    assert "wrote 16 images" in res.stdout
    w = json.loads((out / "world.json").read_text())
    assert w["config"]["kind"] == "open" and w["config"]["held_out"] == ["dog+large"]
    assert (w["config"]["min_objects"], w["config"]["max_objects"]) == (1, 4)
    assert all("noun" in o for r in w["images"] for o in r["objects"])
    assert len(list((out / "images").glob("sw_*.jpg"))) == 16
    api = generate(open_world_config(seed=5, n_train=8, n_val=4, n_test=4, held_out=("dog+large",)), tmp_path / "api")
    assert tree_digest(out) == tree_digest(api.root)
