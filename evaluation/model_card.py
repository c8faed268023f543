"""A checkpoint folder's model card (README.md), written from what its config.json records.

`--add-eval LABEL=metrics.json` first records an evaluation's figures (jobs/evaluate.py's metrics.json,
e.g. of `jobs/quickstart.py --seed S` on a world seed no run used) under "evaluations" in config.json,
with the command that produced them; the card is then rendered from config.json alone, so a test can
check that every shipped card says what its checkpoint records.

  python -m edje.evaluation.model_card checkpoints/edje-c16-bind \
      --add-eval "seed 913=runs/qs913/eval/metrics.json" --eval-command "jobs/quickstart.py --seed 913"
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional

from huggingface_hub import EvalResult, ModelCardData

from edje.model.ranking import RankingConfig
from edje.sampleworld.registry import world_kind
from edje.schemas.codecs import bytes_per_image
from edje.schemas.shipped import WORLD_BACKBONES

CARD = "README.md"
LICENSE = "apache-2.0"  # the project's licence (pyproject.toml); the weights are trained by its own jobs
SAMPLE_WORLD = "edje-sampleworld"  # the embedded, generated dataset every shipped checkpoint was trained on
NO_RELATIONS = ("Relation twins (\"A left of B\" against \"B left of A\") are ranked at chance: this checkpoint has no "
                "relation parts (role embeddings, the subject-minus-object route, grounding), and its training had no "
                "signal that needs position.")
RELATION_LIMITS = ("What its recipe needs from data, beyond image-caption pairs (a sample-world diagnostic, not a recipe a "
                   "user's data supports): training regressed each noun's object centre from the sample world's scene "
                   "graph (the `ground` objective, phrase boxes), and scoring runs a rule-based role parse whose "
                   "noun-phrase words are the word list this checkpoint records (`role_vocabulary`: the sample world's "
                   "attribute and shape words). On open-vocabulary captions the parse finds no noun phrase (\"a dog to "
                   "the left of a bicycle\" scores without error, with no roles), and it takes \"a man left the room\" "
                   "for a relation.",)
CAPTION_RELATION_LIMITS = ("Relations are read from English's closed class of spatial words (left / right, above / "
                           "below and their variants) by a rule over the text around them "
                           "(`edje.model.relation_spans`), with no word list of any world; a relation stated "
                           "otherwise (\"the dog chases the cat\", \"in front of\", \"inside\") gets no roles and is "
                           "scored as plain text.",)
# What each sample world kind shows, for the card's limits.
WORLD_PICTURES = {"shapes": "small shapes on plain backgrounds",
                  "open": "emoji glyphs of 551 nouns on plain backgrounds"}


def world_of(backbone: str) -> str:
    """The sample world kind a checkpoint was trained on: the one whose shipped backbone it reads (else shapes)."""
    return next((kind for kind, name in WORLD_BACKBONES.items() if name == backbone), "shapes")


def limits_of(kind: str) -> tuple:
    """The card's limit that every sample-world checkpoint shares."""
    return (f"Trained on the project's sample world only ({WORLD_PICTURES[kind]}, template captions); real photographs "
            "and free-form captions need a checkpoint trained on real pairs.",)


def record_evaluation(checkpoint: str, label: str, metrics_path: str, command: str) -> None:
    """Add one evaluation's headline figures to the checkpoint's config.json (replacing one of the same label)."""
    m = json.loads(Path(metrics_path).read_text())
    row = {"label": label, "command": command}
    for d in ("t2i", "i2t"):
        row[d] = _headline(m[d])
        fam = m[d].get("within_family")
        if fam:
            row[d]["by_kind"] = {k: v["accuracy"] for k, v in fam.get("by_kind", {}).get("reranked", {}).items()}
            side = fam.get("relation_subsets", {}).get("reranked", {}).get("side: same side")
            if side:
                row[d]["relation_same_side"] = side["accuracy"]
    held = m.get("held_out_templates", {}).get("t2i")
    if held:  # the wordings no training caption shows: a card that omitted them would show only the easier half
        row["held_out_templates"] = {"queries": held["queries"], **_headline(held)}
    path = Path(checkpoint) / "config.json"
    meta = json.loads(path.read_text())
    meta["evaluations"] = [e for e in meta.get("evaluations", []) if e["label"] != label] + [row]
    path.write_text(json.dumps(meta, indent=2, sort_keys=True))


