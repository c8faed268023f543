"""Does a fusion weight that follows the first stage's confidence per query rank better than one global weight? A study.

The shipped rule ranks a query's top k by ITM logit + w x first-stage cosine, one w fitted on a validation split. On
wordings the backbone's text tower misreads (the open world's terse held-out templates) that term pulls the ranking
down where the ITM alone is right. This captures jobs/evaluate.py's text->image scores on a fit split and on a test
split, fits a switch per query, w(q) = w_hi where the query's first-stage confidence (the top candidate's cosine, or
its margin over the second) is at least c and w_lo below, on the fit split, and reports text->image R@1 and
within-family accuracy on the test split: every query, the training-template ones and the held-out-template ones.
`--augment-fit R` rewrites that share of the fit split's captions by EDA's random swap or deletion or AEDA's
punctuation (model/text_augment.py: generic, no word list, nothing of the held-out templates), so that the fit
meets wordings the text tower reads less well. The study behind the product's switch (model/ranking.py, fitted by
`jobs/evaluate.py --fit-confidence-switch --fit-caption-augment`, evaluation/ranking_fit.py), which keeps the one
weight above the threshold; this study also fits the weight above it and the margin feature, and with `--form` a
weight for queries whose share of English function words is below a threshold (a terse, keyword-like query).

  python -m edje.research.confidence_fusion --checkpoint CK --backbone-pretrained BB \
      --fit-annotations runs/open/w300/flickr30k_val.json --fit-tokens runs/open/q300/val.parquet \
      --annotations QS/world/flickr30k_test_first1000.json --tokens QS/compressed-int8/tables \
      --max-queries-per-image 1 --held-out-template-queries 1 --augment-fit 0.5 --output OUT
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import re
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from edje.evaluation import rerank_eval
from edje.evaluation.eval_config import EvalConfig
from edje.evaluation.ranking_fit import FUSION_WEIGHTS, THRESHOLD_QUANTILES, candidate_labels, rewrite_captions
from edje.evaluation.recall import rerank, within_group_accuracy
from edje.model.content_words import FUNCTION_WORDS
from edje.model.recall import recall, t2i_answers
from edje.model.text_augment import ALL_OPERATIONS, OPERATIONS

# The first stage's confidence (its top cosine, its margin over the second) and the reranker's side of it (ITM's top-1
# margin, its top logit, whether the two stages' top candidates agree, the cosine given up by ITM's choice), and the
# query's form: the share of its words that are English function words (a terse, keyword-like query has few).
FEATURES = ("top", "margin", "itm_margin", "itm_top", "agree", "cos_gap", "function_share")


@dataclasses.dataclass
class Capture:
    """One split's text->image first stage and ITM logits over its top k, with what the figures need."""

    sim: np.ndarray          # [Q, k] first-stage cosine, best first
    idx: np.ndarray          # [Q, k] candidate images
    itm: np.ndarray          # [Q, k] ITM logits
    answers: List[np.ndarray]
    group: Optional[np.ndarray]  # family id of each image
    held: Optional[np.ndarray]   # bool per query: written from a held-out template
    base: Optional[np.ndarray]   # the queries that are each image's first captions (None: all)
    texts: List[str] = dataclasses.field(default_factory=list)  # each query's caption as ranked
    images: Optional[np.ndarray] = None  # [I, e] the gallery's pooled embeddings, the rows `idx` points at


def cached_capture(path: Path, cfg: EvalConfig, augment: float = 0.0,
                   ops: Sequence[str] = OPERATIONS) -> Capture:
    """`capture`, kept in `path` (a pickle) so that another fit reads the scores instead of scoring again."""
    if path.exists():
        return load_capture(path)
    found = capture(cfg, augment, ops=ops)
    # Its fields, not the object: a pickle of a class defined in __main__ (this module run as a script) would load
    # nowhere else.
    path.write_bytes(pickle.dumps(dataclasses.asdict(found)))
    return found


def load_capture(path: Path) -> Capture:
    """A capture that `cached_capture` kept."""
    return Capture(**pickle.loads(Path(path).read_bytes()))


