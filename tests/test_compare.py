"""evaluation/compare.py and jobs/evaluate.py --compare: one table of rerankers over one first stage.

The fake evaluation outputs below use the key layout jobs/evaluate.py writes (metrics.json + run.json, as
in runs/quickstart57/eval) and research/elip_eval.py writes (one metrics.json with its cost)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from edje.evaluation.compare import FirstStageMismatch, Recall, Row, build_table, markdown

FIRST = {"r1": 22.6, "r5": 77.2, "r10": 94.6}
I2T_FIRST = {"r1": 22.1, "r5": 78.3, "r10": 94.6}


def _kinds(colour, shape, size, relation):
    return {"colour": {"accuracy": colour, "pairs": 370}, "relation": {"accuracy": relation, "pairs": 398},
            "shape": {"accuracy": shape, "pairs": 376}, "size": {"accuracy": size, "pairs": 197},
            "two swaps": {"accuracy": 58.78, "pairs": 1327}}


def _edje_metrics(t2i_r1: float, weight: float, first=FIRST) -> dict:
    """jobs/evaluate.py's metrics.json for a checkpoint with a fused rule (ITM alone reported beside it)."""
    wf = {"first_stage": {"accuracy": 34.29, "queries": 936}, "reranked": {"accuracy": 62.61, "queries": 936},
          "by_kind": {"first_stage": _kinds(57.3, 53.19, 64.97, 50.25), "reranked": _kinds(93.24, 87.5, 99.49, 50.0)}}
    direction = lambda fs, r1: {"first_stage": dict(fs), "reranked": {"r1": r1, "r5": 93.7, "r10": fs["r10"]},
                                "reranked_itm_only": {"r1": r1 + 0.2, "r5": 93.7, "r10": fs["r10"]},
                                "within_family": copy.deepcopy(wf)}
    return {"t2i": direction(first, t2i_r1), "i2t": direction(I2T_FIRST, 50.9),
            "ranking": {"first_stage_weight": weight, "chosen_on": "val", "calibration_scale": 0.3,
                        "calibration_bias": -2.7, "calibrated_on": "val"},
            "calibration": {"calibrated": True, "pairs": 20000, "true_pairs": 1892, "mean_p_true": 0.3,
                            "mean_p_other": 0.09, "ece": 0.026, "log_loss": 0.22}}


def _write_edje(d: Path, annotations: Path, metrics: dict, quant=None, k=10) -> Path:
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(metrics))
    run = {"config": {"annotations": str(annotations), "tokens": ["raw/tables"], "output": str(d), "checkpoint": "ck",
                      "k": k, "backbone_only": False, "quant": quant, "group_size": None, "max_queries_per_image": 1,
                      "threads": 1},
           "table": {"kind": "raw", "backbone": "edje-tiny-convvit", "num_tokens": 64, "width": 128, "quantization": "fp16"},
           "queries": {"t2i": 1000, "i2t": 1000},
           "timings": {"load_and_first_stage_s": 10.0, "image_tokens_s": 3.0, "rerank_t2i_s": 20.0,
                       "rerank_i2t_s": 40.0, "pairs_scored": 20000, "total_s": 90.0},
           "torch_threads": 1, "device": "cpu", "loadavg_1_5_15": [2.5, 3.0, 4.0]}
    (d / "run.json").write_text(json.dumps(run))
    return d / "metrics.json"


def _write_elip(d: Path, annotations: Path) -> Path:
    """research/elip_eval.py's metrics.json (text-to-image only, cost inside)."""
    d.mkdir(parents=True)
    wf = {"first_stage": {"accuracy": 34.29, "queries": 936}, "reranked": {"accuracy": 34.29, "queries": 936},
          "by_kind": {"first_stage": _kinds(57.3, 53.19, 64.97, 50.25), "reranked": _kinds(59.73, 54.79, 64.47, 49.75)}}
    m = {"t2i": {"first_stage": dict(FIRST), "reranked": {"r1": 22.1, "r5": 76.7, "r10": 94.6}, "within_family": wf},
         "queries": 1000, "images": 1000, "k": 10,
         "cost": {"backbone_passes_per_query": 10, "pairs": 10000, "rerank_s": 243.68, "pairs_per_s": 41.0,
                  "torch_threads": 1, "loadavg_1_5_15": [6.82, 8.79, 7.71], "device": "cpu"},
         "config": {"annotations": str(annotations), "k": 10, "max_queries_per_image": 1}, "total_s": 318.3}
    (d / "metrics.json").write_text(json.dumps(m))
    return d / "metrics.json"