def _headline(split: Dict) -> Dict:
    """A metrics split's R@1 at both stages, and its within-family accuracy at both where its world has families."""
    row = {"first_stage_r1": split["first_stage"]["r1"], "reranked_r1": split["reranked"]["r1"]}
    fam = split.get("within_family")
    if fam:
        row["within_family"] = fam["reranked"]["accuracy"]
        row["within_family_first_stage"] = fam["first_stage"]["accuracy"]
    return row


def card_data(name: str, meta: Dict) -> ModelCardData:
    """The card's metadata block (what a model hub lists and searches): licence, library, tags, data, figures."""
    results = []
    for e in meta.get("evaluations", []):
        for direction, task in (("t2i", "text-to-image retrieval"), ("i2t", "image-to-text retrieval")):
            fig = e[direction]
            metrics = [("recall@1 reranked", fig["reranked_r1"]), ("recall@1 first stage", fig["first_stage_r1"])]
            if fig.get("within_family") is not None:
                metrics.append(("within-family accuracy", fig["within_family"]))
            # The label is also the dataset's config: the hub groups results by task, dataset type and config, so
            # without it every evaluation's figures would sit under the first one's dataset name.
            results += [EvalResult(task_type=task.replace(" ", "-"), task_name=task, dataset_type=SAMPLE_WORLD,
                                   dataset_name=f"EDJE sample world, {e['label']}", dataset_config=e["label"],
                                   metric_type=kind.replace(" ", "_"),
                                   metric_name=kind, metric_value=value) for kind, value in metrics]
    enc = meta["config"]["encoder"]
    base = meta.get("base_model") or (enc.get("language_model") or None)
    return ModelCardData(model_name=name, license=LICENSE, library_name="edje", base_model=base, datasets=[SAMPLE_WORLD],
                         tags=["edje", "reranker", "vision-language", "image-text-retrieval", "cross-encoder", "ray"],
                         eval_results=results or None)


def render(checkpoint: str) -> str:
    """The model card of a checkpoint folder, from its config.json: the metadata block, then the text."""
    folder = Path(checkpoint)
    meta = json.loads((folder / "config.json").read_text())
    return f"---\n{card_data(folder.name, meta).to_yaml()}\n---\n\n" + _body(folder, meta)