def capture(cfg: EvalConfig, augment: float = 0.0, seed: int = 0, ops: Sequence[str] = OPERATIONS) -> Capture:
    """Run jobs/evaluate.py's evaluation once, keeping its text->image scores (captions rewritten at `augment`)."""
    kept: Dict[str, np.ndarray] = {}
    first_stage, score_pairs, load = rerank_eval.first_stage, rerank_eval.score_pairs, rerank_eval.load_annotations

    def keep_first_stage(queries, items, depth):
        out = first_stage(queries, items, depth)
        kept.setdefault("sim", out[0])  # the first call ranks images for the text queries
        kept.setdefault("idx", out[1])
        kept.setdefault("images", items)
        return out

    def keep_scores(scorer, texts, image_index, images, label="pairs"):
        out = score_pairs(scorer, texts, image_index, images, label)
        if label == "text->image":
            kept["itm"] = out
        return out

    def load_rewritten(path):
        ann = load(path)
        return rewrite_captions(ann, augment, seed, ops)[0] if augment else ann

    rerank_eval.first_stage, rerank_eval.score_pairs, rerank_eval.load_annotations = (keep_first_stage, keep_scores,
                                                                                      load_rewritten)
    try:
        with tempfile.TemporaryDirectory() as out:
            rerank_eval.evaluate(dataclasses.replace(cfg, output=out, examples=0))
        ann = load_rewritten(cfg.annotations)
    finally:
        rerank_eval.first_stage, rerank_eval.score_pairs, rerank_eval.load_annotations = first_stage, score_pairs, load
    records = rerank_eval.world_records(ann)
    ann, held, added = rerank_eval.choose_queries(ann, records, cfg)
    itm = kept["itm"].reshape(len(ann.captions), -1)  # scored flat, query after query
    group = None if records is None else rerank_eval.families_and_scenes(records)[0]
    return Capture(kept["sim"][:, :itm.shape[1]], kept["idx"], itm, t2i_answers(ann.caption_image), group, held,
                   None if added is None else np.flatnonzero(~added), list(ann.captions), kept["images"])


def function_share(text: str) -> float:
    """The share of a caption's words that are English function words (0 for a caption without words)."""
    words = re.findall(r"[a-z']+", text.lower())
    return sum(w in FUNCTION_WORDS for w in words) / len(words) if words else 0.0


def confidence(c: Capture, feature: str) -> np.ndarray:
    """Per query, one of FEATURES."""
    if feature == "function_share":
        return np.array([function_share(t) for t in c.texts], np.float32)
    itm = np.sort(c.itm, axis=1)[:, ::-1]
    choice = np.argmax(c.itm, axis=1)
    return {"top": lambda: c.sim[:, 0], "margin": lambda: c.sim[:, 0] - c.sim[:, 1],
            "itm_margin": lambda: itm[:, 0] - itm[:, 1], "itm_top": lambda: itm[:, 0],
            "agree": lambda: (choice == 0).astype(np.float32),
            "cos_gap": lambda: c.sim[:, 0] - c.sim[np.arange(len(choice)), choice]}[feature]()


def figures(c: Capture, weights: np.ndarray, queries: Optional[np.ndarray] = None) -> Dict[str, Optional[float]]:
    """T2I R@1 and within-family accuracy when query q ranks by ITM + weights[q] x cosine."""
    order = rerank(c.idx, c.itm.shape[1], c.itm + weights[:, None] * c.sim)
    q = np.arange(len(c.answers)) if queries is None else queries
    answers = [c.answers[i] for i in q]
    out = {"r1": recall(order[q], answers)["r1"], "queries": int(q.size)}
    if c.group is not None:
        out["within_family"] = within_group_accuracy(order[q], answers, c.group, c.itm.shape[1])["accuracy"]
    return out


def fit_r1(c: Capture, labels: np.ndarray, weights: np.ndarray) -> float:
    """T2I R@1 over the base queries under per-query weights, from the candidates' match labels [Q, k] (vectorised:
    a fit tries some 1,500 rules)."""
    top = np.argmax(c.itm + weights[:, None] * c.sim, axis=1)
    hit = labels[np.arange(len(top)), top]
    return round(float(100.0 * np.mean(hit if c.base is None else hit[c.base])), 2)


