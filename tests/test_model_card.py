"""Model cards: every shipped checkpoint folder has a README.md that says what its config.json records."""
import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from edje.evaluation.model_card import main, render

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.parent for p in (REPO / "checkpoints").glob("*/config.json"))


@pytest.mark.parametrize("folder", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_cards_match_their_configs(folder):
    card = folder / "README.md"
    assert card.exists(), f"{folder.name} ships without a model card (python -m edje.evaluation.model_card {folder})"
    assert card.read_text() == render(str(folder)), f"regenerate: python -m edje.evaluation.model_card {folder}"
    text = card.read_text()
    assert "## Ranking rule" in text and "Command:" in text
    data = ModelCard(text).data  # the metadata block a hub reads
    assert data.license == "apache-2.0" and data.library_name == "edje" and "reranker" in data.tags
    assert data.datasets == ["edje-sampleworld"]
    recorded = json.loads((folder / "config.json").read_text()).get("evaluations", [])
    if recorded:
        r1 = [r.metric_value for r in data.eval_results
              if r.task_name == "text-to-image retrieval" and r.metric_name == "recall@1 reranked"]
        assert sorted(r1) == sorted(e["t2i"]["reranked_r1"] for e in recorded)
    # what it does with relations: the limit when it has no relation parts, the figure when it has them
    assert "Relation twins" in text if "- Relations: none" in text else "relation twins, same side" in text


def test_an_evaluation_is_recorded_and_shown(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(SHIPPED[0], ckpt)
    kinds = {"colour": {"accuracy": 99.0, "pairs": 10}, "relation": {"accuracy": 50.5, "pairs": 10}}
    metrics = {d: {"first_stage": {"r1": 23.0}, "reranked": {"r1": 67.2},
                   "within_family": {"first_stage": {"accuracy": 25.0}, "reranked": {"accuracy": 70.5},
                                     "by_kind": {"reranked": kinds}}} for d in ("t2i", "i2t")}
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    main([str(ckpt), "--add-eval", f"seed 913={tmp_path / 'm.json'}", "--eval-command", "jobs/quickstart.py --seed 913"])
    text = (ckpt / "README.md").read_text()
    assert "| seed 913 | 23.0 -> **67.2** |" in text and "99 / - / - / 50.5" in text
    assert "`jobs/quickstart.py --seed 913`" in text
    recorded = json.loads((ckpt / "config.json").read_text())["evaluations"]
    assert [e["label"] for e in recorded][-1] == "seed 913"


def test_a_caption_only_relation_card_says_its_roles_come_from_english(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(REPO / "checkpoints" / "edje-local-rel", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["config"]["encoder"].update(role_vocabulary=None, ground_layer=0, pointer=True)
    (ckpt / "config.json").write_text(json.dumps(config))
    main([str(ckpt)])
    text = (ckpt / "README.md").read_text()
    assert "role embeddings from a rule of English over spatial words (no word list)" in text and "the pointer" in text
    assert "grounding" not in text.split("## How it was trained")[0]
    assert "closed class of spatial words" in text and "role_vocabulary" not in text


def test_a_held_out_card_names_what_its_training_never_showed(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(SHIPPED[0], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    main([str(ckpt)])
    assert "Held out" not in (ckpt / "README.md").read_text()
    (ckpt / "config.json").write_text(json.dumps({**config, "held_out": ["red+circle", "star+left"]}))
    main([str(ckpt)])
    text = (ckpt / "README.md").read_text()
    assert "- Held out: no image of its training showed `red+circle`, `star+left`" in text
    assert "--held-out-mode only|exclude" in text and "not the frozen backbone's" in text


def test_an_open_world_card_shows_that_worlds_twin_kinds_and_pictures(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(SHIPPED[0], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["config"]["backbone"]["name"] = "edje-tiny-convvit-128"  # the open world's shipped backbone
    config["config"]["adapter"]["query_grid"] = 0.5
    (ckpt / "config.json").write_text(json.dumps(config))
    kinds = {"noun": {"accuracy": 91.0, "pairs": 10}, "facing": {"accuracy": 60.0, "pairs": 10}}
    metrics = {d: {"first_stage": {"r1": 30.0}, "reranked": {"r1": 40.0},
                   "within_family": {"first_stage": {"accuracy": 50.0}, "reranked": {"accuracy": 60.0},
                                     "by_kind": {"reranked": kinds}}} for d in ("t2i", "i2t")}
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    main([str(ckpt), "--add-eval", f"seed 1={tmp_path / 'm.json'}", "--eval-command", "jobs/quickstart.py --world open"])
    text = (ckpt / "README.md").read_text()
    assert "T2I twins: size / facing / count / relation / noun |" in text and "- / 60 / - / - / 91 |" in text
    assert "emoji glyphs of 551 nouns" in text and "small shapes" not in text
    assert "learned queries on a 4x4 grid" in text
