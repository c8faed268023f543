"""Tests of the sample world: determinism, bindings, twins, formats, server and CLI."""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from edje.sampleworld import SPLITS, WorldConfig, draw_images, generate, load_world, serve_directory, write_url_list
from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS
from edje.sampleworld.scene import COLOURS, relation_between

REPO = Path(__file__).resolve().parents[1]
SMALL = WorldConfig(seed=7, n_train=48, n_val=16, n_test=32, image_size=96, family_size=4, captions_per_image=5)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, keyed by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("world")
    return generate(SMALL, root)


@pytest.fixture(scope="module")
def world_json(world) -> dict:
    return json.loads(world.world_json.read_text())


# --- determinism ------------------------------------------------------------------------


def test_same_seed_same_bytes_different_seed_differs(tmp_path: Path, world) -> None:
    again = generate(SMALL, tmp_path / "again")
    a, b = tree_digest(world.root), tree_digest(again.root)
    assert a == b
    assert len(a) == len(world.images) + 4  # images + 3 annotation files + world.json
    other = generate(WorldConfig(**{**SMALL.__dict__, "seed": 8}), tmp_path / "other")
    c = tree_digest(other.root)
    assert set(c) == set(a)  # same layout (same counts) ...
    assert sum(a[k] != c[k] for k in a) == len(a)  # ... different content in every file


def test_regenerating_into_same_dir_drops_stale_images(tmp_path: Path) -> None:
    big = WorldConfig(seed=1, n_train=16, n_val=4, n_test=4)
    generate(big, tmp_path)
    small = generate(WorldConfig(seed=1, n_train=8, n_val=4, n_test=4), tmp_path)
    assert len(list((tmp_path / "images").iterdir())) == len(small.images)


def test_images_drawn_on_demand_are_the_generated_bytes(tmp_path: Path, world) -> None:
    lazy = generate(SMALL, tmp_path / "lazy", images=False)
    assert not list((tmp_path / "lazy" / "images").iterdir())
    wanted = [r.image_id for r in lazy.images if r.split == "test"][:5]
    assert draw_images(lazy, wanted) == 5 and draw_images(lazy, wanted) == 0  # drawn once, then found
    lazy_tree, full_tree = tree_digest(lazy.root), tree_digest(world.root)
    assert len(lazy_tree) == 5 + 4 and all(full_tree[k] == v for k, v in lazy_tree.items())
    # An image lost (or never finished) is drawn again, to the same bytes.
    lazy.image_path(wanted[0]).unlink()
    assert draw_images(load_world(lazy.root), wanted) == 1 and tree_digest(lazy.root) == lazy_tree
    # Another world generated into the same folder without images: none of this one's images is left to pass for its.
    other = generate(WorldConfig(**{**SMALL.__dict__, "seed": 8}), lazy.root, images=False)
    assert not list((lazy.root / "images").iterdir())
    assert draw_images(other, wanted) == 5
    redrawn = tree_digest(lazy.root)
    assert all(redrawn[f"images/{i}.jpg"] != lazy_tree[f"images/{i}.jpg"] for i in wanted)  # seed 8's, not seed 7's


# --- counts, splits, annotation format -------------------------------------------------------


def test_counts_and_splits(world, world_json) -> None:
    assert {s: len(world.splits[s]) for s in SPLITS} == {"train": 48, "val": 16, "test": 32}
    ids = [r.image_id for r in world.images]
    assert ids == [f"sw_{i:06d}" for i in range(len(ids))]
    assert world_json["counts"]["images"] == {"train": 48, "val": 16, "test": 32}
    # a world without held-out combinations writes the config it always wrote
    assert world_json["config"] == {k: v for k, v in SMALL.__dict__.items()
                                    if not k.startswith("held_out") and k not in ("same_side_rate", "kind")}
    fam_splits = collections.defaultdict(set)
    fam_sizes = collections.Counter()
    for r in world_json["images"]:
        fam_splits[r["family_id"]].add(r["split"])
        fam_sizes[r["family_id"]] += 1
    assert all(len(s) == 1 for s in fam_splits.values()), "a family straddles splits"
    assert set(fam_sizes.values()) == {4}
    # every meaning appears once in the world
    sigs = [tuple(sorted((o["shape"], o["colour"], o["size"], *o["cell"]) for o in r["objects"])) for r in world_json["images"]]
    assert len(set(sigs)) == len(sigs)


def test_counts_round_to_whole_families(tmp_path: Path) -> None:
    m = generate(WorldConfig(seed=3, n_train=10, n_val=1, n_test=0, family_size=3, image_size=32), tmp_path)
    assert {s: len(m.splits[s]) for s in SPLITS} == {"train": 9, "val": 3, "test": 0}
    assert json.loads((tmp_path / "flickr30k_test.json").read_text()) == []