def fit_switch(c: Capture, feature: str) -> Dict:
    """(w_lo, w_hi, threshold) with the best T2I R@1 on `c` (ties: one weight, then the smaller weights)."""
    conf = confidence(c, feature)
    labels = candidate_labels(c.idx[:, :c.itm.shape[1]], c.answers)
    best = None
    for t in np.quantile(conf, THRESHOLD_QUANTILES):
        for lo in FUSION_WEIGHTS:
            for hi in FUSION_WEIGHTS:
                r1 = fit_r1(c, labels, np.where(conf >= t, hi, lo))
                key = (r1, lo == hi, -lo - hi)
                if best is None or key > best[0]:
                    best = (key, {"feature": feature, "w_lo": lo, "w_hi": hi, "threshold": float(t), "fit_r1": r1})
    return best[1]


def fit_global(c: Capture) -> Dict:
    """The one weight with the best T2I R@1 on `c` (ties: the smaller)."""
    labels = candidate_labels(c.idx[:, :c.itm.shape[1]], c.answers)
    r1 = {w: fit_r1(c, labels, np.full(len(c.answers), w)) for w in FUSION_WEIGHTS}
    w = max(FUSION_WEIGHTS, key=lambda v: (r1[v], -v))
    return {"feature": None, "w_lo": w, "w_hi": w, "threshold": 0.0, "fit_r1": r1[w]}


def rule_weights(c: Capture, rule: Dict) -> np.ndarray:
    """Each query's fusion weight under a fitted rule: the switch on its feature, then, where the rule has one, the
    form weight for a query whose function-word share is below the form threshold."""
    conf = confidence(c, rule["feature"] or "top")
    weights = np.where(conf >= rule["threshold"], rule["w_hi"], rule["w_lo"]).astype(np.float32)
    if rule.get("form_threshold") is not None:
        weights = np.where(confidence(c, "function_share") < rule["form_threshold"], rule["w_form"], weights)
    return weights.astype(np.float32)


def fit_form(c: Capture, rule: Dict) -> Dict:
    """`rule` with a form switch on top (w_form for a query whose function-word share is below a threshold), the
    one with the best T2I R@1 on `c`; `rule` unchanged when none raises it."""
    share = confidence(c, "function_share")
    labels = candidate_labels(c.idx[:, :c.itm.shape[1]], c.answers)
    base = rule_weights(c, rule)
    best = (fit_r1(c, labels, base), {**rule, "form_threshold": None, "w_form": None})
    for t in np.unique(np.round(np.quantile(share, THRESHOLD_QUANTILES), 4)):
        for w in FUSION_WEIGHTS:
            r1 = fit_r1(c, labels, np.where(share < t, w, base).astype(np.float32))
            if r1 > best[0]:
                best = (r1, {**rule, "form_threshold": float(t), "w_form": w, "fit_r1": r1})
    return best[1]


def report(test: Capture, rule: Dict) -> Dict:
    """A fitted rule's figures on the test split: every base query, the training-template and held-out ones."""
    conf = confidence(test, rule["feature"] or "top")
    weights = rule_weights(test, rule)
    base = np.arange(len(test.answers)) if test.base is None else test.base
    out = {"rule": rule, "all": figures(test, weights, base)}
    if test.held is not None:
        out["training_templates"] = figures(test, weights, np.intersect1d(base, np.flatnonzero(~test.held)))
        out["held_out_templates"] = figures(test, weights, np.flatnonzero(test.held))
        out["held_out_below_threshold"] = round(float(np.mean(conf[test.held] < rule["threshold"])), 3)
        out["training_below_threshold"] = round(float(np.mean(conf[~test.held] < rule["threshold"])), 3)
    return out


