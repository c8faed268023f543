"""jobs/evaluate.py on a tiny sample world: metrics.json / metrics.md / examples.png, raw and compressed tables."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import int8_half_step
from PIL import Image
from safetensors.torch import save_file

from edje.evaluation.recall import rerank, within_group_accuracy
from edje.model.backbone import VisionBackbone
from edje.model.edje import EDJEModel, save_checkpoint
from edje.model.recall import embedding_recall, recall, top_rankings
from edje.schemas.config import BackboneConfig
from edje.schemas.token_table import TableMetadata, TableMismatchError, build_table, decode_tokens, read_token_table, write_token_table


def test_recall_and_rerank_by_hand():
    rankings = np.array([[2, 0, 1], [0, 1, 2], [1, 2, 0]])
    answers = [np.array([0]), np.array([0]), np.array([0, 1])]
    assert recall(rankings, answers, ks=(1, 2, 3)) == {"r1": 66.67, "r2": 100.0, "r3": 100.0}
    moved = rerank(rankings, 2, np.array([[0.0, 1.0], [0.0, 1.0], [5.0, 1.0]]))
    assert moved.tolist() == [[0, 2, 1], [1, 0, 2], [1, 2, 0]]  # only the first k are reordered
    scores = np.array([[0.1, 0.9, 0.5], [0.3, 0.2, 0.1]])
    assert top_rankings(scores, 2).tolist() == [[1, 2], [0, 1]]
    with pytest.raises(ValueError, match="rerank scores"):
        rerank(rankings, 3, np.zeros((3, 2)))


def test_within_family_accuracy_by_hand():
    # Items 0-3 are one family, 4-5 another. Query 0: answer 1 above twin 0 -> right. Query 1: twin 2
    # above answer 3 -> wrong. Query 2: no twin of answer 4 in the top 3 -> not counted. Query 3:
    # answer 5 outside the top 3 -> not counted.
    group = np.array([0, 0, 0, 0, 1, 1])
    rankings = np.array([[1, 4, 0, 2], [2, 3, 4, 0], [4, 0, 1, 5], [0, 1, 2, 5]])
    answers = [np.array([1]), np.array([3]), np.array([4]), np.array([5])]
    assert within_group_accuracy(rankings, answers, group, k=3) == {"accuracy": 50.0, "queries": 2}
    assert within_group_accuracy(rankings, answers, group, k=1) == {"accuracy": None, "queries": 0}


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    """A 32-image test split, a saved (random) tiny backbone, and a raw token table of the split."""
    from edje.evaluation.tables import encode_annotations
    from edje.sampleworld.world import WorldConfig, generate

    root = tmp_path_factory.mktemp("evalworld")
    generate(WorldConfig(seed=123, n_train=0, n_val=0, n_test=32), root / "world")
    torch.manual_seed(0)
    from edje.model.backbone_registry import open_clip_registry
    open_clip = open_clip_registry()
    weights = root / "backbone.safetensors"
    save_file({k: v.contiguous() for k, v in open_clip.create_model("edje-tiny-clip").state_dict().items()}, str(weights))
    backbone = VisionBackbone.create(BackboneConfig("edje-tiny-clip", pretrained=str(weights)))
    raw = root / "raw" / "test.parquet"
    encode_annotations(str(root / "world" / "flickr30k_test.json"), backbone, str(raw))
    return root, backbone, raw


def _run(args):
    # In-process: the CLI's own main(), without paying a second torch import per call.
    from edje.jobs.evaluate import main
    main(args)


def _check_outputs(out_dir: Path) -> dict:
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert {"t2i", "i2t"} <= set(metrics) <= {"t2i", "i2t", "ranking", "calibration"}
    for d in (metrics["t2i"], metrics["i2t"]):
        # A sample world's world.json lies beside the annotations: the binding diagnostic is reported.
        assert set(d) == {"first_stage", "reranked", "within_family"}
        for r in (d["first_stage"], d["reranked"]):
            assert set(r) == {"r1", "r5", "r10"}
            assert 0 <= r["r1"] <= r["r5"] <= r["r10"] <= 100
        for stage in ("first_stage", "reranked"):
            fam = d["within_family"][stage]
            assert fam["queries"] > 0 and 0 <= fam["accuracy"] <= 100
    md = (out_dir / "metrics.md").read_text()
    assert "| text→image | reranked |" in md and "| image→text | gain |" in md
    with Image.open(out_dir / "examples.png") as im:
        assert im.size[0] > 500 and im.size[1] > 150
    return metrics


def test_evaluate_raw_and_compressed_tables(tiny_world, tiny_edje_config, tmp_path):
    root, backbone, raw = tiny_world
    ann = root / "world" / "flickr30k_test.json"
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config).eval()
    ckpt = tmp_path / "ckpt"
    save_checkpoint(model, str(ckpt))

    # Backbone only: the first stage must equal the embeddings' own recall, computed independently.
    _run(["--annotations", str(ann), "--tokens", str(raw), "--backbone-only", "--output", str(tmp_path / "bb")])
    bb = _check_outputs(tmp_path / "bb")
    from edje.schemas.annotations import load_annotations
    a = load_annotations(ann)
    table, meta = read_token_table(str(raw))
    order = {x: i for i, x in enumerate(table.column("image_id").to_pylist())}
    img = np.stack([np.asarray(table.column("image_embedding")[order[i]].as_py(), np.float32) for i in a.image_ids])
    direct = embedding_recall(backbone.encode_text(a.captions).numpy(), img, a.caption_image)
    for d in ("t2i", "i2t"):
        assert bb[d]["first_stage"] == direct[d]
        assert bb[d]["reranked"] == bb[d]["first_stage"]

    # Raw tables: the adapter runs at evaluation time. Reranking the top 10 cannot change R@10.
    _run(["--annotations", str(ann), "--tokens", str(raw.parent), "--checkpoint", str(ckpt), "--k", "10",
          "--output", str(tmp_path / "raw")])
    m_raw = _check_outputs(tmp_path / "raw")
    for d in ("t2i", "i2t"):
        assert m_raw[d]["first_stage"] == bb[d]["first_stage"]
        assert m_raw[d]["reranked"]["r10"] == m_raw[d]["first_stage"]["r10"]
    run = json.loads((tmp_path / "raw" / "run.json").read_text())
    assert run["timings"]["pairs_scored"] == 32 * 5 * 10 + 32 * 10

    # Compressed tables: stored adapter output (fp32, exact) goes straight to the encoder -> same figures.
    with torch.no_grad():
        tokens = model.adapter(torch.from_numpy(decode_tokens(table, meta))).numpy()
    cmeta = TableMetadata(kind="compressed", backbone=meta.backbone, pretrained=meta.pretrained,
                          feature_layer=meta.feature_layer, num_tokens=16, width=64, quantization="fp32",
                          embed_dim=meta.embed_dim, adapter_hash=model.adapter_hash())
    comp = tmp_path / "comp.parquet"
    write_token_table(build_table(cmeta, table.column("image_id").to_pylist(), tokens,
                                  np.stack([np.asarray(v, np.float32) for v in table.column("image_embedding").to_pylist()])), str(comp))
    _run(["--annotations", str(ann), "--tokens", str(comp), "--checkpoint", str(ckpt), "--output", str(tmp_path / "comp")])
    assert _check_outputs(tmp_path / "comp") == m_raw

    # A compressed table from another adapter is refused, naming the field.
    bad = tmp_path / "bad.parquet"
    other = TableMetadata(**{**cmeta.__dict__, "adapter_hash": "0" * 16})
    write_token_table(build_table(other, table.column("image_id").to_pylist(), tokens,
                                  np.stack([np.asarray(v, np.float32) for v in table.column("image_embedding").to_pylist()])), str(bad))
    with pytest.raises(TableMismatchError, match="adapter_hash"):
        _run(["--annotations", str(ann), "--tokens", str(bad), "--checkpoint", str(ckpt), "--output", str(tmp_path / "bad")])


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_edje_config, tmp_path_factory):
    """A random tiny EDJE checkpoint over edje-tiny-clip tokens."""
    torch.manual_seed(0)
    model = EDJEModel(tiny_edje_config).eval()
    path = tmp_path_factory.mktemp("evalckpt") / "ckpt"
    save_checkpoint(model, str(path))
    return path, model


def _spy_scores(monkeypatch):
    """Record the encoder-ready image tokens and the ITM logits of every score_pairs call of an evaluation."""
    import edje.evaluation.rerank_eval as re_eval
    calls = []
    real = re_eval.score_pairs

    def spy(scorer, texts, image_index, images, label="pairs"):
        out = real(scorer, texts, image_index, images, label)
        calls.append((images.clone(), out.copy()))
        return out

    monkeypatch.setattr(re_eval, "score_pairs", spy)
    return calls


def test_evaluate_max_queries_per_image_scores_that_many_captions(tiny_world, tiny_ckpt, tmp_path, capsys):
    root, _, raw = tiny_world
    ckpt, _ = tiny_ckpt
    _run(["--annotations", str(root / "world" / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint", str(ckpt),
          "--k", "10", "--max-queries-per-image", "2", "--output", str(tmp_path / "lim")])
    _check_outputs(tmp_path / "lim")
    # progress over the scored pairs of each direction, ending at 100 %
    out = capsys.readouterr().out
    assert "[evaluate] text->image: 640/640 pairs (100%)" in out and "[evaluate] image->text: 320/320 pairs (100%)" in out
    run = json.loads((tmp_path / "lim" / "run.json").read_text())
    # 32 images x 2 captions each are the text queries (not the split's 5 per image); i2t ranks those 64 captions.
    assert run["queries"] == {"t2i": 32 * 2, "i2t": 32}
    assert run["timings"]["pairs_scored"] == 32 * 2 * 10 + 32 * 10
    assert "(32 images, 64 captions)" in (tmp_path / "lim" / "metrics.md").read_text()


def test_evaluate_with_no_examples_writes_every_figure_and_no_grid(tiny_world, tiny_ckpt, tmp_path):
    root, _, raw = tiny_world
    ckpt, _ = tiny_ckpt
    _run(["--annotations", str(root / "world" / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint", str(ckpt),
          "--examples", "0", "--output", str(tmp_path / "none")])
    assert not (tmp_path / "none" / "examples.png").exists()
    metrics = json.loads((tmp_path / "none" / "metrics.json").read_text())
    assert metrics["t2i"]["reranked"]["r1"] >= 0 and (tmp_path / "none" / "run.json").exists()


def test_evaluate_quant_round_trips_raw_tables_through_the_codec(tiny_world, tiny_ckpt, tmp_path, monkeypatch):
    root, _, raw = tiny_world
    ckpt, model = tiny_ckpt
    ann = str(root / "world" / "flickr30k_test.json")
    calls = _spy_scores(monkeypatch)
    _run(["--annotations", ann, "--tokens", str(raw), "--checkpoint", str(ckpt), "--output", str(tmp_path / "fp32")])
    fp32_tokens, fp32_t2i = calls[0]
    _run(["--annotations", ann, "--tokens", str(raw), "--checkpoint", str(ckpt), "--quant", "int8",
          "--output", str(tmp_path / "int8")])
    int8_tokens, int8_t2i = calls[2]
    run = json.loads((tmp_path / "int8" / "run.json").read_text())
    assert run["config"]["quant"] == "int8" and ", tokens int8" in (tmp_path / "int8" / "metrics.md").read_text()
    # The reranker saw int8-rounded tokens: off the float adapter output, by at most half a step.
    err = (int8_tokens - fp32_tokens).abs()
    assert err.max() > 0 and (err <= int8_half_step(fp32_tokens) + 1e-7).all()
    # ITM logits move by under 5% of their spread over the pairs (a random head's logits lie close together:
    # measured 1.8e-5 against a std of 9.6e-4), and recall by at most 2 of the 160 text queries.
    assert 0 < np.abs(int8_t2i - fp32_t2i).max() < 0.05 * fp32_t2i.std()
    m32, m8 = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("fp32", "int8"))
    for d in ("t2i", "i2t"):
        assert m8[d]["first_stage"] == m32[d]["first_stage"]  # the codec touches only the reranker's tokens
        for r in ("r1", "r5", "r10"):
            assert abs(m8[d]["reranked"][r] - m32[d]["reranked"][r]) <= 2 * 100 / 160 + 1e-9


def test_evaluate_add_first_stage_similarity_from_the_command_line(tiny_world, tiny_ckpt, tmp_path):
    root, _, raw = tiny_world
    ckpt, _ = tiny_ckpt
    base = ["--annotations", str(root / "world" / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint", str(ckpt)]
    _run(base + ["--output", str(tmp_path / "itm")])
    # A weight this large makes the first-stage cosine decide every order: reranking gives back the first stage.
    _run(base + ["--add-first-stage-similarity", "1e6", "--output", str(tmp_path / "fused")])
    itm, fused = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("itm", "fused"))
    assert itm["ranking"]["first_stage_weight"] == 0.0 and fused["ranking"]["first_stage_weight"] == 1e6
    assert fused["ranking"]["chosen_on"] == "given on the command line"
    for d in ("t2i", "i2t"):
        assert fused[d]["reranked"] == fused[d]["first_stage"]
        assert fused[d]["reranked_itm_only"] == itm[d]["reranked"]  # ITM alone is reported beside it
    # ITM alone reorders the top 10, so a fused ranking that fell back to ITM would be told apart.
    assert any(itm[d]["reranked"] != itm[d]["first_stage"] for d in ("t2i", "i2t"))
    assert "by ITM logit + 1e+06 x first-stage cosine" in (tmp_path / "fused" / "metrics.md").read_text()


def test_evaluate_ranks_by_the_fused_rule_recorded_in_the_checkpoint(tiny_world, tiny_ckpt, tmp_path):
    import shutil

    from edje.model.ranking import RankingConfig, write_ranking

    root, _, raw = tiny_world
    ckpt, _ = tiny_ckpt
    fused = tmp_path / "fused-ckpt"
    shutil.copytree(ckpt, fused)
    # w > 0 recorded in the checkpoint, nothing on the command line: evaluation must rank by the recorded rule.
    write_ranking(str(fused), RankingConfig(1e6, chosen_on="test"))
    _run(["--annotations", str(root / "world" / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint", str(fused),
          "--output", str(tmp_path / "out")])
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["ranking"]["first_stage_weight"] == 1e6 and m["ranking"]["chosen_on"] == "test"
    for d in ("t2i", "i2t"):
        assert m[d]["reranked"] == m[d]["first_stage"]  # w = 1e6: the cosine decides every order
    # ITM alone reorders the top 10 of this split, so an evaluation that ignored the rule would differ.
    assert any(m[d]["reranked_itm_only"] != m[d]["first_stage"] for d in ("t2i", "i2t"))


def _checkpoint_to_fit(tiny_world, tiny_ckpt, tmp_path):
    """(a copy of the tiny checkpoint that a fit may rewrite, the tiny world's test annotations, its raw table)."""
    import shutil

    root, _, raw = tiny_world
    fit = tmp_path / "fit-ckpt"
    shutil.copytree(tiny_ckpt[0], fit)
    return fit, str(root / "world" / "flickr30k_test.json"), raw


def test_fit_first_stage_weight_through_the_cli_records_the_weight_and_its_calibration(tiny_world, tiny_ckpt, tmp_path):
    import os
    import subprocess
    import sys

    fit, ann, raw = _checkpoint_to_fit(tiny_world, tiny_ckpt, tmp_path)
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, str(repo / "jobs" / "evaluate.py"), "--annotations", ann, "--tokens", str(raw),
                    "--checkpoint", str(fit), "--fit-first-stage-weight", "--threads", "1",
                    "--output", str(tmp_path / "fit")], check=True, cwd=repo, env={**os.environ},
                   stdout=subprocess.DEVNULL)
    recorded = json.loads((fit / "config.json").read_text())["ranking"]
    sweep = json.loads((tmp_path / "fit" / "run.json").read_text())["timings"]["first_stage_weight_sweep"]
    best = max(sweep.values())
    assert recorded["first_stage_weight"] == min(float(w) for w, v in sweep.items() if v == best)  # ties: smaller w
    assert recorded["chosen_on"] == ann and recorded["calibrated_on"] == ann
    assert recorded["calibration_scale"] >= 0 and np.isfinite(recorded["calibration_bias"])
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert metrics["ranking"] == recorded and metrics["calibration"]["calibrated"]
    # A later evaluation without flags reads the same rule back from the checkpoint.
    _run(["--annotations", ann, "--tokens", str(raw), "--checkpoint", str(fit), "--output", str(tmp_path / "again")])
    again = json.loads((tmp_path / "again" / "metrics.json").read_text())
    assert again["ranking"] == recorded and again["calibration"] == metrics["calibration"]
    assert again["t2i"]["reranked"] == metrics["t2i"]["reranked"]