def test_annotation_format(world) -> None:
    by_id = world.by_id()
    train = json.loads((world.root / "flickr30k_train.json").read_text())
    assert len(train) == 48 * 5
    for e in train:
        assert set(e) == {"image", "caption", "image_id", "grounding"}  # grounding: phrase words and centres
        assert isinstance(e["caption"], str) and all(len(g) == 3 for g in e["grounding"])
        assert e["image"] == f"images/{e['image_id']}.jpg"
        assert (world.root / e["image"]).is_file()
        assert e["caption"] in by_id[e["image_id"]].captions
    for split, n in (("val", 16), ("test", 32)):
        ann = json.loads((world.root / f"flickr30k_{split}.json").read_text())
        assert len(ann) == n
        for e in ann:
            assert set(e) == {"image", "caption", "image_id", "grounding"}
            assert isinstance(e["caption"], list) and len(e["caption"]) == 5 == len(e["grounding"])
            assert len(set(e["caption"])) == 5
            assert by_id[e["image_id"]].split == split
            assert e["image"] == f"images/{e['image_id']}.jpg"


def test_load_world_roundtrip(world) -> None:
    loaded = load_world(world.root)
    assert loaded.config == world.config
    assert loaded.images == world.images
    assert loaded.splits == world.splits


# --- captions bind the right attributes ------------------------------------------------------


def _alt(table: dict[str, tuple[str, ...]]) -> tuple[str, dict[str, str]]:
    back = {w: k for k, ws in table.items() for w in ws}
    return "|".join(sorted(map(re.escape, back), key=len, reverse=True)), back


SIZE_RE, SIZE_BACK = _alt(SIZE_WORDS)
COLOUR_RE, COLOUR_BACK = _alt(COLOUR_WORDS)
SHAPE_RE, SHAPE_BACK = _alt(SHAPE_WORDS)
FULL = re.compile(rf"\b(?P<size>{SIZE_RE}) (?P<colour>{COLOUR_RE}) (?P<shape>{SHAPE_RE})\b")
PAREN = re.compile(rf"\b(?P<colour>{COLOUR_RE}) (?P<shape>{SHAPE_RE}) \((?P<size>{SIZE_RE})\)")
REL_WORDS = {
    "left_of": ("left",),
    "right_of": ("right",),
    "above": ("above", "over", "top"),
    "below": ("below", "beneath", "under", "bottom"),
}


def mentions(caption: str) -> set[tuple[str, str, str]]:
    """Every (shape, colour, size) binding stated in a caption."""
    out = set()
    for rx in (FULL, PAREN):
        for m in rx.finditer(caption):
            out.add((SHAPE_BACK[m["shape"]], COLOUR_BACK[m["colour"]], SIZE_BACK[m["size"]]))
    return out


def test_captions_state_exactly_the_right_bindings(world_json) -> None:
    for r in world_json["images"]:
        truth = {(o["shape"], o["colour"], o["size"]) for o in r["objects"]}
        assert len(r["captions"]) == 5
        for c in r["captions"]:
            assert mentions(c) == truth, (r["image_id"], c, truth)
            assert "\t" not in c and "\n" not in c and '"' not in c
            for rel in r["relations"]:
                pred = rel["predicate"]
                # the relation (or its inverse, phrased from the other side) is named
                inv = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}[pred]
                words = REL_WORDS[pred] + REL_WORDS[inv]
                assert any(re.search(rf"\b{w}\b", c) for w in words), (c, pred)


def test_relations_match_geometry(world_json) -> None:
    for r in world_json["images"]:
        objs = r["objects"]
        for rel in r["relations"]:
            a, b = objs[rel["subject"]], objs[rel["object"]]
            assert relation_between(tuple(a["cell"]), tuple(b["cell"])) == rel["predicate"]
            (ax, ay), (bx, by) = a["center"], b["center"]
            dx, dy = ax - bx, ay - by
            expect = {"left_of": -dx, "right_of": dx, "above": -dy, "below": dy}[rel["predicate"]]
            # clearly separated along the relation's axis, more than across it
            assert expect > 0.2 and expect > 1.5 * abs(dy if rel["predicate"] in ("left_of", "right_of") else dx)


def test_every_test_caption_has_a_binding_twin(world_json) -> None:
    imgs = world_json["images"]
    for r in imgs:
        if r["split"] != "test":
            continue
        mine = {(o["shape"], o["colour"], o["size"], *o["cell"]) for o in r["objects"]}
        for k, c in enumerate(r["captions"]):
            twins = []
            for o in imgs:
                if o is r or o["split"] != r["split"]:
                    continue
                theirs = {(x["shape"], x["colour"], x["size"], *x["cell"]) for x in o["objects"]}
                same_bag = all(
                    sorted(x[attr] for x in o["objects"]) == sorted(x[attr] for x in r["objects"])
                    for attr in ("shape", "colour", "size")
                )
                words = collections.Counter(c.split()) - collections.Counter(o["captions"][k].split())
                if same_bag and theirs != mine and sum(words.values()) <= 2:
                    twins.append(o["image_id"])
            assert twins, (r["image_id"], c)