def oracle_report(test: Capture, weight: float) -> Dict:
    """Diagnostic upper bound, chosen on the test split itself: each query ranks by `weight`, or where that misses,
    by the grid's first weight that puts an answer first (what a perfect per-query router could reach)."""
    labels = candidate_labels(test.idx[:, :test.itm.shape[1]], test.answers)
    weights = np.full(len(test.answers), weight, np.float32)
    for q in range(len(weights)):
        if not labels[q, np.argmax(test.itm[q] + weight * test.sim[q])]:
            hits = [w for w in FUSION_WEIGHTS if labels[q, np.argmax(test.itm[q] + w * test.sim[q])]]
            weights[q] = hits[0] if hits else weight
    base = np.arange(len(test.answers)) if test.base is None else test.base
    out = {"rule": {"oracle_around": weight}, "all": figures(test, weights, base)}
    if test.held is not None:
        out["held_out_templates"] = figures(test, weights, np.flatnonzero(test.held))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--backbone-pretrained", default=None)
    p.add_argument("--fit-annotations", required=True)
    p.add_argument("--fit-tokens", nargs="+", required=True)
    p.add_argument("--annotations", required=True)
    p.add_argument("--tokens", nargs="+", required=True)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-queries-per-image", type=int, default=1)
    p.add_argument("--held-out-template-queries", type=int, default=1)
    p.add_argument("--augment-fit", type=float, nargs="+", default=[0.0],
                   help="shares of the fit split's captions rewritten (one fit per share)")
    p.add_argument("--augment-ops", nargs="+", default=list(OPERATIONS), choices=ALL_OPERATIONS,
                   help="the rewrites the fit split's captions get (model/text_augment.py)")
    p.add_argument("--form", action="store_true",
                   help="also fit a form switch (the query's function-word share) over the one weight and over the "
                   "top-cosine switch")
    p.add_argument("--diagnose", action="store_true",
                   help="also read on the test split every low weight at the fitted threshold, and a perfect "
                   "per-query weight (upper bounds, chosen on the test split: for a validation split only)")
    p.add_argument("--output", required=True)
    a = p.parse_args(argv)
    common = dict(checkpoint=a.checkpoint, backbone_pretrained=a.backbone_pretrained, k=a.k, output="")
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    test = cached_capture(out / "test.pkl", EvalConfig(
        annotations=a.annotations, tokens=a.tokens, max_queries_per_image=a.max_queries_per_image,
        held_out_template_queries=a.held_out_template_queries, **common))
    rows = {"itm_alone": report(test, {"feature": None, "w_lo": 0.0, "w_hi": 0.0, "threshold": 0.0, "fit_r1": None})}
    for share in a.augment_fit:
        fit = cached_capture(out / f"fit_{share:g}_{'_'.join(a.augment_ops)}.pkl",
                             EvalConfig(annotations=a.fit_annotations, tokens=a.fit_tokens, **common), share,
                             a.augment_ops)
        rows[f"global, fit augment {share:g}"] = report(test, fit_global(fit))
        for feature in FEATURES:
            rows[f"switch on {feature}, fit augment {share:g}"] = report(test, fit_switch(fit, feature))
        if a.form:
            for start in ("global", "switch on top"):
                rule = rows[f"{start}, fit augment {share:g}"]["rule"]
                rows[f"{start} + form, fit augment {share:g}"] = report(test, fit_form(fit, rule))
        if a.diagnose:
            rule = rows[f"switch on top, fit augment {share:g}"]["rule"]
            for lo in FUSION_WEIGHTS:  # every low weight at the fitted threshold, read on the test split
                rows[f"diagnostic: w_lo {lo:g} at the fitted top-cosine threshold, fit augment {share:g}"] = report(
                    test, {**rule, "w_lo": lo, "fit_r1": None})
    if a.diagnose:
        w = rows[f"global, fit augment {a.augment_fit[0]:g}"]["rule"]["w_hi"]
        rows["diagnostic: a perfect per-query weight"] = oracle_report(test, w)
    (out / "confidence_fusion.json").write_text(json.dumps(rows, indent=2) + "\n")
    for name, r in rows.items():
        cells = [f"{part} R@1 {r[part]['r1']:.1f} wf {r[part].get('within_family')}"
                 for part in ("all", "training_templates", "held_out_templates") if part in r]
        print(f"{name}: {r['rule']} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
