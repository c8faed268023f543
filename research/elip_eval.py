"""Text-to-image evaluation of the ELIP baseline (research/elip_model.py): re-encode the first stage's top k per query.

The first stage is the backbone's own: FAISS over the pooled image embeddings (the token tables'
`image_embedding`, as evaluation/rerank_eval.py reads them, or the backbone's embedding of the image
files) against the text embeddings. Each query's top k images are then re-encoded with its prompts
and re-ranked by ELIP's cosine. Besides recall and within-family accuracy the result carries the
cost: k backbone passes per query (the transformer blocks; the conv stem and patch/position embedding
do not depend on the query and run once per image), and pairs/s on this machine.

  python -m edje.research.elip_eval --checkpoint runs/elip --annotations runs/quickstart57/world/flickr30k_test.json \
      --tokens runs/quickstart57/compressed-int8/tables --max-queries-per-image 1 --output runs/elip/eval57
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from edje.evaluation.recall import rerank, within_group_accuracy
from edje.evaluation.rerank_eval import first_stage, select_rows, world_families
from edje.evaluation.scene_pairs import pairs_by_scene
from edje.model.image_decode import load_image_files
from edje.model.recall import KS, recall, t2i_answers
from edje.research.elip_model import ELIPReranker, encode_prompted, load_elip
from edje.schemas.annotations import Annotations, load_annotations


@dataclass(frozen=True)
class ELIPEvalConfig:
    """One T2I evaluation of an ELIP checkpoint."""

    checkpoint: str
    annotations: str
    output: Optional[str] = None
    # Token tables whose `image_embedding` is the first stage (as for EDJE); None: embed the image files.
    tokens: Optional[List[str]] = None
    k: int = 10
    max_queries_per_image: Optional[int] = 1  # the first N captions of each image (None: all)
    queries_per_call: int = 16  # queries re-encoded together: k x this pairs per backbone call
    image_batch: int = 128
    threads: Optional[int] = 1
    backbone_pretrained: Optional[str] = None  # override the checkpoint's backbone weights path (e.g. a frozen copy)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


def first_captions(ann: Annotations, n: Optional[int]) -> Annotations:
    """The annotations with only the first n captions of each image (all when n is None)."""
    if not n:
        return ann
    keep = np.sort(np.concatenate([c[:n] for c in ann.image_to_captions()]))
    return Annotations(ann.path, ann.image_ids, ann.image_paths, [ann.captions[j] for j in keep], ann.caption_image[keep])


@torch.no_grad()
def image_inputs(model: ELIPReranker, paths: Sequence[Path], batch: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """(query-independent input tokens [N, n, d], the backbone's pooled embedding [N, e]) of image files.

    Images are resized with PIL bicubic, as the backbone was trained (training/backbone.py)."""
    size = model.backbone.preprocess.size
    tokens, embs = [], []
    for i in range(0, len(paths), batch):
        t = model.patch_tokens(torch.from_numpy(load_image_files(paths[i:i + batch], size)))
        tokens.append(t)
        embs.append(encode_prompted(model.backbone, t, None))
    return torch.cat(tokens), torch.cat(embs)


@torch.no_grad()
def caption_embeddings(model: ELIPReranker, captions: Sequence[str], batch: int = 512) -> torch.Tensor:
    """The backbone's normalised text embeddings [Q, e] (the first-stage query and ELIP's mapper input)."""
    return torch.cat([model.backbone.encode_text(list(captions[i:i + batch])) for i in range(0, len(captions), batch)])


@torch.no_grad()
def rerank_scores(model: ELIPReranker, text_emb: torch.Tensor, candidates: np.ndarray, tokens: torch.Tensor,
                  queries_per_call: int = 16, image_emb: Optional[torch.Tensor] = None) -> Tuple[np.ndarray, float]:
    """ELIP scores [Q, k] of each query's candidates (indices into `tokens` and `image_emb`, the images' unprompted
    embeddings that a per-candidate mapper reads), and the seconds they took."""
    model.eval()
    out, start = [], time.perf_counter()
    for i in range(0, len(candidates), queries_per_call):
        cand = torch.from_numpy(candidates[i:i + queries_per_call]).to(tokens.device)
        emb = image_emb[cand] if image_emb is not None and model.config.per_candidate else None
        out.append(model.score(text_emb[i:i + queries_per_call], tokens[cand], emb).cpu().numpy())
    return np.concatenate(out), time.perf_counter() - start


def rerank_metrics(ann: Annotations, first: np.ndarray, scores: np.ndarray, k: int) -> Dict:
    """T2I recall of the first stage and the ELIP re-ranking, and within-family accuracy when a world lies beside `ann`."""
    answers = t2i_answers(ann.caption_image)
    reranked = rerank(first, k, scores)
    metrics: Dict = {"first_stage": recall(first, answers), "reranked": recall(reranked, answers)}
    world = world_families(ann)
    if world is not None:
        families, scenes = world
        metrics["within_family"] = {
            "first_stage": within_group_accuracy(first, answers, families, k),
            "reranked": within_group_accuracy(reranked, answers, families, k),
            "by_kind": {"first_stage": pairs_by_scene(first, answers, families, scenes, k)["by_kind"],
                        "reranked": pairs_by_scene(reranked, answers, families, scenes, k)["by_kind"]}}
    return metrics


def evaluate_reranking(model: ELIPReranker, ann: Annotations, image_emb: np.ndarray, tokens: torch.Tensor,
                       text_emb: torch.Tensor, k: int = 10, queries_per_call: int = 16) -> Dict:
    """First stage (FAISS: text vs `image_emb`), ELIP re-ranking of its top k: recall, within-family, cost."""
    first_scores, first = first_stage(text_emb.cpu().numpy(), image_emb, max(k, max(KS)))
    del first_scores  # ELIP ranks by its own cosine alone (ELIP-C); no fusion with the first stage
    k = min(k, ann.num_images)
    scores, seconds = rerank_scores(model, text_emb, first[:, :k], tokens, queries_per_call,
                                    torch.from_numpy(np.asarray(image_emb, dtype=np.float32)))
    metrics = {"t2i": rerank_metrics(ann, first, scores, k), "queries": len(ann.captions), "images": ann.num_images,
               "k": k}
    pairs = len(ann.captions) * k
    metrics["cost"] = {"backbone_passes_per_query": k, "pairs": pairs, "rerank_s": round(seconds, 2),
                       "pairs_per_s": round(pairs / seconds, 1), "torch_threads": torch.get_num_threads(),
                       "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()], "device": str(tokens.device)}
    return metrics


def table_embeddings(ann: Annotations, paths: Sequence[str], model: ELIPReranker) -> np.ndarray:
    """The tables' pooled image embedding of each annotation image (the first stage EDJE's evaluation uses);
    ValueError when the tables were embedded by another backbone than the ELIP model's."""
    from edje.schemas.token_table import expand_paths, read_token_tables, vector_matrix
    from edje.schemas.weights import check_weights

    table, meta = read_token_tables(expand_paths(paths), columns=["image_id", "image_embedding"])
    theirs, ours = meta.first_stage_backbone(), model.config
    # Checkpoint paths are recorded as given (absolute or relative): the file name is what identifies one.
    if theirs.name != ours.backbone or Path(theirs.pretrained or "").name != Path(ours.pretrained or "").name:
        raise ValueError(f"tables embedded by {theirs.name} ({theirs.pretrained}), the ELIP model prompts "
                         f"{ours.backbone} ({ours.pretrained})")
    check_weights(ours.pretrained, meta.pretrained_sha256, "ELIP model against the tables' first stage")
    rows = select_rows(ann, table.column("image_id").to_pylist())
    return vector_matrix(table.take(rows).column("image_embedding"))


