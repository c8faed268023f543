"""The one ranking rule: fusion of ITM and first-stage similarity, recorded in the checkpoint and fitted on val."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edje.evaluation.ranking_fit import FusionSplit, candidate_labels, fit_first_stage_weight, top1_recall
from edje.evaluation.recall import rerank
from edje.model.edje import EDJEModel, save_checkpoint
from edje.model.ranking import RankingConfig, read_ranking, write_ranking
from edje.model.recall import recall


def test_fuse_adds_weighted_similarity_for_numpy_and_torch():
    rule = RankingConfig(4.0)
    assert np.allclose(rule.fuse(np.array([1.0, -1.0]), np.array([0.5, 0.25])), [3.0, 0.0])
    assert torch.allclose(rule.fuse(torch.tensor([1.0, -1.0]), np.array([0.5, 0.25])), torch.tensor([3.0, 0.0]))
    plain = np.array([2.0, 1.0])
    assert RankingConfig().fuse(plain, np.array([9.0, 9.0])) is plain  # weight 0: the ITM logit alone
    with pytest.raises(ValueError):
        RankingConfig(-1.0)
    with pytest.raises(ValueError):
        RankingConfig(float("nan"))


def test_ranking_rule_round_trips_through_the_checkpoint(tiny_edje_config, tmp_path):
    torch.manual_seed(0)
    save_checkpoint(EDJEModel(tiny_edje_config), str(tmp_path / "ck"))
    assert read_ranking(str(tmp_path / "ck")) == RankingConfig()  # none recorded: ITM alone
    write_ranking(str(tmp_path / "ck"), RankingConfig(16.0, chosen_on="val.json"))
    assert read_ranking(str(tmp_path / "ck")) == RankingConfig(16.0, chosen_on="val.json")
    meta = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert "adapter_hash" in meta and meta["ranking"]["first_stage_weight"] == 16.0  # the rest is kept


def _planted(itm_right: bool):
    """3 queries, the first stage ranks the answer first; ITM scores it highest (oracle) or lowest (adversary)."""
    first = np.array([[0, 5, 1, 2], [1, 6, 3, 4], [2, 7, 5, 6]])
    answers = [np.array([0]), np.array([1]), np.array([2])]
    sim = np.array([[0.9, 0.8, 0.1, 0.0]] * 3, dtype=np.float32)  # the first stage's own order
    itm = np.where(first == np.array([[0], [1], [2]]), 5.0 if itm_right else -5.0, 0.0).astype(np.float32)
    split = FusionSplit(itm, sim, candidate_labels(first, answers))
    return (split, split), lambda rule: rerank(first, 4, rule.fuse(itm, sim)), answers  # both directions alike


def test_fitting_the_weight_on_val_prefers_the_right_scorer():
    # ITM is an oracle: any weight that keeps it in charge is best; ties go to the smallest, 0.
    splits, ranked, answers = _planted(itm_right=True)
    rule, sweep = fit_first_stage_weight(splits, "val.json")
    assert rule.first_stage_weight == 0.0 and rule.chosen_on == "val.json" and not rule.fuses
    assert recall(ranked(rule), answers)["r1"] == 100.0
    # ITM is an adversary (answer -5, others 0): the first stage must win. With similarities 0.9 vs
    # 0.8, w x 0.1 > 5 needs w > 50: 64 is the smallest weight on the grid that does it.
    splits, ranked, answers = _planted(itm_right=False)
    rule, sweep = fit_first_stage_weight(splits, "val.json")
    assert rule.first_stage_weight == 64.0
    assert sweep["0.0"] == 0.0 and sweep["32.0"] == 0.0 and sweep["64.0"] == sweep["128.0"] == 200.0
    assert recall(ranked(rule), answers)["r1"] == 100.0
    # Where one weight is already perfect, a switch buys nothing and is not chosen.
    assert fit_first_stage_weight(splits, "val.json", switch=True)[0] == rule


# ------------------------------------------------------------------------------------------ the confidence switch
def test_switched_rule_weighs_each_query_by_its_best_candidates_cosine():
    rule = RankingConfig(10.0, low_confidence_weight=1.0, confidence_threshold=0.5)
    assert rule.switched and rule.fuses and "w = 10, or 1 for a text query" in rule.describe()
    assert "below 0.5" in rule.describe() and rule.for_image_queries() == RankingConfig(10.0)
    itm = np.zeros((2, 3), np.float32)
    sim = np.array([[0.6, 0.2, 0.1], [0.4, 0.3, 0.2]], np.float32)  # query 0 is sure (best 0.6), query 1 is not
    np.testing.assert_allclose(rule.fuse(itm, sim), [[6.0, 2.0, 1.0], [0.4, 0.3, 0.2]], rtol=1e-6)
    # A 1-D array is one query's candidates (a rerank request): its best cosine decides for all of them.
    np.testing.assert_allclose(rule.fuse(np.zeros(3), [0.4, 0.3, 0.2]), [0.4, 0.3, 0.2], rtol=1e-6)
    np.testing.assert_allclose(rule.fuse(np.zeros(2), [0.6, 0.2]), [6.0, 2.0], rtol=1e-6)
    # Flat pairs of several queries name their query: the same numbers as the 2-D layout, in any order.
    flat = rule.fuse(np.zeros(6), sim[:, ::-1].T.ravel(), queries=["b", "a"] * 3)
    np.testing.assert_allclose(flat, rule.fuse(itm, sim)[:, ::-1].T.ravel(), rtol=1e-6)
    assert torch.allclose(rule.fuse(torch.zeros(2), np.array([0.6, 0.2])), torch.tensor([6.0, 2.0]))
    assert rule.fuse(np.zeros(0), np.zeros(0)).shape == (0,)
    with pytest.raises(ValueError, match="query keys"):
        rule.fuse(np.zeros(3), [0.1, 0.2, 0.3], queries=["a"])
    with pytest.raises(ValueError, match="go together"):
        RankingConfig(4.0, low_confidence_weight=1.0)
    with pytest.raises(ValueError, match="low_confidence_weight"):
        RankingConfig(4.0, low_confidence_weight=-1.0, confidence_threshold=0.5)
    # A switch whose both weights are 0 is the ITM logit alone; one whose high weight is 0 still fuses below.
    assert not RankingConfig(0.0, low_confidence_weight=0.0, confidence_threshold=0.5).fuses
    assert RankingConfig(0.0, low_confidence_weight=8.0, confidence_threshold=0.5).fuses


def test_fitting_the_switch_finds_the_queries_the_first_stage_misreads():
    """Sure queries (best cosine 0.9): the first stage ranks the answer first, ITM second. Unsure ones (best 0.3):
    the first stage is wrong and ITM right. One weight gets one kind (the sure, who are more); the switch both."""
    rng = np.random.default_rng(0)
    itm, sim, labels = [], [], []
    for q in range(40):
        sure = q % 4 != 0
        row_sim = np.array([0.9, 0.85, 0.1, 0.0]) if sure else np.array([0.3, 0.25, 0.1, 0.0])
        answer = 0 if sure else 1
        row_itm = rng.normal(0, 0.1, 4) + np.where(np.arange(4) == (1 if sure else answer), 1.0, 0.0)
        itm.append(row_itm), sim.append(row_sim), labels.append(np.arange(4) == answer)
    split = FusionSplit(np.array(itm, np.float32), np.array(sim, np.float32), np.array(labels))
    one, _ = fit_first_stage_weight([split], "val.json")
    switched, _ = fit_first_stage_weight([split], "val.json", switch=True)
    assert top1_recall(split, one) == 75.0 and one.first_stage_weight == 32.0  # w x 0.05 must beat ITM's 1
    assert switched.switched and top1_recall(split, switched) == 100.0
    assert switched.first_stage_weight == 32.0 and switched.low_confidence_weight == 0.0  # ITM alone below
    assert 0.3 < switched.confidence_threshold <= 0.9
    # Image queries rank with the one weight: a split of them gives the switch nothing to fit.
    image_split = FusionSplit(split.itm, split.sim, split.labels, text_queries=False)
    assert not fit_first_stage_weight([image_split], "val.json", switch=True)[0].switched


# ------------------------------------------------------------------------------------------ calibration
def test_platt_fit_recovers_a_known_calibration():
    from edje.evaluation.calibration import calibration_report, fit_platt

    rng = np.random.default_rng(0)
    scores = rng.normal(0, 3, 20000)
    labels = rng.random(20000) < 1 / (1 + np.exp(-(0.5 * scores - 2.0)))  # true p = sigmoid(0.5 s - 2)
    a, b = fit_platt(scores, labels)
    assert a == pytest.approx(0.5, abs=0.03) and b == pytest.approx(-2.0, abs=0.08)
    rule = RankingConfig(32.0).with_calibration(a, b, "synthetic")
    report = calibration_report(rule.probability(scores), labels)
    assert report["ece"] < 0.02 and report["mean_p_true"] > report["mean_p_other"]
    # Perfectly separated scores stay finite (Platt's smoothed targets); a falling score gets the base rate.
    a_sep, _ = fit_platt(np.array([0.0, 1.0, 2.0, 10.0, 11.0]), np.array([0, 0, 0, 1, 1]))
    assert np.isfinite(a_sep) and a_sep > 0
    a_neg, b_neg = fit_platt(-scores, labels)
    flat = rule.with_calibration(a_neg, b_neg, "x").probability([-5.0, 5.0])
    assert a_neg == 0.0 and flat[0] == flat[1] == pytest.approx(labels.mean(), abs=1e-3)  # the base rate
    with pytest.raises(ValueError, match="both"):
        fit_platt(scores[:10], np.ones(10))


def test_calibration_round_trips_and_old_checkpoints_stay_uncalibrated(tiny_edje_config, tmp_path):
    torch.manual_seed(0)
    save_checkpoint(EDJEModel(tiny_edje_config), str(tmp_path / "ck"))
    old = read_ranking(str(tmp_path / "ck"))
    assert not old.calibrated and "not calibrated" in old.describe()
    np.testing.assert_allclose(old.probability([0.0, 40.0, -800.0]), [0.5, 1.0, 0.0])  # sigmoid(score), no overflow
    rule = RankingConfig(32.0, chosen_on="val").with_calibration(0.25, -3.0, "val.json")
    write_ranking(str(tmp_path / "ck"), rule)
    got = read_ranking(str(tmp_path / "ck"))
    assert got == rule and got.calibrated
    np.testing.assert_allclose(got.probability([12.0]), [0.5])  # sigmoid(0.25 x 12 - 3)
    assert "sigmoid(0.25 x score - 3)" in got.describe() and "32 x first-stage cosine" in got.describe()
    with pytest.raises(ValueError):
        RankingConfig(calibration_scale=1.0)  # scale without bias
    with pytest.raises(ValueError):
        RankingConfig(calibration_scale=-1.0, calibration_bias=0.0)