def test_fit_confidence_switch_on_rewritten_captions_through_the_cli(tiny_world, tiny_ckpt, tmp_path):
    from edje.evaluation.eval_config import EvalConfig
    from edje.model.ranking import RankingConfig

    fit, ann, raw = _checkpoint_to_fit(tiny_world, tiny_ckpt, tmp_path)
    _run(["--annotations", ann, "--tokens", str(raw), "--checkpoint", str(fit), "--fit-first-stage-weight",
          "--fit-confidence-switch", "--fit-caption-augment", "0.5", "--output", str(tmp_path / "fit")])
    recorded = json.loads((fit / "config.json").read_text())["ranking"]
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    n = run["queries"]["t2i"]
    assert 0.3 * n < run["timings"]["captions_rewritten_for_the_fit"] < 0.7 * n  # about half, seeded
    assert metrics["ranking"] == recorded and recorded["chosen_on"] == ann
    rule = RankingConfig(**recorded)
    assert rule.switched == (recorded["low_confidence_weight"] is not None)
    # The recorded rule ranks the split it was fitted on at least as well as the best single weight of the sweep:
    # the fit and the evaluation's own figures read the same rule the same way.
    best_single = max(run["timings"]["first_stage_weight_sweep"].values())
    assert metrics["t2i"]["reranked"]["r1"] + metrics["i2t"]["reranked"]["r1"] >= best_single - 0.02
    for bad in (dict(fit_confidence_switch=True), dict(fit_caption_augment=0.5),
                dict(fit_first_stage_weight=True, fit_caption_augment=1.5)):
        with pytest.raises(ValueError):
            EvalConfig(annotations=ann, tokens=[str(raw)], output="x", checkpoint=str(fit), **bad)