def test_family_roles_and_captions_differ(world_json) -> None:
    fams = collections.defaultdict(list)
    for r in world_json["images"]:
        fams[r["family_id"]].append(r)
    roles = collections.Counter()
    for members in fams.values():
        assert members[0]["role"] == "base" and members[0]["swaps"] == []
        for m in members[1:]:
            assert m["role"].endswith("_swap") and m["swaps"]
            roles[m["role"]] += 1
        for k in range(5):
            caps = [m["captions"][k] for m in members]
            assert len(set(caps)) == len(caps)
    assert {"colour_swap", "shape_swap", "relation_swap"} <= set(roles)


# --- images ------------------------------------------------------------------------------------


def test_images_decode_and_show_the_scene(world_json, world) -> None:
    size = SMALL.image_size
    for r in world_json["images"]:
        with Image.open(world.root / r["image"]) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and im.size == (size, size)
            px = np.asarray(im, dtype=np.int32)
        bg = np.asarray(r["background"])
        assert np.abs(px[1, 1] - bg).max() <= 12  # corners are background
        for o in r["objects"]:
            x, y = (int(round(v * size)) for v in o["center"])
            # the object's own colour at its centre (tolerance for JPEG chroma subsampling)
            centre = px[y - 1 : y + 2, x - 1 : x + 2].reshape(-1, 3).mean(axis=0)
            assert np.abs(centre - np.asarray(COLOURS[o["colour"]])).max() < 45, (r["image_id"], o)


def test_size_is_visible_at_64px(world_json, world) -> None:
    # Pixels near the object colour within its box, after the 64x64 downscale a model sees.
    areas = {"small": [], "large": []}
    for r in world_json["images"][:40]:
        with Image.open(world.root / r["image"]) as im:
            px = np.asarray(im.resize((64, 64), Image.BICUBIC), dtype=np.int32)
        for o in r["objects"]:
            cx, cy, rad = o["center"][0] * 64, o["center"][1] * 64, o["radius"] * 64
            box = px[max(0, int(cy - rad - 1)) : int(cy + rad + 2), max(0, int(cx - rad - 1)) : int(cx + rad + 2)]
            near = np.abs(box - np.asarray(COLOURS[o["colour"]])).max(axis=-1) < 50
            areas[o["size"]].append(int(near.sum()))
    assert max(areas["small"]) < min(areas["large"])


# --- url list ---------------------------------------------------------------------------------


