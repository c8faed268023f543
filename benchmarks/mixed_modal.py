"""Mixed-modal queries on a sample world (in-process, no Ray): a twin's image + the caption that turns it into its sibling.

Each query is one family member's image q and a caption of one of its siblings t (a binding twin: the same
objects with one attribute or relation swapped); the answer is t. Every ordered (member, sibling) pair of the
split's families is a query. R@1/5/10 of:
- text only: t's caption through the first stage, reranked (`/v1/search {query}`); also with q excluded, the
  one thing a mixed query gets for free;
- image only: q's embedding, q excluded (`/v1/search {image}`); first stage only (nothing to rerank against),
  and at most 1 in (family size - 1) at R@1 by construction: q alone cannot say which sibling is meant;
- image + text: normalise(w x q + (1 - w) x caption), q excluded (`/v1/search {image, query, image_weight}`),
  first stage and reranked against the caption.
It runs the functions the Serve deployments run: serving/first_stage.py (read_image_embeddings, EmbeddingIndex
with its exclusion, load_backbone, embed_texts, image_queries) and the checkpoint's JointEncoder.score with its
ranking rule (model/ranking.py: ITM logit + w x the first-stage cosine of the query that found the candidate).

  python benchmarks/mixed_modal.py --world runs/quickstart57/world --tokens runs/quickstart57/raw/tables \\
      --checkpoint checkpoints/edje-local-bind
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from edje.evaluation.recall import rerank
from edje.evaluation.rerank_eval import EvalConfig, image_tokens_for_encoder, score_pairs, select_rows, world_families
from edje.model.ranking import RankingConfig, read_ranking
from edje.model.recall import recall
from edje.model.scoring import PairScorer
from edje.schemas.annotations import Annotations, load_annotations
from edje.schemas.api import DEFAULT_IMAGE_WEIGHT
from edje.schemas.token_table import decode_tokens, read_token_tables
from edje.serving.first_stage import EmbeddingIndex, embed_texts, image_queries, load_backbone, read_image_embeddings


@dataclass(frozen=True)
class MixedModalConfig:
    """One measurement: a world split, its token tables, a checkpoint."""

    world: str  # a sample world's folder (world.json and flickr30k_<split>.json)
    tokens: Tuple[str, ...]  # raw or compressed token tables (files or folders) holding the split's images
    checkpoint: str
    split: str = "test"
    k: int = 10  # first-stage candidates reranked (the API's top_k default)
    image_weights: Tuple[float, ...] = (DEFAULT_IMAGE_WEIGHT,)
    caption: int = 0  # which of the sibling's captions is the query text
    backbone_pretrained: Optional[str] = None  # the tables' text tower weights, when moved
    batch_size: int = 128
    threads: int = 1

    def __post_init__(self) -> None:
        if self.k < 1 or not self.image_weights or not all(0 <= w <= 1 for w in self.image_weights):
            raise ValueError("k must be >= 1 and image weights within [0, 1]")


@dataclass(frozen=True)
class TwinQuery:
    """Image `image` + text `text` (a caption of `target`, a sibling of that image) -> `target` (annotation rows)."""

    image: int
    target: int
    text: str


@dataclass
class Candidates:
    """One query kind's first-stage candidates [Q, k] (annotation rows, best first), their cosines, and whether
    the joint encoder reranks them against the query text."""

    name: str
    rows: np.ndarray
    cosines: np.ndarray
    rerank: bool
    itm: Optional[np.ndarray] = field(default=None, repr=False)


def twin_queries(ann: Annotations, families: np.ndarray, caption: int = 0) -> List[TwinQuery]:
    """Every ordered (member, sibling) pair of each family: the member's image + the sibling's caption -> the sibling."""
    captions = ann.image_to_captions()
    out = []
    for fam in np.unique(families):
        members = np.flatnonzero(families == fam)
        for q in members:
            for t in members[members != q]:
                caps = captions[t]
                out.append(TwinQuery(int(q), int(t), ann.captions[caps[caption % len(caps)]]))
    return out


def load_split(cfg: MixedModalConfig):
    """Annotations, family ids, image ids and embeddings (the first stage's reader), tokens and their metadata."""
    from edje.training.launch import expand_tables

    ann = load_annotations(Path(cfg.world) / f"flickr30k_{cfg.split}.json")
    world = world_families(ann)
    if world is None:
        raise SystemExit(f"{cfg.world}: no world.json naming every {cfg.split} image (a sample world is needed)")
    paths = expand_tables(list(cfg.tokens))
    ids, vectors, meta = read_image_embeddings(paths)
    vectors = vectors[select_rows(ann, ids)]  # the index holds the split's images, in annotation order
    table, tmeta = read_token_tables(paths)
    table = table.take(select_rows(ann, table.column("image_id").to_pylist()))
    return ann, world[0], vectors, meta, decode_tokens(table, tmeta), tmeta


def first_stages(cfg: MixedModalConfig, index: EmbeddingIndex, backbone, queries: Sequence[TwinQuery]) -> List[Candidates]:
    """The candidates of every query kind, from the first stage's own functions."""
    k, ids = cfg.k, index.ids
    image_ids = [ids[q.image] for q in queries]
    texts = [q.text for q in queries]
    unique = list(dict.fromkeys(texts))
    # Text only: what /v1/search {query} does, one search per distinct caption.
    cos, rows = index.search(embed_texts(backbone, unique), k)
    back = _positions(unique, texts)
    out = [Candidates("text only (sibling's caption)", rows[back], cos[back], True)]
    cos, rows = index.search(embed_texts(backbone, texts), k, exclude=image_ids)
    out.append(Candidates("text only, query image excluded", rows, cos, True))
    vectors, _ = image_queries(index, backbone, image_ids, None, 1.0)
    cos, rows = index.search(vectors, k, exclude=image_ids)
    out.append(Candidates("image only (query image excluded)", rows, cos, False))
    for w in cfg.image_weights:
        vectors, _ = image_queries(index, backbone, image_ids, texts, w)
        cos, rows = index.search(vectors, k, exclude=image_ids)
        out.append(Candidates(f"image + text, w = {w:g}", rows, cos, True))
    if any((c.rows < 0).any() for c in out):
        raise SystemExit(f"the split has fewer than k + 1 = {k + 1} images")
    return out


def _positions(unique: List[str], texts: Sequence[str]) -> np.ndarray:
    """Position of each text in `unique`."""
    where = {t: i for i, t in enumerate(unique)}
    return np.array([where[t] for t in texts])


@torch.no_grad()
def score_candidates(scorer: PairScorer, images: torch.Tensor, texts: Sequence[str], kinds: List[Candidates]) -> int:
    """ITM logits of each reranked kind's (query text, candidate) pairs, every distinct pair scored once; returns
    the number scored. A pair's logit does not depend on the query that found it, only the fused cosine does."""
    unique = list(dict.fromkeys(texts))
    text_id = _positions(unique, texts)
    n = images.shape[0]
    keys = [(text_id[:, None] * n + c.rows).ravel() for c in kinds if c.rerank]
    pairs, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    logits = score_pairs(scorer, [unique[p // n] for p in pairs], pairs % n, images)
    start = 0
    for c in (c for c in kinds if c.rerank):
        size = c.rows.size
        c.itm = logits[inverse[start:start + size]].reshape(c.rows.shape)
        start += size
    return len(pairs)


def recalls(kinds: List[Candidates], queries: Sequence[TwinQuery], rule: RankingConfig, k: int) -> Dict[str, Dict]:
    """R@1/5/10 of each kind, first stage and (when reranked) by the checkpoint's rule."""
    answers = [np.array([q.target]) for q in queries]
    out = {}
    for c in kinds:
        row = {"first_stage": recall(c.rows, answers)}
        if c.rerank:
            row["reranked"] = recall(rerank(c.rows, k, rule.fuse(c.itm, c.cosines)), answers)
        out[c.name] = row
    return out


def markdown(results: Dict[str, Dict], cfg: MixedModalConfig, n_queries: int, rule: RankingConfig) -> str:
    """The figures as a Markdown table."""
    lines = [f"Mixed-modal twin queries on `{cfg.world}` ({cfg.split}: {n_queries} queries, every (member, sibling) "
             f"pair of each family; text = the sibling's caption {cfg.caption}); top {cfg.k} reranked by "
             f"`{cfg.checkpoint}` ({rule.describe()}).", "",
             "| query | first stage R@1 | R@5 | R@10 | reranked R@1 | R@5 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in results.items():
        f, r = row["first_stage"], row.get("reranked")
        tail = f"{r['r1']:.2f} | {r['r5']:.2f}" if r else "– | –"
        lines.append(f"| {name} | {f['r1']:.2f} | {f['r5']:.2f} | {f['r10']:.2f} | {tail} |")
    return "\n".join(lines) + "\n"


def run(cfg: MixedModalConfig) -> Dict:
    """Build the queries, run every kind through the first stage and the reranker, return figures and timings."""
    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    ann, families, vectors, meta, tokens, tmeta = load_split(cfg)
    queries = twin_queries(ann, families, cfg.caption)
    index = EmbeddingIndex(ann.image_ids, vectors)
    backbone = load_backbone(meta, cfg.backbone_pretrained, "cpu")
    scorer = PairScorer.from_checkpoint(cfg.checkpoint, "cpu", "fp32", cfg.batch_size)
    eval_cfg = EvalConfig(annotations=str(ann.path), tokens=list(cfg.tokens), output="-", checkpoint=cfg.checkpoint,
                          batch_size=cfg.batch_size)
    images = image_tokens_for_encoder(scorer, tmeta, tokens, eval_cfg)
    timings = {"load_s": round(time.time() - t0, 1)}
    t = time.time()
    kinds = first_stages(cfg, index, backbone, queries)
    timings["first_stage_s"] = round(time.time() - t, 1)
    t = time.time()
    timings["pairs_scored"] = score_candidates(scorer, images, [q.text for q in queries], kinds)
    timings["rerank_s"] = round(time.time() - t, 1)
    rule = read_ranking(cfg.checkpoint)
    results = recalls(kinds, queries, rule, cfg.k)
    timings["total_s"] = round(time.time() - t0, 1)
    return {"config": asdict(cfg), "queries": len(queries), "ranking": asdict(rule), "recall": results,
            "timings": timings, "torch_threads": torch.get_num_threads(),
            "markdown": markdown(results, cfg, len(queries), rule)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse options, run, print the table (and write JSON with --output)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", required=True, help="sample world folder")
    p.add_argument("--tokens", nargs="+", required=True, help="token tables (files or folders) of the split's images")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--image-weights", type=float, nargs="+", default=[DEFAULT_IMAGE_WEIGHT])
    p.add_argument("--caption", type=int, default=0, help="which caption of the sibling is the query text")
    p.add_argument("--backbone-pretrained", default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None, help="write the figures and timings here as JSON")
    a = p.parse_args(argv)
    cfg = MixedModalConfig(a.world, tuple(a.tokens), a.checkpoint, a.split, a.k, tuple(a.image_weights), a.caption,
                           a.backbone_pretrained, a.batch_size, a.threads)
    out = run(cfg)
    print(out["markdown"])
    print(json.dumps(out["timings"]))
    if a.output:
        Path(a.output).parent.mkdir(parents=True, exist_ok=True)
        Path(a.output).write_text(json.dumps({k: v for k, v in out.items() if k != "markdown"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