def _body(folder: Path, meta: Dict) -> str:
    """The card's text."""
    cfg = meta["config"]
    a, enc, b = cfg["adapter"], cfg["encoder"], cfg["backbone"]
    world = world_of(b["name"])
    kinds_of_world = world_kind(world).twin_kinds
    bert = enc["bert_config"]
    m = enc["num_image_tokens"]
    width = bert["hidden_size"]
    grid = f" on a {round(m ** 0.5)}x{round(m ** 0.5)} grid, each pooling near its own region" if a.get("query_grid") else ""
    kind = f"compressed ({m} learned queries{grid})" if a["kind"] == "compressed" else f"local (per-token MLP, {m} tokens)"
    lines = [f"# {folder.name}", "",
             "An EDJE reranker (joint encoder over a caption and an image's stored tokens) of the EDJE on Ray project.", "",
             "## What it is", "",
             f"- Adapter: {kind}; stored tokens per image: {m} x {width}, "
             f"{bytes_per_image(m, width, 'int8'):,} B at int8, {bytes_per_image(m, width, 'fp16'):,} B at fp16, "
             f"{bytes_per_image(m, width, 'int4'):,} B at int4 (plus the pooled embedding of the first stage).",
             f"- Joint encoder: BERT, {bert['num_hidden_layers']} layers x {width} wide, {bert['num_attention_heads']} "
             f"heads; captions up to {enc['max_text_tokens']} wordpieces; input length {enc['max_text_tokens'] + 3 + m} "
             f"at most; word context {enc.get('word_context', 0)}.",
             _relations(enc),
             f"- Backbone (frozen; its tokens are what the adapter reads): `{b['name']}`, weights `{b['pretrained']}` "
             f"(sha256 {str(b.get('weights_sha256') or 'not recorded')[:16]}...), feature layer `{b['feature_layer']}`.",
             "", "## How it was trained", ""]
    lines.append(f"- Command: {meta.get('command', 'not recorded')}")
    if meta.get("held_out"):
        lines.append(f"- Held out: no image of its training showed {', '.join(f'`{h}`' for h in meta['held_out'])} "
                     "(config.json's `held_out`; `jobs/quickstart.py --held-out-mode only|exclude` tests it on a world "
                     "made of them or one without them); it covers the reranker's training, not the frozen backbone's.")
    metrics = meta.get("metrics", {})
    if metrics:
        mins = metrics.get("elapsed_s")
        lines.append(f"- Last training stage: {metrics.get('step', '?')} steps"
                     + (f", {mins / 60:.1f} min of training wall time" if mins else "")
                     + (f"; last logged ITM accuracy {metrics['itm_acc']:.3f}" if "itm_acc" in metrics else ""))
    ranking = RankingConfig(**meta.get("ranking", {}))
    lines += ["", "## Ranking rule", "", f"- {ranking.describe()}",
              f"- Fusion weight chosen on: {ranking.chosen_on or 'not fitted (ITM alone)'}",
              f"- Calibration fitted on: {ranking.calibrated_on or 'not calibrated'}", ""]
    evals: List[Dict] = meta.get("evaluations", [])
    lines += ["## Figures on world seeds no run used", ""]
    if evals:
        lines += ["| evaluation | T2I R@1 first stage -> reranked | I2T R@1 | within-family T2I (first stage -> reranked) | "
                  "T2I twins: " + " / ".join(kinds_of_world) + " | relation twins, same side |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for e in evals:
            t, i = e["t2i"], e["i2t"]
            kinds = " / ".join(_fmt(t.get("by_kind", {}).get(k)) for k in kinds_of_world)
            lines.append(f"| {e['label']} | {t['first_stage_r1']} -> **{t['reranked_r1']}** | {i['first_stage_r1']} -> "
                         f"{i['reranked_r1']} | {_fmt(t.get('within_family_first_stage'))} -> "
                         f"**{_fmt(t.get('within_family'))}** | {kinds} | {_fmt(t.get('relation_same_side'))} |")
        held = [e for e in evals if e.get("held_out_templates")]
        if held:
            lines += ["", "The same evaluations' text queries written from held-out caption templates alone (wordings "
                      "no training caption shows):", "",
                      "| evaluation | queries | T2I R@1 first stage -> reranked | within-family T2I (first stage -> reranked) |",
                      "| --- | --- | --- | --- |"]
            for e in held:
                h = e["held_out_templates"]
                lines.append(f"| {e['label']} | {h['queries']} | {h['first_stage_r1']} -> **{h['reranked_r1']}** | "
                             f"{_fmt(h.get('within_family_first_stage'))} -> **{_fmt(h.get('within_family'))}** |")
        lines += [""] + [f"- {e['label']}: `{e['command']}`" for e in evals]
    else:
        lines.append("None recorded.")
    if not enc.get("route_layer"):
        limits = (NO_RELATIONS,) + limits_of(world)
    else:
        limits = (RELATION_LIMITS if enc.get("role_vocabulary") else CAPTION_RELATION_LIMITS) + limits_of(world)
    lines += ["", "## Known limits", ""] + [f"- {x}" for x in limits] + [""]
    return "\n".join(lines)


def _relations(enc: Dict) -> str:
    """The card's line on the relation parts the encoder has."""
    if not enc.get("route_layer"):
        return "- Relations: none (no role embeddings, route or grounding)."
    parse = ("a parse of spatial prepositions by the sample world's words (`role_vocabulary`)" if enc.get("role_vocabulary")
             else "a rule of English over spatial words (no word list)")
    parts = [f"role embeddings from {parse}", f"the subject-minus-object route after layer {enc['route_layer']}"]
    if enc.get("ground_layer"):
        parts.append(f"grounding trained after layer {enc['ground_layer']}")
    if enc.get("pointer"):
        parts.append("the pointer (each phrase's expected cell, from its own words, added where the route reads it)")
    return f"- Relations: {', '.join(parts)}; image positions {enc.get('image_positions', 'after_text')}."


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:g}"


def main(argv=None) -> None:
    """CLI: record evaluations (optional), then write README.md into the checkpoint folder."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--add-eval", action="append", default=[], metavar="LABEL=METRICS_JSON")
    p.add_argument("--eval-command", action="append", default=[],
                   help="the command that produced each --add-eval's metrics (same order)")
    a = p.parse_args(argv)
    if len(a.eval_command) != len(a.add_eval):
        raise SystemExit("give one --eval-command per --add-eval")
    for spec, command in zip(a.add_eval, a.eval_command):
        label, _, path = spec.partition("=")
        record_evaluation(a.checkpoint, label, path, command)
    (Path(a.checkpoint) / CARD).write_text(render(a.checkpoint))
    print(f"wrote {Path(a.checkpoint) / CARD}")


if __name__ == "__main__":
    main()