def test_the_tables_command_encodes_with_the_shipped_weights_unless_told_otherwise():
    """An untrained backbone's table trains and evaluates without an error, so it is only made by name."""
    from edje.evaluation.tables import _weights
    from edje.schemas.weights import find_weights

    assert _weights("edje-tiny-convvit", None) == find_weights(backbone="edje-tiny-convvit")
    assert _weights("edje-tiny-convvit", "none") is None
    assert _weights("edje-tiny-convvit", "w.safetensors") == "w.safetensors"
    with pytest.raises(SystemExit, match="ships no weights"):
        _weights("ViT-B-32", None)


def test_the_tables_command_picks_the_backbone_shipped_for_the_worlds_kind(tmp_path):
    from dataclasses import replace

    from edje.evaluation.tables import world_backbone
    from edje.sampleworld.open_world import open_world_config
    from edje.sampleworld.world import generate
    from edje.schemas.shipped import DEFAULT_BACKBONE

    generate(replace(open_world_config(seed=13, n_train=0, n_val=0, n_test=4), family_size=4), tmp_path / "open")
    assert world_backbone(str(tmp_path / "open" / "flickr30k_test.json")) == "edje-tiny-convvit-128"
    assert world_backbone(str(tmp_path / "elsewhere" / "captions.json")) == DEFAULT_BACKBONE