def evaluate_elip(cfg: ELIPEvalConfig) -> Dict:
    """Load the checkpoint and the split, evaluate, and write metrics.json to cfg.output when given."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.time()
    model = load_elip(cfg.checkpoint, pretrained=cfg.backbone_pretrained)
    ann = first_captions(load_annotations(cfg.annotations), cfg.max_queries_per_image)
    t = time.perf_counter()
    tokens, own_emb = image_inputs(model, ann.image_paths, cfg.image_batch)
    stem_s = time.perf_counter() - t
    image_emb = table_embeddings(ann, cfg.tokens, model) if cfg.tokens else own_emb.numpy()
    metrics = evaluate_reranking(model, ann, image_emb, tokens, caption_embeddings(model, ann.captions), cfg.k,
                                 cfg.queries_per_call)
    # Once per image, not per query: the stem + patch/position embedding (and the unprompted embedding here).
    metrics["cost"]["per_image_precompute_ms"] = round(1e3 * stem_s / ann.num_images, 2)
    metrics["first_stage_embeddings"] = "token tables" if cfg.tokens else "backbone on the image files"
    metrics["config"] = asdict(cfg)
    metrics["total_s"] = round(time.time() - t0, 1)
    if cfg.output:
        out = Path(cfg.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="folder written by research/train_elip.py")
    p.add_argument("--annotations", required=True, help="Karpathy JSON (a sample world's: within-family is reported)")
    p.add_argument("--tokens", nargs="+", help="token tables for the first stage (default: embed the image files)")
    p.add_argument("--output", help="folder for metrics.json")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-queries-per-image", type=int, default=1, help="0: every caption")
    p.add_argument("--queries-per-call", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backbone-pretrained", help="override the backbone checkpoint path recorded with the mapper")
    a = p.parse_args(argv)
    m = evaluate_elip(ELIPEvalConfig(checkpoint=a.checkpoint, annotations=a.annotations, output=a.output,
                                     tokens=a.tokens, k=a.k, max_queries_per_image=a.max_queries_per_image or None,
                                     queries_per_call=a.queries_per_call, threads=a.threads,
                                     backbone_pretrained=a.backbone_pretrained))
    print(json.dumps({k: m[k] for k in ("t2i", "cost")}, indent=2))


if __name__ == "__main__":
    main()