def test_url_list_tsv_and_parquet(world, tmp_path: Path) -> None:
    tsv = write_url_list(world.root, "http://127.0.0.1:9/", tmp_path / "u.tsv", splits=("train", "test"))
    lines = tsv.read_text().splitlines()
    assert lines[0] == "url\tcaption\timage_id"
    rows = list(csv.DictReader(io.StringIO(tsv.read_text()), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 48 + 32
    by_id = world.by_id()
    for row in rows:
        rec = by_id[row["image_id"]]
        assert rec.split in ("train", "test")
        assert row["url"] == f"http://127.0.0.1:9/images/{rec.image_id}.jpg"
        assert row["caption"] == rec.captions[0]
    pq = pytest.importorskip("pyarrow.parquet")
    pqf = write_url_list(world.root, "http://127.0.0.1:9", tmp_path / "u.parquet", fmt="parquet")
    table = pq.read_table(pqf)
    assert table.column_names == ["url", "caption", "image_id"]
    assert table.num_rows == len(world.images)
    assert table.column("image_id").to_pylist() == [r.image_id for r in world.images]
    with pytest.raises(ValueError):
        write_url_list(world.root, "http://x", tmp_path / "bad", splits=("nope",))


# --- server -----------------------------------------------------------------------------------


def test_server_serves_files_404_and_routes(world) -> None:
    def slow(path: str):
        time.sleep(0.2)
        return (200, "image/jpeg", b"late")

    routes = {"/broken.jpg": (500, "text/plain", b"boom"), "/notimage.jpg": (200, "image/jpeg", b"<html>nope</html>"), "/slow.jpg": slow}
    with serve_directory(world.root, routes=routes) as srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}" and srv.port > 0
        rid = world.images[0].image_id
        r = requests.get(f"{srv.base_url}/images/{rid}.jpg", timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"] == "image/jpeg"
        assert r.content == world.image_path(rid).read_bytes()
        h = requests.head(f"{srv.base_url}/images/{rid}.jpg", timeout=10)
        assert h.status_code == 200 and int(h.headers["Content-Length"]) == len(r.content)
        assert requests.get(f"{srv.base_url}/images/sw_999999.jpg", timeout=10).status_code == 404
        assert requests.get(f"{srv.base_url}/images/", timeout=10).status_code == 404
        assert requests.get(f"{srv.base_url}/broken.jpg", timeout=10).status_code == 500
        nb = requests.get(f"{srv.base_url}/notimage.jpg", timeout=10)
        assert nb.status_code == 200 and nb.content == b"<html>nope</html>"
        t0 = time.perf_counter()
        assert requests.get(f"{srv.base_url}/slow.jpg?x=1", timeout=10).content == b"late"
        assert time.perf_counter() - t0 >= 0.2
        with pytest.raises(requests.exceptions.Timeout):
            requests.get(f"{srv.base_url}/slow.jpg", timeout=0.05)
        srv.routes["/late-added"] = (418, "text/plain", b"teapot")
        assert requests.get(f"{srv.base_url}/late-added", timeout=10).status_code == 418
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{srv.base_url}/images/{rid}.jpg", timeout=2)


def test_server_handles_concurrent_downloads(world) -> None:
    ids = [r.image_id for r in world.images[:32]]
    with serve_directory(world.root) as srv:

        def fetch(i: str) -> bytes:
            with requests.get(f"{srv.base_url}/images/{i}.jpg", timeout=20) as resp:
                resp.raise_for_status()
                return resp.content

        with ThreadPoolExecutor(max_workers=32) as pool:
            got = list(pool.map(fetch, ids * 2))
    assert got == [world.image_path(i).read_bytes() for i in ids * 2]


# --- command line -----------------------------------------------------------------------------


def test_cli_generate_and_urls(tmp_path: Path, world) -> None:
    out = tmp_path / "cli_world"
    cmd = [sys.executable, "-m", "sampleworld", "generate", "--seed", "7", "--out", str(out), "--n-train", "48", "--n-val", "16",
           "--n-test", "32", "--image-size", "96", "--family-size", "4"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert tree_digest(out) == tree_digest(world.root)  # CLI == API, same bytes
    tsv = tmp_path / "urls.tsv"
    res = subprocess.run(
        [sys.executable, "-m", "sampleworld", "urls", "--world", str(out), "--base-url", "http://127.0.0.1:1234", "--out", str(tsv),
         "--splits", "val"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    lines = tsv.read_text().splitlines()
    assert len(lines) == 1 + 16 and lines[1].startswith("http://127.0.0.1:1234/images/sw_")
    helps = subprocess.run([sys.executable, "-m", "sampleworld", "serve", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert helps.returncode == 0 and "--root" in helps.stdout


def test_cli_serve_prints_base_url(tmp_path: Path, world) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "sampleworld", "serve", "--root", str(world.root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            base = proc.stdout.readline().strip()
            assert base.startswith("http://127.0.0.1:")
            rid = world.images[0].image_id
            assert requests.get(f"{base}/images/{rid}.jpg", timeout=10).content == world.image_path(rid).read_bytes()
        finally:
            proc.terminate()
            assert proc.wait(timeout=10) == 0  # SIGTERM stops the server cleanly


def test_one_object_curriculum_world(tmp_path: Path) -> None:
    # The curriculum's first world: one object per image, anywhere in the frame, captions naming its
    # three attributes; no twins exist, so families are single images.
    m = generate(WorldConfig(seed=3, n_train=120, n_val=0, n_test=0, image_size=64, family_size=1,
                             min_objects=1, max_objects=1, captions_per_image=4), tmp_path)
    data = json.loads(m.world_json.read_text())
    assert len(data["images"]) == 120
    centres = []
    for r in data["images"]:
        assert len(r["objects"]) == 1 and r["relations"] == [] and r["role"] == "base"
        o = r["objects"][0]
        centres.append(o["center"])
        assert all(mentions(c) == {(o["shape"], o["colour"], o["size"])} for c in r["captions"]), r["captions"]
        assert len(set(r["captions"])) == 4  # four distinct templates
    assert np.ptp(np.array(centres), axis=0).min() > 0.15  # the object moves about the frame
    with pytest.raises(ValueError, match="no twins"):
        generate(WorldConfig(seed=3, n_train=8, n_val=0, n_test=0, family_size=4, min_objects=1, max_objects=1), tmp_path / "x")
    # The default stream is unchanged by the option: (2, 3) objects draw exactly as before.
    assert WorldConfig().min_objects == 2 and WorldConfig().max_objects == 3
