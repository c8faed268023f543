"""The held-out-template split of evaluation: on an open world, the text→image figures over the queries written from a
held-out (test-only) caption template, with those captions added to each image's first ones; shapes worlds record no
templates and have no such split. The bookkeeping is tested (which queries, how many, the same figures however they
were chosen), on a random tiny model: not its accuracy."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edje.evaluation.held_out_templates import caption_flags, select_queries, summary
from edje.schemas.annotations import Annotations

# Seed 6's six test families (a family shares its caption templates): one with no held-out caption, one whose first
# caption is held-out, four with one further on.
SEED, N_TEST = 6, 24


def _ann(captions_per_image):
    captions = [c for caps in captions_per_image for c in caps]
    owner = np.array([i for i, caps in enumerate(captions_per_image) for _ in caps])
    ids = [f"i{i}" for i in range(len(captions_per_image))]
    return Annotations(None, ids, ids, captions, owner)


def test_flags_come_from_the_records_by_caption_text():
    ann = _ann([["b", "a"], ["c"]])
    records = [{"captions": ["a", "b"], "caption_templates": ["1/t0", "1/h0"], "held_out_captions": [False, True]},
               {"captions": ["c", "d"], "caption_templates": ["1/h1", "1/t1"], "held_out_captions": [True, False]}]
    assert caption_flags(ann, records).tolist() == [True, False, True]
    # A shapes world records no templates; no world, or a caption the record does not hold: no split either.
    shapes = [{"captions": ["a", "b"]}, {"captions": ["c"]}]
    assert caption_flags(ann, shapes) is None and caption_flags(ann, None) is None
    assert caption_flags(_ann([["b", "x"], ["c"]]), records) is None


def test_each_image_keeps_its_first_captions_and_its_first_held_out_ones():
    per_image = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([6, 7])]
    flags = np.array([False, True, True, True, False, True, False, False])
    # image 0: caption 0, then held-out 1; image 1: its first caption is its first held-out one; image 2: none
    assert select_queries(per_image, flags, 1, 1).tolist() == [0, 1, 3, 6]
    assert select_queries(per_image, flags, 1, 2).tolist() == [0, 1, 2, 3, 5, 6]
    assert select_queries(per_image, flags, 2, 1).tolist() == [0, 1, 3, 4, 6, 7]
    assert select_queries(per_image, flags, 1, 0).tolist() == [0, 3, 6]
    assert select_queries(per_image, None, 1, 1).tolist() == [0, 3, 6]  # no templates recorded: the first captions
    assert select_queries(per_image, flags, None, 1) is None  # every caption is a query already
    assert summary(flags[[0, 1, 3, 6]], 1) == {"queries": 4, "held_out_queries": 2, "added_queries": 1}


def test_the_eval_config_refuses_a_negative_count():
    from edje.evaluation.eval_config import EvalConfig

    with pytest.raises(ValueError, match="held_out_template_queries"):
        EvalConfig(annotations="a.json", tokens=["t"], output="o", backbone_only=True, held_out_template_queries=-1)


@pytest.fixture(scope="module")
def open_world(tmp_path_factory, tiny_edje_config):
    """A 24-image open test world, a raw token table of it from a random tiny backbone, and a random tiny EDJE."""
    import open_clip

    from edje.evaluation.tables import encode_annotations
    from edje.model.backbone import VisionBackbone
    from edje.model.edje import EDJEModel, save_checkpoint
    from edje.sampleworld import generate, open_world_config
    from edje.schemas.config import BackboneConfig

    root = tmp_path_factory.mktemp("openeval")
    generate(open_world_config(seed=SEED, n_train=0, n_val=0, n_test=N_TEST), root / "world")
    torch.manual_seed(0)
    weights = root / "backbone.safetensors"
    save_file({k: v.contiguous() for k, v in open_clip.create_model("edje-tiny-clip").state_dict().items()}, str(weights))
    backbone = VisionBackbone.create(BackboneConfig("edje-tiny-clip", pretrained=str(weights)))
    raw = root / "raw.parquet"
    encode_annotations(str(root / "world" / "flickr30k_test.json"), backbone, str(raw))
    ckpt = root / "ckpt"
    save_checkpoint(EDJEModel(tiny_edje_config).eval(), str(ckpt))
    return root, raw, ckpt


def _evaluate(open_world, out, *args):
    from edje.jobs.evaluate import main

    root, raw, ckpt = open_world
    main(["--annotations", str(root / "world" / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint",
          str(ckpt), "--k", "5", "--examples", "1", "--output", str(out), *args])
    return json.loads((out / "metrics.json").read_text()), json.loads((out / "run.json").read_text())


def test_the_held_out_template_split_on_an_open_world(open_world, tmp_path):
    root = open_world[0]
    records = [r for r in json.loads((root / "world" / "world.json").read_text())["images"]]
    first_held = sum(r["held_out_captions"][0] for r in records)
    any_held = sum(any(r["held_out_captions"]) for r in records)
    all_held = sum(sum(r["held_out_captions"]) for r in records)
    assert 0 < first_held < any_held < N_TEST  # the world has every case (see SEED)

    # One query an image plus its first held-out-template caption: the split is every image that has one.
    m, run = _evaluate(open_world, tmp_path / "one", "--max-queries-per-image", "1", "--held-out-template-queries", "1")
    block = m["held_out_templates"]
    added = any_held - first_held
    assert run["queries"]["t2i"] == N_TEST + added
    assert {k: block[k] for k in ("queries", "held_out_queries", "added_queries")} == {
        "queries": N_TEST + added, "held_out_queries": any_held, "added_queries": added}
    t2i = block["t2i"]
    assert t2i["queries"] == any_held and set(t2i) >= {"first_stage", "reranked", "within_family"}
    assert "i2t" not in block  # image→text ranks captions: not split by their wording
    for stage in ("first_stage", "reranked"):
        assert 0 <= t2i[stage]["r1"] <= t2i[stage]["r10"] <= 100
        assert t2i["within_family"][stage]["queries"] <= any_held
    md = (tmp_path / "one" / "metrics.md").read_text()
    assert f"Held-out caption templates: {any_held} of the {N_TEST + added} text queries" in md
    assert f"{added} of them were added" in md
    assert "| text→image | reranked |" in md.split("Held-out caption templates")[1]
    assert "| image→text |" not in md.split("Held-out caption templates")[1]

    # Without the added captions the split is the first captions that happen to be held-out ones.
    m0, run0 = _evaluate(open_world, tmp_path / "none", "--max-queries-per-image", "1")
    assert run0["queries"]["t2i"] == N_TEST
    assert (m0["held_out_templates"]["held_out_queries"], m0["held_out_templates"]["added_queries"]) == (first_held, 0)
    # Text->image figures stay over each image's first captions: the added queries count in their split alone.
    for stage in ("first_stage", "reranked"):
        assert m["t2i"][stage] == m0["t2i"][stage]
        assert m["t2i"]["within_family"][stage] == m0["t2i"]["within_family"][stage]
    assert "count here alone" in md

    # Every caption a query: the split is every held-out caption, and its figures are those of the same queries
    # chosen the other way (each query's ranking depends on its own text alone).
    m_all, _ = _evaluate(open_world, tmp_path / "all")
    m_sel, run_sel = _evaluate(open_world, tmp_path / "sel", "--max-queries-per-image", "1",
                               "--held-out-template-queries", "5")
    assert m_all["held_out_templates"]["held_out_queries"] == all_held == m_sel["held_out_templates"]["held_out_queries"]
    assert m_all["held_out_templates"]["t2i"] == m_sel["held_out_templates"]["t2i"]
    assert run_sel["queries"]["t2i"] == N_TEST + all_held - first_held


def test_a_reference_seed_is_drawn_as_the_kind_of_the_world_evaluated(open_world, tmp_path):
    from edje.evaluation.novelty import parse_reference, world_kind_beside

    ann = open_world[0] / "world" / "flickr30k_test.json"
    assert world_kind_beside(str(ann)) == "open" and world_kind_beside(str(tmp_path / "a.json")) == "shapes"
    ref = parse_reference("300", 12000, 1000, (), world_kind_beside(str(ann)))
    assert (ref.config.kind, ref.config.min_objects, ref.config.max_objects) == ("open", 1, 4)
    assert "generate --world open --seed 300" in ref.describe()


def test_one_annotation_file_per_held_out_template_reads_that_template_alone(open_world, tmp_path, capsys):
    from edje.research.held_out_template_annotations import main

    root, raw, ckpt = open_world
    records = {r["image_id"]: r for r in json.loads((root / "world" / "world.json").read_text())["images"]}
    test = [r for r in records.values() if r["split"] == "test"]
    held = sorted({t for r in test for t, h in zip(r["caption_templates"], r["held_out_captions"]) if h})
    main([str(root / "world" / "flickr30k_test.json")])
    printed = capsys.readouterr().out
    assert held and all(f"{t}: " in printed for t in held)
    for template in held:
        entries = json.loads((root / "world" / f"ann_{template.replace('/', '_')}.json").read_text())
        assert len(entries) == len(test) and all(len(e["caption"]) == 1 for e in entries)
        for e in entries:  # the template's caption where the image has one, else a training-template caption
            r = records[e["image_id"]]
            written = dict(zip(r["captions"], zip(r["caption_templates"], r["held_out_captions"])))[e["caption"][0]]
            assert written[0] == template if template in r["caption_templates"] else not written[1]
    # Evaluated one caption an image, no captions added: the held-out split is that template's queries alone.
    template = held[0]
    out = tmp_path / "one"
    from edje.jobs.evaluate import main as evaluate
    evaluate(["--annotations", str(root / "world" / f"ann_{template.replace('/', '_')}.json"), "--tokens", str(raw),
              "--checkpoint", str(ckpt), "--k", "5", "--examples", "0", "--max-queries-per-image", "1",
              "--held-out-template-queries", "0", "--output", str(out)])
    split = json.loads((out / "metrics.json").read_text())["held_out_templates"]
    assert split["queries"] == len(test) and split["added_queries"] == 0
    assert split["held_out_queries"] == sum(template in r["caption_templates"] for r in test)
