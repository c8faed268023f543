"""Evaluate retrieval on a Karpathy-style split: FAISS first stage, EDJE reranking of the top k.

  python jobs/evaluate.py --annotations world/flickr30k_test.json --tokens runs/test_raw.parquet \
      --checkpoint checkpoints/edje-c64-distilled --k 10 --output runs/eval
Writes metrics.json ({"t2i": {"first_stage": {...}, "reranked": {...}}, "i2t": {...}}), metrics.md,
examples.png and run.json (config, timings) to --output. With --novel-against 100 (a world seed, or a generated
world's folder) metrics.json's "novel" block counts the test images whose meaning repeats a training scene of that
world and gives every figure again over the queries whose answer is novel (evaluation/novelty.py).

  python jobs/evaluate.py --compare benchmarks/comparison_seed57.json --output runs/compare57
Reads the evaluation outputs a spec names into one table of reranker designs over the same first stage
(evaluation/compare.py; refused when their first stages differ) and writes comparison.md/json to --output.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--annotations", help="Flickr30k/COCO Karpathy JSON; image paths relative to it")
    p.add_argument("--tokens", nargs="+", help="token tables (raw or compressed): files or folders")
    p.add_argument("--checkpoint", help="EDJE checkpoint dir (not needed with --backbone-only)")
    p.add_argument("--k", type=int, default=10, help="first-stage candidates reranked per query")
    p.add_argument("--output", required=True)
    p.add_argument("--backbone-only", action="store_true", help="report the first stage alone")
    p.add_argument("--add-first-stage-similarity", type=float, default=None, metavar="WEIGHT",
                   help="rank by ITM logit + WEIGHT x first-stage cosine instead of the checkpoint's own rule "
                   "(the served ranking is the checkpoint's: see --fit-first-stage-weight)")
    p.add_argument("--fit-first-stage-weight", action="store_true",
                   help="choose the fusion weight on these annotations (use a validation split) and record it in "
                   "the checkpoint, where evaluation and serving read it (the score's calibration is refitted with it)")
    p.add_argument("--fit-calibration", action="store_true",
                   help="fit the Platt scaling of the checkpoint's ranking score on these annotations (use a validation "
                   "split) and record it: the served relevance_score = sigmoid(a x score + b)")
    p.add_argument("--quant", choices=["fp32", "fp16", "int8", "int4"],
                   help="raw tables: round-trip the adapter output through this token codec")
    p.add_argument("--group-size", type=int, help="int4 scale group size")
    p.add_argument("--backbone-pretrained", help="override the backbone checkpoint path stored in the tables")
    p.add_argument("--batch-size", type=int, default=128, help="pairs per joint-encoder call")
    p.add_argument("--max-queries-per-image", type=int, help="T2I: first N captions per image only")
    p.add_argument("--examples", type=int, default=4, help="queries in examples.png")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--device", default="auto",
                   help="text tower, adapter and joint encoder: auto (cuda when visible, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--novel-against", metavar="WORLD_JSON_OR_SEED",
                   help="also report every figure over the queries whose answer image's meaning (Scene.signature) is "
                   "in no training scene of this world: a generated world's folder or world.json, or a world seed "
                   "whose scenes are sampled (nothing rendered) at --novel-against-n-train/-n-val; 100 is the shipped "
                   "checkpoints' training world. Needs the sample world's world.json beside --annotations")
    p.add_argument("--novel-against-n-train", type=int, default=12000,
                   help="train images of the --novel-against seed's world (default %(default)s: world 100's)")
    p.add_argument("--novel-against-n-val", type=int, default=500,
                   help="val images of the --novel-against seed's world (default %(default)s)")
    p.add_argument("--novel-against-held-out", nargs="+", default=[], metavar="VALUE+VALUE",
                   help="combinations the --novel-against seed's world withheld (an exclude world, e.g. red+circle "
                   "large+square for ex100)")
    p.add_argument("--compare", metavar="SPEC.json",
                   help="instead of evaluating: one table of the evaluation outputs SPEC names (evaluation/compare.py), "
                   "written as comparison.md/json to --output")
    a = p.parse_args(argv)
    if a.compare:
        from edje.evaluation.compare import compare, markdown
        print(markdown(compare(a.compare, a.output)))
        return
    if not a.annotations or not a.tokens:
        p.error("--annotations and --tokens are required (unless --compare)")
    from edje.evaluation.novelty import parse_reference
    from edje.evaluation.rerank_eval import EvalConfig, evaluate  # here: --compare needs neither torch models nor FAISS
    try:
        against = parse_reference(a.novel_against, a.novel_against_n_train, a.novel_against_n_val,
                                  a.novel_against_held_out) if a.novel_against else None
    except ValueError as e:
        p.error(str(e))
    cfg = EvalConfig(annotations=a.annotations, tokens=a.tokens, output=a.output, checkpoint=a.checkpoint, k=a.k,
                     backbone_only=a.backbone_only, first_stage_weight=a.add_first_stage_similarity,
                     fit_first_stage_weight=a.fit_first_stage_weight,
                     fit_calibration=a.fit_calibration, quant=a.quant,
                     group_size=a.group_size, backbone_pretrained=a.backbone_pretrained, batch_size=a.batch_size,
                     max_queries_per_image=a.max_queries_per_image, examples=a.examples, threads=a.threads,
                     device=a.device, novel_against=against)
    from edje.storage.hub import CheckpointNotFound

    try:
        evaluate(cfg)
    except CheckpointNotFound as e:  # the tables' backbone cannot be had: one line naming it and why
        raise SystemExit(f"[evaluate] {e}") from None
    print((Path(a.output) / "metrics.md").read_text())


if __name__ == "__main__":
    main()