@pytest.fixture()
def outputs(tmp_path):
    ann = tmp_path / "world" / "flickr30k_test.json"
    ann.parent.mkdir()
    ann.write_text("{}")
    local = _write_edje(tmp_path / "local", ann, _edje_metrics(52.5, 2.0), quant="int8")
    glob = _write_edje(tmp_path / "global", ann, _edje_metrics(26.3, 32.0))
    elip = _write_elip(tmp_path / "elip", ann)
    return tmp_path, ann, local, glob, elip


def _spec(local, glob, elip=None, **extra):
    rows = [{"name": "first stage", "metrics": str(local), "stage": "first_stage", "command": "evaluate --backbone-only"},
            {"name": "EDJE local int8", "metrics": str(local), "command": "evaluate --quant int8", "train_minutes": 88.5,
             "backbone_passes_per_query": 0, "storage": {"tokens": 64, "width": 128, "quant": "int8"}},
            {"name": "global-vector ITM", "metrics": str(glob), "command": "evaluate global", "train_minutes": 25.5,
             "backbone_passes_per_query": 0},
            {"name": "EDJE compressed-64", "not_measured": "no checkpoint on this backbone", "command": "pretrain c64",
             "storage": {"tokens": 64, "width": 128, "quant": "fp16"}}]
    if elip:
        rows.append({"name": "ELIP-style", "metrics": str(elip), "command": "elip_eval", "train_minutes": 12.3})
    return {"title": "test table", "rows": rows, **extra}


def test_table_from_two_evaluations_an_elip_eval_and_a_row_not_measured(outputs):
    tmp, ann, local, glob, elip = outputs
    c = build_table(_spec(local, glob, elip, expected_first_stage={"t2i": FIRST, "queries_t2i": 1000, "k": 10}))
    assert c.first_stage.t2i == Recall(22.6, 77.2, 94.6) and c.first_stage.queries_t2i == 1000
    fs, loc, gl, c64, el = c.rows
    assert all(isinstance(r, Row) for r in c.rows)
    # the first-stage row reads the first stage of the same evaluation
    assert fs.t2i == Recall(22.6, 77.2, 94.6) and fs.rule == "first-stage cosine" and fs.within_family_t2i == 34.29
    assert fs.by_kind_t2i == {"colour": 57.3, "shape": 53.19, "size": 64.97, "relation": 50.25}
    assert fs.pairs_per_s is None and fs.backbone_passes_per_query == 0
    # an EDJE row: recall, ITM alone, binding, cost from run.json (1000 queries x 10 pairs in 20 s), storage bytes
    assert loc.t2i.r1 == 52.5 and loc.i2t.r1 == 50.9 and loc.t2i_itm_only.r1 == pytest.approx(52.7)
    assert loc.rule == "ITM + 2 x cosine" and gl.rule == "ITM + 32 x cosine"
    assert loc.by_kind_t2i["colour"] == 93.24 and loc.by_kind_pairs["colour"] == 370
    assert loc.pairs_per_s == 500.0 and loc.threads == 1 and loc.loadavg == (2.5, 3.0, 4.0)
    assert loc.bytes_per_image == 64 * 128 + 64 * 2 and loc.eval_minutes == 1.5 and loc.train_minutes == 88.5
    # not measured: the reason, no figures, still in the table
    assert not c64.measured and c64.t2i is None and c64.bytes_per_image == 64 * 128 * 2
    # ELIP: its own key layout, text-to-image only, its own cost
    assert el.t2i.r1 == 22.1 and el.i2t is None and el.backbone_passes_per_query == 10 and el.pairs_per_s == 41.0
    assert el.first_stage.i2t is None and el.eval_minutes == pytest.approx(5.3)
    md = markdown(c)
    assert md.count("\n| ") == 2 + len(c.rows)  # header, rule, one line per row
    widths = {line.count(" | ") for line in md.splitlines() if line.startswith("| ")}
    assert len(widths) == 1, "every table line has the same number of cells"
    assert "not measured: no checkpoint on this backbone" in md and "– (T2I only)" in md
    assert "52.5 / 93.7 / 94.6" in md and "500.0 (1 thr, load 2.5)" in md and "`evaluate --quant int8`" in md


def test_evaluate_cli_writes_comparison_md_and_json(outputs):
    tmp, ann, local, glob, elip = outputs
    spec = tmp / "spec.json"
    spec.write_text(json.dumps(_spec(local, glob, elip)))
    from edje.jobs.evaluate import main
    main(["--compare", str(spec), "--output", str(tmp / "cmp")])
    assert "| EDJE local int8 |" in (tmp / "cmp" / "comparison.md").read_text()
    js = json.loads((tmp / "cmp" / "comparison.json").read_text())
    assert [r["name"] for r in js["rows"]] == ["first stage", "EDJE local int8", "global-vector ITM",
                                               "EDJE compressed-64", "ELIP-style"]
    assert js["first_stage"]["t2i"] == FIRST and js["rows"][3]["not_measured"]


