"""Retrieval evaluation: FAISS first stage over the backbone's embeddings, EDJE reranking of the top k.

Text-to-image: queries are the backbone's text embeddings of every caption, the index holds the
tables' pooled image embeddings. Image-to-text: the other way round. The top k of each query are
rescored by JointEncoder.score (the one scoring path), optionally plus w x first-stage similarity.
Raw tables go through the checkpoint's adapter here (optionally round-tripped through a token
codec, to measure int8/int4 storage); compressed tables' tokens go straight to the encoder.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from edje.evaluation import held_out_templates, novelty
from edje.evaluation.calibration import calibration_report, fit_platt
from edje.evaluation.eval_config import EvalConfig
from edje.evaluation.ranking_fit import FusionSplit, candidate_labels, fit_first_stage_weight, rewrite_captions
from edje.evaluation.recall import rerank, within_group_accuracy
from edje.evaluation.scene_pairs import KINDS as TWIN_KINDS
from edje.evaluation.scene_pairs import pairs_by_scene
from edje.model.backbone import VisionBackbone
from edje.model.device import pick_device
from edje.model.edje import load_checkpoint
from edje.model.ranking import QueryTower, RankingConfig, read_ranking, write_ranking
from edje.model.recall import KS, i2t_answers, recall, t2i_answers
from edje.model.scoring import PairScorer
from edje.sampleworld.registry import scene_from_json
from edje.sampleworld.scene import Scene
from edje.schemas.annotations import Annotations, load_annotations
from edje.schemas.codecs import TokenCodec
from edje.schemas.config import CodecConfig
from edje.schemas.token_table import TableMetadata, TableMismatchError, decode_tokens, expand_paths, read_token_tables, vector_matrix
from edje.schemas.weights import weights_sha256
from edje.storage.embedding_index import EmbeddingIndex


@dataclass
class Stage:
    """Rankings of one direction before and after reranking, with the answer sets."""

    first: np.ndarray
    reranked: np.ndarray
    answers: List[np.ndarray]
    timings: Dict[str, float] = field(default_factory=dict)


def select_rows(ann: Annotations, table_ids: Sequence[str]) -> np.ndarray:
    """Row of the token table for each annotation image; ValueError naming missing ids."""
    first: Dict[str, int] = {}
    for i, x in enumerate(table_ids):
        first.setdefault(x, i)
    missing = [x for x in ann.image_ids if x not in first]
    if missing:
        raise ValueError(f"{len(missing)} of {ann.num_images} annotation images are not in the token tables "
                         f"(e.g. {missing[:3]}); encode them first")
    return np.array([first[x] for x in ann.image_ids])


def first_stage(queries: np.ndarray, items: np.ndarray, depth: int):
    """FAISS exact inner product: (scores [Q, depth], indices [Q, depth])."""
    return EmbeddingIndex.exact(items).search(queries, depth)


def image_tokens_for_encoder(scorer: PairScorer, meta: TableMetadata, tokens: np.ndarray, cfg: EvalConfig) -> torch.Tensor:
    """Encoder-ready image tokens [N, m, h] on the scorer's device: the adapter over raw tokens (+ codec
    round trip), or stored tokens."""
    if meta.kind == "compressed" and cfg.quant:
        raise ValueError("--quant applies to raw tables; compressed tables are already stored quantized")
    out = scorer.encoder_tokens(meta, torch.from_numpy(tokens))
    if cfg.quant:
        codec = TokenCodec(CodecConfig(cfg.quant, cfg.group_size), out.shape[1], out.shape[2])
        out = codec.decode_torch(*codec.encode_torch(out.float())).to(out.dtype)
    return out


def score_pairs(scorer: PairScorer, texts: Sequence[str], image_index: np.ndarray, images: torch.Tensor,
                label: str = "pairs") -> np.ndarray:
    """ITM logits for (texts[i], images[image_index[i]]) through the reranking core, as float32 numpy."""
    return scorer.itm_logits(texts, images, image_index, progress=progress_printer(label, len(texts)))


def progress_printer(label: str, total: int, every_s: float = 10.0):
    """A callback that prints `label: done/total pairs, pairs/s, eta` at most every `every_s` seconds and at the end."""
    start = last = time.time()

    def report(done: int) -> None:
        nonlocal last
        now = time.time()
        if done < total and now - last < every_s:
            return
        last = now
        rate = done / max(now - start, 1e-9)
        print(f"[evaluate] {label}: {done}/{total} pairs ({100 * done // max(total, 1)}%), {rate:.0f} pairs/s, "
              f"eta {int((total - done) / max(rate, 1e-9))} s", flush=True)

    return report


def query_towers(cfg: EvalConfig) -> Tuple[QueryTower, ...]:
    """The text towers joining the backbone's in embedding queries: those given to fit the rule with (pinned to
    their weights' sha256), else the checkpoint's rule's."""
    if cfg.query_towers:
        return tuple(dataclasses.replace(t, weights_sha256=weights_sha256(t.pretrained))
                     for t in (QueryTower.parse(s, cfg.query_tower_weight) for s in cfg.query_towers))
    return read_ranking(cfg.checkpoint).query_towers if cfg.checkpoint else ()


