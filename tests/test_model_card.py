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
        r1 = {r.dataset_name: r.metric_value for r in data.eval_results
              if r.task_name == "text-to-image retrieval" and r.metric_name == "recall@1 reranked"}
        assert r1 == {f"EDJE sample world, {e['label']}": e["t2i"]["reranked_r1"] for e in recorded}
    # what it does with relations: the limit when it has no relation parts, the figure when it has them
    assert "Relation twins" in text if "- Relations: none" in text else "relation twins, same side" in text


def _write_metrics(path, first, reranked, within, kinds):
    """A metrics.json as jobs/evaluate.py writes it, both directions alike; kinds: twin kind -> reranked accuracy."""
    by_kind = {k: {"accuracy": v, "pairs": 10} for k, v in kinds.items()}
    metrics = {d: {"first_stage": {"r1": first}, "reranked": {"r1": reranked},
                   "within_family": {"first_stage": {"accuracy": within[0]}, "reranked": {"accuracy": within[1]},
                                     "by_kind": {"reranked": by_kind}}} for d in ("t2i", "i2t")}
    path.write_text(json.dumps(metrics))


def test_an_evaluation_is_recorded_and_shown(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(SHIPPED[0], ckpt)
    _write_metrics(tmp_path / "m.json", 23.0, 67.2, (25.0, 70.5), {"colour": 99.0, "relation": 50.5})
    main([str(ckpt), "--add-eval", f"seed 913={tmp_path / 'm.json'}", "--eval-command", "jobs/quickstart.py --seed 913"])
    text = (ckpt / "README.md").read_text()
    assert "| seed 913 | 23.0 -> **67.2** |" in text and "99 / - / - / 50.5" in text
    assert "`jobs/quickstart.py --seed 913`" in text
    recorded = json.loads((ckpt / "config.json").read_text())["evaluations"]
    assert [e["label"] for e in recorded][-1] == "seed 913"
    assert "held-out caption templates" not in text  # none in these metrics: no table of them


def test_an_evaluations_held_out_templates_are_shown_beside_its_first_captions(tmp_path):
    ckpt = tmp_path / "ck"
    shutil.copytree(SHIPPED[0], ckpt)
    _write_metrics(tmp_path / "m.json", 77.0, 92.0, (78.0, 93.0), {"noun": 96.0})
    metrics = json.loads((tmp_path / "m.json").read_text())
    metrics["held_out_templates"] = {"t2i": {"queries": 956, "first_stage": {"r1": 70.3}, "reranked": {"r1": 86.5},
                                             "within_family": {"first_stage": {"accuracy": 72.6},
                                                               "reranked": {"accuracy": 88.6}}}}
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    main([str(ckpt), "--add-eval", f"seed 7={tmp_path / 'm.json'}", "--eval-command", "jobs/quickstart.py --seed 7"])
    text = (ckpt / "README.md").read_text()
    assert "| seed 7 | 77.0 -> **92.0** |" in text
    assert "held-out caption templates alone" in text and "| seed 7 | 956 | 70.3 -> **86.5** | 72.6 -> **88.6** |" in text
    assert (ckpt / "README.md").read_text() == render(str(ckpt))


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
    _write_metrics(tmp_path / "m.json", 30.0, 40.0, (50.0, 60.0), {"noun": 91.0, "facing": 60.0})
    main([str(ckpt), "--add-eval", f"seed 1={tmp_path / 'm.json'}", "--eval-command", "jobs/quickstart.py --world open"])
    text = (ckpt / "README.md").read_text()
    assert "T2I twins: size / facing / count / relation / noun |" in text and "- / 60 / - / - / 91 |" in text
    assert "emoji glyphs of 551 nouns" in text and "small shapes" not in text
    assert "learned queries on a 4x4 grid" in text