def _reference(tmp_path: Path, world: Path, seen_families, name: str) -> Path:
    """A copy of `world` whose images of `seen_families` form its train split (the meanings a model saw)."""
    data = json.loads((world / "world.json").read_text())
    for r in data["images"]:
        r["split"] = "train" if r["family_id"] in seen_families else "val"
    out = tmp_path / name
    out.mkdir()
    (out / "world.json").write_text(json.dumps(data))
    return out


def test_novel_against_splits_every_figure_by_the_answer_images_meaning(tiny_world, tiny_ckpt, tmp_path):
    root, _, raw = tiny_world
    ckpt, _ = tiny_ckpt
    world = root / "world"
    families = sorted({r["family_id"] for r in json.loads((world / "world.json").read_text())["images"]})
    half = set(families[::2])  # 4 of the 8 families: 16 images seen, 16 novel
    base = ["--annotations", str(world / "flickr30k_test.json"), "--tokens", str(raw), "--checkpoint", str(ckpt),
            "--k", "10", "--max-queries-per-image", "2"]  # two captions an image: t2i queries are not images
    runs = {}
    for name, seen in (("none", set()), ("a", half), ("b", set(families) - half)):
        _run(base + ["--novel-against", str(_reference(tmp_path, world, seen, f"ref_{name}")),
                     "--output", str(tmp_path / name)])
        runs[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    overall = runs["none"]
    # Nothing seen: the novel figures are the overall ones, query for query.
    queries = {"t2i": 64, "i2t": 32}
    for d in ("t2i", "i2t"):
        assert runs["none"]["novel"][d] == {"queries": queries[d], **overall[d]}
    assert runs["none"]["novel"]["repeated_images"] == 0
    # Two complementary references split the queries in two: their hits add up to the overall hits.
    for name in ("a", "b"):
        novel = runs[name]["novel"]
        assert (novel["images"], novel["novel_images"], novel["repeated_images"], novel["repeated_pct"]) == (32, 16, 16, 50.0)
        assert (novel["t2i"]["queries"], novel["i2t"]["queries"]) == (32, 16)
        assert runs[name]["t2i"] == overall["t2i"]  # the overall figures do not move
    for d in ("t2i", "i2t"):
        for stage in ("first_stage", "reranked"):
            for r in ("r1", "r5", "r10"):
                split = sum(runs[n]["novel"][d][stage][r] * queries[d] / 2 for n in ("a", "b"))
                assert split == pytest.approx(overall[d][stage][r] * queries[d], abs=1)  # one hit is 100; rounding < 1
            fam = [runs[n]["novel"][d]["within_family"][stage] for n in ("a", "b")]
            whole = overall[d]["within_family"][stage]
            assert fam[0]["queries"] + fam[1]["queries"] == whole["queries"]
            hits = sum(f["accuracy"] * f["queries"] for f in fam if f["queries"])
            assert hits == pytest.approx(whole["accuracy"] * whole["queries"], abs=1)
            pairs = [runs[n]["novel"][d]["within_family"]["by_kind"][stage] for n in ("a", "b")]
            for kind, v in overall[d]["within_family"]["by_kind"][stage].items():
                assert sum(p.get(kind, {}).get("pairs", 0) for p in pairs) == v["pairs"]
    md = (tmp_path / "a" / "metrics.md").read_text()
    assert "Novel meanings: 16 of 32 images" in md and "16 (50.0 %) repeat one exactly" in md
    assert "| text→image | reranked |" in md.split("Novel meanings")[1]
    assert "Per twin kind" in md.split("Novel meanings")[1]  # the same per-kind table as for all answers


def test_novel_against_needs_the_world_beside_the_annotations(tiny_world, tiny_ckpt, tmp_path):
    root, _, raw = tiny_world
    ann = tmp_path / "flickr30k_test.json"  # the annotations without their world.json
    ann.write_text((root / "world" / "flickr30k_test.json").read_text())
    with pytest.raises(ValueError, match="world.json"):
        _run(["--annotations", str(ann), "--tokens", str(raw), "--checkpoint", str(tiny_ckpt[0]),
              "--novel-against", "100", "--output", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        _run(["--annotations", str(ann), "--tokens", str(raw), "--checkpoint", str(tiny_ckpt[0]),
              "--novel-against", str(tmp_path / "no-such-world"), "--output", str(tmp_path / "x")])