def evaluate(cfg: EvalConfig) -> Dict:
    """Run the evaluation; write metrics.json, metrics.md, run.json and (examples > 0) examples.png to cfg.output."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    t0 = time.time()
    ann = load_annotations(cfg.annotations)
    timings: Dict = {}
    if cfg.fit_caption_augment:
        ann, rewritten = rewrite_captions(ann, cfg.fit_caption_augment)
        timings["captions_rewritten_for_the_fit"] = len(rewritten)
    records = world_records(ann)
    ann, held_flags, added = choose_queries(ann, records, cfg)
    # Text->image figures are over each image's first captions, as without the split; the added held-out-template
    # queries are reported apart, so a world with templates reads like one without.
    base = None if added is None else np.flatnonzero(~added)
    world = None if records is None else families_and_scenes(records)
    novel = novel_mask(ann, world, cfg.novel_against)  # before any model runs: a missing world.json fails at once
    table, meta = read_token_tables(expand_paths(cfg.tokens))
    rows = select_rows(ann, table.column("image_id").to_pylist())
    table = table.take(rows)
    image_emb = vector_matrix(table.column("image_embedding"))
    towers = query_towers(cfg)
    backbone = VisionBackbone.create(meta.first_stage_backbone(cfg.backbone_pretrained), device=device)
    backbone.join_query_towers(towers, cfg.checkpoint)
    text_emb = np.concatenate([backbone.encode_text(ann.captions[i:i + 512]).cpu().numpy()
                               for i in range(0, len(ann.captions), 512)])
    if text_emb.shape[1] != image_emb.shape[1]:
        raise TableMismatchError("embed_dim", image_emb.shape[1], text_emb.shape[1])
    depth = max(cfg.k, max(KS))
    t2i_sim, t2i_idx = first_stage(text_emb, image_emb, depth)
    i2t_sim, i2t_idx = first_stage(image_emb, text_emb, depth)
    t_first = time.time() - t0
    t2i = Stage(t2i_idx, t2i_idx, t2i_answers(ann.caption_image))
    i2t = Stage(i2t_idx, i2t_idx, i2t_answers(ann.caption_image, ann.num_images))
    timings["load_and_first_stage_s"] = round(t_first, 2)
    model = None
    if not cfg.backbone_only:
        model = load_checkpoint(cfg.checkpoint)
        scorer = PairScorer(model, read_ranking(cfg.checkpoint), device, "fp32", cfg.batch_size)
        t = time.time()
        images = image_tokens_for_encoder(scorer, meta, decode_tokens(table, meta), cfg)
        timings["image_tokens_s"] = round(time.time() - t, 2)
        k = min(cfg.k, ann.num_images)
        t = time.time()
        q = np.repeat(np.arange(len(ann.captions)), k)
        s_t2i = score_pairs(scorer, [ann.captions[j] for j in q], t2i_idx[:, :k].reshape(-1), images,
                            "text->image").reshape(-1, k)
        timings["rerank_t2i_s"] = round(time.time() - t, 2)
        t = time.time()
        kc = min(cfg.k, len(ann.captions))
        caps = i2t_idx[:, :kc].reshape(-1)
        s_i2t = score_pairs(scorer, [ann.captions[j] for j in caps], np.repeat(np.arange(ann.num_images), kc), images,
                            "image->text").reshape(-1, kc)
        timings["rerank_i2t_s"] = round(time.time() - t, 2)
        timings["pairs_scored"] = int(len(ann.captions) * k + ann.num_images * kc)

        # Every reranked candidate of both directions: its ITM logit, first-stage cosine and whether it is a match.
        splits = (FusionSplit(s_t2i, t2i_sim[:, :k], candidate_labels(t2i_idx[:, :k], t2i.answers)),
                  FusionSplit(s_i2t, i2t_sim[:, :kc], candidate_labels(i2t_idx[:, :kc], i2t.answers), False))

        def ranked(rule: RankingConfig):
            return tuple(rerank(idx, s.itm.shape[1], s.rule(rule).fuse(s.itm, s.sim))
                         for idx, s in zip((t2i_idx, i2t_idx), splits))

        if cfg.fit_first_stage_weight:
            ranking, sweep = fit_first_stage_weight(splits, str(cfg.annotations), cfg.fit_confidence_switch)
            ranking = dataclasses.replace(ranking, query_towers=towers)
            timings["first_stage_weight_sweep"] = sweep
        elif cfg.first_stage_weight is not None:
            ranking = RankingConfig(cfg.first_stage_weight, chosen_on="given on the command line", query_towers=towers)
        else:
            ranking = read_ranking(cfg.checkpoint)
        pair_scores = np.concatenate([s.rule(ranking).fuse(s.itm, s.sim).ravel() for s in splits])
        pair_labels = np.concatenate([s.labels.ravel() for s in splits])
        if cfg.fit_first_stage_weight or cfg.fit_calibration:
            ranking = ranking.with_calibration(*fit_platt(pair_scores, pair_labels), where=str(cfg.annotations))
            write_ranking(cfg.checkpoint, ranking)
        t2i.reranked, i2t.reranked = ranked(ranking)
        itm_only = ranked(RankingConfig(0.0))
    orders = {"t2i": {"first_stage": t2i.first, "reranked": t2i.reranked},
              "i2t": {"first_stage": i2t.first, "reranked": i2t.reranked}}
    if model is not None and ranking.fuses:  # the fused rule's gain is reported beside ITM alone
        orders["t2i"]["reranked_itm_only"], orders["i2t"]["reranked_itm_only"] = itm_only
    answers = {"t2i": t2i.answers, "i2t": i2t.answers}
    metrics = {name: stage_recalls(orders[name], answers[name], base if name == "t2i" else None)
               for name in ("t2i", "i2t")}
    if model is not None:
        metrics["ranking"] = asdict(ranking)
        # What relevance_score means on this split: mean probability of true pairs vs the other candidates.
        metrics["calibration"] = {"calibrated": ranking.calibrated,
                                  **calibration_report(ranking.probability(pair_scores), pair_labels)}
    if world is not None:
        families = binding_context(ann, world)
        k = min(cfg.k, ann.num_images)
        for name in ("t2i", "i2t"):
            metrics[name]["within_family"] = family_metrics(orders[name], answers[name], *families[name], k,
                                                            base if name == "t2i" else None)
        if novel is not None:
            metrics["novel"] = novel_metrics(cfg.novel_against, novel, ann, orders, answers, families, k, base)
        if held_flags is not None:
            metrics["held_out_templates"] = held_out_metrics(held_flags, 0 if added is None else int(added.sum()),
                                                             orders["t2i"], answers["t2i"], families["t2i"], k)
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "metrics.md").write_text(markdown_table(metrics, cfg, len(ann.captions), ann.num_images))
    if cfg.examples > 0:
        from edje.evaluation.report import example_grid
        example_grid(ann, t2i, out / "examples.png", cfg.examples, reranked=not cfg.backbone_only)
    timings["total_s"] = round(time.time() - t0, 2)
    run = {"config": asdict(cfg), "table": asdict(meta), "queries": {"t2i": len(ann.captions), "i2t": ann.num_images},
           "timings": timings, "torch_threads": torch.get_num_threads(), "device": str(device),
           # what else ran on this machine while it did: the timings' context (1, 5, 15 min load averages)
           "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()]}
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    return metrics


def choose_queries(ann: Annotations, records: Optional[Sequence[dict]],
                   cfg: EvalConfig) -> Tuple[Annotations, Optional[np.ndarray], Optional[np.ndarray]]:
    """The text queries: each image's first `max_queries_per_image` captions (all: None) and, in a world that records
    caption templates, its first `held_out_template_queries` captions written from a held-out template; with whether
    each query is one (None: no templates recorded) and whether it was added for that split (None: none added)."""
    flags = held_out_templates.caption_flags(ann, records)
    if cfg.held_out_template_queries and flags is None:
        print("[evaluate] --held-out-template-queries: the world beside the annotations records no caption templates "
              "(open worlds do); no held-out-template split", flush=True)
    per_image = ann.image_to_captions()
    keep = held_out_templates.select_queries(per_image, flags, cfg.max_queries_per_image, cfg.held_out_template_queries)
    if keep is None:
        return ann, flags, None
    first = {int(j) for caps in per_image for j in caps[:cfg.max_queries_per_image]}
    added = np.array([int(j) not in first for j in keep], dtype=bool)
    ann = Annotations(ann.path, ann.image_ids, ann.image_paths, [ann.captions[j] for j in keep], ann.caption_image[keep])
    return ann, None if flags is None else flags[keep], added if added.any() else None


def novel_mask(ann: Annotations, world: Optional[Tuple[np.ndarray, List[Scene]]],
               against: Optional[novelty.ReferenceWorld]) -> Optional[np.ndarray]:
    """bool per annotation image, its meaning in no training scene of `against`; None when not asked."""
    if against is None:
        return None
    if world is None:
        raise ValueError(f"novel meanings need the sample world's world.json (holding every image) beside "
                         f"{ann.path}: only a sample world's scenes can be compared")
    return novelty.novel_images(world[1], against.signatures())


def stage_recalls(orders: Dict[str, np.ndarray], answers: Sequence[np.ndarray],
                  queries: Optional[np.ndarray] = None) -> Dict[str, Dict]:
    """R@1/5/10 of each named ranking, over every query or only those in `queries`."""
    q = np.arange(len(answers)) if queries is None else queries
    return {stage: recall(order[q], [answers[i] for i in q]) for stage, order in orders.items()}


def binding_context(ann: Annotations, world: Tuple[np.ndarray, List[Scene]]) -> Dict[str, tuple]:
    """Per direction: the ranked items' family ids, their scenes and `caption_of(query, item)`, the query's caption.
    Items ranked are images for text->image, captions (grouped by their image's family) for image->text."""
    families, scenes = world
    return {"t2i": (families, scenes, lambda q, item: ann.captions[q]),
            "i2t": (families[ann.caption_image], [scenes[i] for i in ann.caption_image],
                    lambda q, item: ann.captions[item])}


def family_metrics(orders: Dict[str, np.ndarray], answers: Sequence[np.ndarray], group: np.ndarray,
                   scenes: Sequence[Scene], caption_of, k: int, queries: Optional[np.ndarray] = None) -> Dict:
    """Within-family accuracy of the first stage and the reranking, and their answer-versus-twin pairs by what
    differs between the scenes, over every query or only those in `queries`."""
    q = np.arange(len(answers)) if queries is None else queries
    sub = [answers[i] for i in q]
    stages = {s: orders[s][q] for s in ("first_stage", "reranked")}
    out = {s: within_group_accuracy(order, sub, group, k) for s, order in stages.items()}
    # what binding each stage gets right: answer vs twin pairs, by what differs between their scenes
    pairs = {s: pairs_by_scene(order, sub, group, scenes, k, lambda j, item: caption_of(q[j], item))
             for s, order in stages.items()}
    out["by_kind"] = {s: p["by_kind"] for s, p in pairs.items()}
    out["relation_subsets"] = {s: p["relation_subsets"] for s, p in pairs.items()}
    return out


def novel_metrics(against: novelty.ReferenceWorld, novel: np.ndarray, ann: Annotations, orders: Dict, answers: Dict,
                  families: Dict, k: int, base: Optional[np.ndarray] = None) -> Dict:
    """The novel images' counts, and recall and within-family accuracy over the queries whose answer is novel (text
    queries among `base` alone, when given)."""
    out: Dict = {"against": against.describe(), **novelty.counts(novel)}
    for name in ("t2i", "i2t"):
        q = novelty.query_subset(name, novel, ann.caption_image)
        if name == "t2i" and base is not None:
            q = np.intersect1d(q, base)
        out[name] = {"queries": int(q.size)}
        if q.size:  # a world whose every meaning was seen has no novel query to score
            out[name].update(stage_recalls(orders[name], answers[name], q))
            out[name]["within_family"] = family_metrics(orders[name], answers[name], *families[name], k, q)
    return out


def held_out_metrics(flags: np.ndarray, added: int, orders: Dict[str, np.ndarray], answers: Sequence[np.ndarray],
                     families: tuple, k: int) -> Dict:
    """Text→image recall and within-family accuracy over the queries written from a held-out caption template
    (image→text ranks captions, so its answers are not split by their wording)."""
    out: Dict = held_out_templates.summary(flags, added)
    q = np.flatnonzero(flags)
    out["t2i"] = {"queries": int(q.size)}
    if q.size:
        out["t2i"].update(stage_recalls(orders, answers, q))
        out["t2i"]["within_family"] = family_metrics(orders, answers, *families, k, q)
    return out


def family_groups(ann: Annotations) -> Optional[np.ndarray]:
    """Family id of each annotation image when a sample world's world.json lies beside the annotations."""
    found = world_families(ann)
    return None if found is None else found[0]


def world_families(ann: Annotations) -> Optional[Tuple[np.ndarray, List[Scene]]]:
    """From one read of the world.json beside the annotations (when it holds every image): each image's
    family id and scene."""
    records = world_records(ann)
    return None if records is None else families_and_scenes(records)


def world_records(ann: Annotations) -> Optional[List[dict]]:
    """Each annotation image's record in the world.json beside the annotations, when there is one holding every
    image."""
    world = ann.path.parent / "world.json"
    if not world.exists():
        return None
    records = {r["image_id"]: r for r in json.loads(world.read_text())["images"]}
    if not all(i in records for i in ann.image_ids):
        return None
    return [records[i] for i in ann.image_ids]


def families_and_scenes(records: Sequence[dict]) -> Tuple[np.ndarray, List[Scene]]:
    """Each record's family id and scene."""
    return np.array([r["family_id"] for r in records]), [scene_from_json(r) for r in records]


DIRECTIONS = (("t2i", "text→image"), ("i2t", "image→text"))
STAGE_NAMES = {"first_stage": "first stage", "reranked_itm_only": "reranked, ITM alone", "reranked": "reranked"}


def markdown_table(metrics: Dict, cfg: EvalConfig, n_captions: int, n_images: int) -> str:
    """Recall before and after reranking, both directions, as a Markdown table."""
    what = "backbone only" if cfg.backbone_only else f"EDJE `{cfg.checkpoint}` reranking top {cfg.k}"
    rule = RankingConfig(**metrics["ranking"]) if "ranking" in metrics else RankingConfig()
    if rule.fuses:
        what += f" by {rule.formula()}"
    if cfg.quant:
        what += f", tokens {cfg.quant}"
    lines = [f"Retrieval on `{cfg.annotations}` ({n_images} images, {n_captions} captions); {what}.", "",
             *recall_markdown(metrics, gain=True)]
    if "calibration" in metrics:
        c = metrics["calibration"]
        lines += ["", f"relevance_score ({'calibrated' if c['calibrated'] else 'sigmoid of the score, not calibrated'}) "
                  f"over the {c['pairs']} reranked pairs: mean {c['mean_p_true']} for true pairs, {c['mean_p_other']} "
                  f"for the other candidates; ECE {c['ece']}, log loss {c['log_loss']}."]
    fam = family_blocks(metrics)
    if fam:
        lines += ["", f"Binding: within-family accuracy in the top {cfg.k} (the right image/caption ranked above "
                  "its family's twins, among queries where both are in the top k).", "",
                  "| direction | first stage | reranked | queries |", "| --- | ---: | ---: | ---: |"]
        for d, f in fam:
            pct = [f"{f[s]['accuracy']:.2f}" if f[s]["accuracy"] is not None else "–" for s in ("first_stage", "reranked")]
            lines.append(f"| {d} | {pct[0]} | {pct[1]} | "
                         f"{f['first_stage']['queries']} / {f['reranked']['queries']} |")
        lines += twin_markdown(metrics)
    if "novel" in metrics:
        lines += novel_markdown(metrics["novel"])
    if "held_out_templates" in metrics:
        lines += held_out_markdown(metrics["held_out_templates"])
    return "\n".join(lines) + "\n"


def recall_markdown(block: Dict, family: bool = False, queries: bool = False, gain: bool = False) -> List[str]:
    """Recall of each stage, both directions, of `block` (all queries or a subset) as Markdown table lines, with
    columns for within-family accuracy and the query count, and a row for the reranking's gain, as asked."""
    cols = ["R@1", "R@5", "R@10"] + ["within-family"] * family + ["queries"] * queries
    lines = ["| direction | stage | " + " | ".join(cols) + " |", "| --- | --- |" + " ---: |" * len(cols)]
    for d, label in DIRECTIONS:
        if d not in block:  # a split of one direction (held-out templates: text→image)
            continue
        for stage, name in STAGE_NAMES.items():
            if stage not in block[d]:
                continue
            cells = [f"{block[d][stage][r]:.2f}" for r in ("r1", "r5", "r10")]
            if family:
                acc = block[d].get("within_family", {}).get(stage, {}).get("accuracy")
                cells.append(f"{acc:.2f}" if acc is not None else "–")
            if queries:
                cells.append(str(block[d]["queries"]))
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
        if gain:
            cells = [f"{block[d]['reranked'][r] - block[d]['first_stage'][r]:+.2f}" for r in ("r1", "r5", "r10")]
            lines.append(f"| {label} | gain | " + " | ".join(cells + [""] * (len(cols) - 3)) + " |")
    return lines


def family_blocks(block: Dict) -> List[Tuple[str, Dict]]:
    """(direction, within-family metrics) of each direction of `block` that has them."""
    return [(d, block[d]["within_family"]) for d, _ in DIRECTIONS if "within_family" in block.get(d, {})]


def twin_markdown(block: Dict, subsets: Optional[str] = None) -> List[str]:
    """Answer-versus-twin accuracy of `block` (all queries or a subset) per twin kind, and of the relation pairs per
    subset, as Markdown lines; `subsets` (e.g. "side") keeps only the subsets of that label."""
    fam = family_blocks(block)
    # The kinds this world has (the shapes world's or the open world's), two swaps last as in KINDS.
    kinds = [k for k in TWIN_KINDS if any(k in f.get("by_kind", {}).get("reranked", {}) for _, f in fam)]
    lines: List[str] = []
    if kinds:
        lines += ["", "Per twin kind: answer ranked above a twin whose scene differs from its own in that way alone "
                  "(pairs in the top k), first stage → reranked (pairs), with the reranked figure's 95 % interval "
                  "(bootstrap over families).", "",
                  "| direction | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        for d, f in fam:
            by = f.get("by_kind", {})
            cells = []
            for kind in kinds:
                a, b = by.get("first_stage", {}).get(kind), by.get("reranked", {}).get(kind)
                cells.append(f"{a['accuracy']:.1f} → {b['accuracy']:.1f} ({b['pairs']}) [{b['ci95'][0]:.0f}, "
                             f"{b['ci95'][1]:.0f}]" if a and b else "–")
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
    split = [(d, f.get("relation_subsets", {}).get("reranked", {})) for d, f in fam]
    names = sorted({n for _, s in split for n in s if subsets is None or n.startswith(f"{subsets}: ")})
    if names:
        lines += ["", "Relation pairs by subset (reranked): accuracy [95 % interval] (pairs / families). "
                  "\"same side\": both objects on one side of the image centre, where the subject's side alone "
                  "does not decide the relation.", "", "| subset | " + " | ".join(d for d, _ in split) + " |",
                  "| --- |" + " ---: |" * len(split)]
        for name in names:
            cells = [f"{s[name]['accuracy']:.1f} [{s[name]['ci95'][0]:.0f}, {s[name]['ci95'][1]:.0f}] "
                     f"({s[name]['pairs']} / {s[name]['families']})" if name in s else "–" for _, s in split]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def novel_markdown(novel: Dict, subsets: Optional[str] = None) -> List[str]:
    """The novel-meaning counts and the figures over the queries whose answer is novel (`twin_markdown`'s with
    `subsets`), as Markdown lines."""
    counts = (f"Novel meanings: {novel['novel_images']} of {novel['images']} images have a scene whose meaning "
              f"(`Scene.signature()`) is in no training scene, {novel['repeated_images']} "
              f"({novel['repeated_pct']:.1f} %) repeat one exactly; seen = {novel['against']}.")
    if not novel["t2i"]["queries"]:
        return ["", f"{counts} No test image is novel: nothing to report over novel answers."]
    return ["", f"{counts} Over the queries whose answer is novel:", "",
            *recall_markdown(novel, family=True, queries=True), *twin_markdown(novel, subsets)]


def held_out_markdown(block: Dict, subsets: Optional[str] = None) -> List[str]:
    """The held-out-template counts and the text→image figures over those queries (`twin_markdown`'s with
    `subsets`), as Markdown lines."""
    added = (f"; {block['added_queries']} of them were added to each image's first captions for this split, and "
             "count here alone (the text→image figures above are over the first captions)" if block["added_queries"] else "")
    counts = (f"Held-out caption templates: {block['held_out_queries']} of the {block['queries']} text queries are "
              f"written from a template no training caption uses{added}.")
    if not block["t2i"]["queries"]:
        return ["", f"{counts} Nothing to report over them."]
    return ["", f"{counts} Over those queries alone:", "", *recall_markdown(block, family=True, queries=True),
            *twin_markdown(block, subsets)]
