"""Query towers: a second text tower over the tables' image space joins the backbone's in embedding a query. The rule
fitted with it records it (pinned to its weights' sha256), and evaluation, serving's first stage and the Python API
read it back from the checkpoint; a tower over another image tower is refused."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from edje.evaluation.eval_config import EvalConfig
from edje.evaluation.rerank_eval import evaluate
from edje.evaluation.tables import encode_annotations
from edje.model.backbone import VisionBackbone
from edje.model.backbone_registry import open_clip_registry
from edje.model.ranking import QueryTower, RankingConfig, read_ranking, write_ranking
from edje.reranker import EDJEReranker
from edje.sampleworld import generate
from edje.sampleworld.open_world import open_world_config
from edje.schemas.config import BackboneConfig
from edje.schemas.weights import weights_sha256
from edje.serving.first_stage import FirstStage
from edje.training.text_distill import take_image_tower

BACKBONE = "edje-tiny-convvit-128"
TEACHER = "checkpoints/edje-open-convvit-128.safetensors"
STUDENT = "edje-tiny-convvit-128-minilm"
QUERIES = ["a small dog to the left of a red car", "two cats", "(a taxi)"]


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> str:
    """The packaged MiniLM as a text tower on the open backbone's image tower (untrained: its own directions)."""
    torch.manual_seed(0)
    open_clip = open_clip_registry()
    model = open_clip.create_model(STUDENT)
    take_image_tower(model, open_clip.create_model(BACKBONE, pretrained=TEACHER), STUDENT, BACKBONE)
    path = str(tmp_path_factory.mktemp("student") / "student.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path, metadata={"model": STUDENT})
    return path


def _backbone(pretrained: str = TEACHER, name: str = BACKBONE) -> VisionBackbone:
    return VisionBackbone.create(BackboneConfig(name, pretrained))


def test_a_query_tower_joins_the_backbones_text_embedding_and_one_over_another_image_tower_is_refused(student):
    torch.set_num_threads(1)
    own, theirs = _backbone().encode_text(QUERIES), _backbone(student, STUDENT).encode_text(QUERIES)
    joined = _backbone().join_query_towers([QueryTower(STUDENT, student, 2.0)])
    torch.testing.assert_close(joined.encode_text(QUERIES), F.normalize(own + 2.0 * theirs, dim=-1))
    assert not torch.allclose(joined.encode_text(QUERIES), own, atol=1e-2)  # the tower moved the query
    other = _backbone("checkpoints/edje-open-convvit-128-x.safetensors")  # same architecture, other image weights
    with pytest.raises(ValueError, match="must share its image tower"):
        other.join_query_towers([QueryTower(STUDENT, student)])


def test_the_rule_records_its_query_towers(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    rule = RankingConfig(64.0, query_towers=(QueryTower.parse("m=w.safetensors", 0.5),))
    write_ranking(str(tmp_path), rule)
    back = read_ranking(str(tmp_path))
    assert back == rule and back.query_towers == (QueryTower("m", "w.safetensors", 0.5),)
    assert back.formula().endswith("queries embedded by the backbone's text tower + 0.5 x m (w.safetensors)")
    assert RankingConfig(64.0).formula() == "ITM logit + 64 x first-stage cosine"
    with pytest.raises(ValueError, match="weight must be a finite number > 0"):
        QueryTower("m", weight=0.0)
    with pytest.raises(ValueError, match="NAME or NAME=WEIGHTS"):
        QueryTower.parse("=w.safetensors")
    with pytest.raises(ValueError, match="applies to --fit-first-stage-weight"):
        EvalConfig(annotations="a.json", tokens=["t"], output="o", checkpoint="c", query_towers=["m"])


def test_a_rule_fitted_with_a_query_tower_is_the_one_evaluation_serving_and_the_api_read(student, tmp_path):
    torch.set_num_threads(2)
    world = generate(open_world_config(seed=41, n_train=0, n_val=0, n_test=48, family_size=4), tmp_path / "world")
    ann = str(world.root / "flickr30k_test.json")
    raw = str(tmp_path / "raw.parquet")
    encode_annotations(ann, _backbone(), raw)
    fitted, plain = tmp_path / "fitted", tmp_path / "plain"
    for ck in (fitted, plain):
        shutil.copytree("checkpoints/edje-open-c16", ck)

    def run(ck, name, **kw):
        return evaluate(EvalConfig(annotations=ann, tokens=[raw], output=str(tmp_path / name), checkpoint=str(ck), k=5,
                                   examples=0, **kw))

    fit = run(fitted, "fit", fit_first_stage_weight=True, query_towers=[f"{STUDENT}={student}"])
    rule = read_ranking(str(fitted))
    assert rule.query_towers == (QueryTower(STUDENT, student, 1.0, weights_sha256(student)),)
    assert fit["ranking"]["query_towers"][0]["name"] == STUDENT
    again = run(fitted, "again")  # no --query-tower: the checkpoint's rule names it
    without = run(plain, "plain")
    assert again["t2i"]["first_stage"] == fit["t2i"]["first_stage"] != without["t2i"]["first_stage"]

    expected = _backbone().join_query_towers(rule.query_towers).encode_text(QUERIES[:1]).numpy()[0]
    served = FirstStage([raw], query_towers=rule.query_towers, checkpoint=str(fitted)).search_text(QUERIES[0], 5)
    np.testing.assert_allclose(served.query_embedding, expected, atol=1e-5)
    api = EDJEReranker.from_pretrained(str(fitted))
    np.testing.assert_allclose(api.encoder.encode_text(QUERIES[:1])[0], expected, atol=1e-5)
    # save_pretrained carries the tower's weights in the folder, as it does the backbone's
    saved = api.save_pretrained(str(tmp_path / "saved"))
    tower = read_ranking(saved).query_towers[0]
    assert tower.pretrained == "backbone/student.safetensors"
    assert weights_sha256(str(tmp_path / "saved" / tower.pretrained)) == weights_sha256(student)
    again_api = EDJEReranker.from_pretrained(saved).encoder.encode_text(QUERIES[:1])[0]
    np.testing.assert_allclose(again_api, expected, atol=1e-5)
    # a tower file that no longer holds the weights the rule recorded is refused, not read
    moved = str(tmp_path / "moved.safetensors")
    save_file({"x": torch.zeros(1)}, moved, metadata={"model": STUDENT})
    with pytest.raises(Exception, match="sha256"):
        _backbone().join_query_towers([QueryTower(STUDENT, moved, 1.0, weights_sha256(student))])
