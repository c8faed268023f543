"""The one ranking rule: fusion of ITM and first-stage similarity, recorded in the checkpoint and fitted on val."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evaluation.recall import recall, rerank
from evaluation.rerank_eval import fit_first_stage_weight
from model.edje import EDJEModel, save_checkpoint
from model.ranking import RankingConfig, read_ranking, write_ranking


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

    def ranked(rule: RankingConfig):
        order = rerank(first, 4, rule.fuse(itm, sim))
        return order, order  # the same planted ranking stands in for both directions

    return ranked, answers


def test_fitting_the_weight_on_val_prefers_the_right_scorer():
    # ITM is an oracle: any weight that keeps it in charge is best; ties go to the smallest, 0.
    ranked, answers = _planted(itm_right=True)
    rule, sweep = fit_first_stage_weight(ranked, answers, answers, "val.json")
    assert rule.first_stage_weight == 0.0 and rule.chosen_on == "val.json"
    assert recall(ranked(rule)[0], answers)["r1"] == 100.0
    # ITM is an adversary (answer -5, others 0): the first stage must win. With similarities 0.9 vs
    # 0.8, w x 0.1 > 5 needs w > 50: 64 is the smallest weight on the grid that does it.
    ranked, answers = _planted(itm_right=False)
    rule, sweep = fit_first_stage_weight(ranked, answers, answers, "val.json")
    assert rule.first_stage_weight == 64.0
    assert sweep["0.0"] == 0.0 and sweep["32.0"] == 0.0 and sweep["64.0"] == sweep["128.0"] == 200.0
    assert recall(ranked(rule)[0], answers)["r1"] == 100.0