def test_refuses_rows_over_different_first_stages(outputs):
    tmp, ann, local, glob, elip = outputs
    other = _write_edje(tmp / "other", ann, _edje_metrics(30.0, 2.0, first={"r1": 25.0, "r5": 77.2, "r10": 94.6}))
    with pytest.raises(FirstStageMismatch, match="'global-vector ITM'.*T2I first-stage recall") as e:
        build_table(_spec(local, other))
    assert "first stage of each measured row" in str(e.value)
    # another k, another split: refused too
    k5 = _write_edje(tmp / "k5", ann, _edje_metrics(30.0, 2.0), k=5)
    with pytest.raises(FirstStageMismatch, match="k 5 != 10"):
        build_table(_spec(local, k5))
    ann2 = tmp / "world2" / "flickr30k_test.json"
    ann2.parent.mkdir()
    with pytest.raises(FirstStageMismatch, match="annotations"):
        build_table(_spec(local, _write_edje(tmp / "w2", ann2, _edje_metrics(30.0, 2.0))))
    # the same first stage everywhere, but not the one the spec expects
    with pytest.raises(FirstStageMismatch, match="expected 22.0 / 77.2 / 94.6"):
        build_table(_spec(local, glob, expected_first_stage={"t2i": {"r1": 22.0, "r5": 77.2, "r10": 94.6}}))


def test_refuses_a_row_whose_storage_is_not_what_its_evaluation_used(outputs):
    tmp, ann, local, glob, elip = outputs
    spec = _spec(local, glob)
    spec["rows"][1]["storage"]["quant"] = "int4"
    with pytest.raises(ValueError, match="int4.*evaluation used int8"):
        build_table(spec)
    spec = _spec(local, glob)
    del spec["rows"][2]["metrics"]
    with pytest.raises(ValueError, match="'metrics'.*'not_measured'"):
        build_table(spec)


def test_held_out_twins_form_a_second_table_with_their_own_first_stages(outputs):
    tmp, ann, local, glob, elip = outputs
    seen_ann, held_ann = tmp / "seen" / "flickr30k_test.json", tmp / "held" / "flickr30k_test.json"
    for a in (seen_ann, held_ann):
        a.parent.mkdir()
        a.write_text("{}")
    seen_first, held_first = {"r1": 24.0, "r5": 80.0, "r10": 95.0}, {"r1": 21.0, "r5": 70.0, "r10": 90.0}
    twin = lambda name, r1s, r1h, quant=None: {
        "in_distribution": str(_write_edje(tmp / f"{name}-seen", seen_ann, _edje_metrics(r1s, 0.0, seen_first), quant)),
        "held_out": str(_write_edje(tmp / f"{name}-held", held_ann, _edje_metrics(r1h, 0.0, held_first), quant)),
        "command": f"pretrain {name} on the exclude world", "train_minutes": 30.0}
    spec = _spec(local, glob, elip, held_out={"title": "Held-out: red+circle", "note": "twins trained on exclude."})
    spec["rows"][0]["held_out"] = twin("first", 24.0, 21.0)
    spec["rows"][1]["held_out"] = twin("local", 90.0, 70.0, quant="int8")
    c = build_table(spec)
    fs, loc = c.rows[0], c.rows[1]
    assert fs.held_out.held_out.rule == "first-stage cosine" and fs.held_out.held_out.t2i.r1 == 21.0
    assert loc.held_out.in_distribution.t2i.r1 == 90.0 and loc.held_out.held_out.t2i.r1 == 70.0
    assert c.held_out_first_stages[1].t2i == Recall.of(held_first) and c.rows[2].held_out is None
    md = markdown(c)
    assert "### Held-out: red+circle" in md and "twins trained on exclude." in md
    assert "| EDJE local int8 | 24.0 -> 90.0 |" in md and "| 24.0 -> 70.0 |" not in md
    assert "| -20.0 / +0.0 | 30.0 |" in md and "| global-vector ITM | – | – |" in md
    held_lines = md.split("### Held-out")[1].splitlines()
    assert len({line.count(" | ") for line in held_lines if line.startswith("| ")}) == 1
    # a twin whose held-out world differs from the others' is refused like a main-table row
    spec["rows"][1]["held_out"]["held_out"] = str(_write_edje(tmp / "odd", held_ann, _edje_metrics(70.0, 0.0, seen_first)))
    with pytest.raises(FirstStageMismatch):
        build_table(spec)
    # the twin's storage must match the row's, as the row's own evaluation must
    spec["rows"][1]["held_out"] = twin("fp16", 90.0, 70.0, quant="fp16")
    with pytest.raises(ValueError, match="stored as int8"):
        build_table(spec)
