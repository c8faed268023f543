"""Evaluate retrieval on a Karpathy-style split: FAISS first stage, EDJE reranking of the top k.

  python jobs/evaluate.py --annotations world/flickr30k_test.json --tokens runs/test_raw.parquet \
      --checkpoint checkpoints/edje-c64-distilled --k 10 --output runs/eval
Writes metrics.json ({"t2i": {"first_stage": {...}, "reranked": {...}}, "i2t": {...}}), metrics.md,
examples.png and run.json (config, timings) to --output. With --novel-against 100 (a world seed, or a generated
world's folder) metrics.json's "novel" block counts the test images whose meaning repeats a training scene of that
world and gives every figure again over the queries whose answer is novel (evaluation/novelty.py); a seed's world is
drawn as the kind of the world beside --annotations. On an open world, metrics.json's "held_out_templates" block gives
the text→image figures over the queries written from a held-out (test-only) caption template;
--held-out-template-queries N adds each image's first N such captions to the queries --max-queries-per-image keeps.

  python jobs/evaluate.py --compare benchmarks/comparison_seed57.json --output runs/compare57
Reads the evaluation outputs a spec names into one table of reranker designs over the same first stage
(evaluation/compare.py; refused when their first stages differ) and writes comparison.md/json to --output.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.evaluation.eval_config import EvalConfig
from edje.schemas.cli_options import add_options, from_args


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(p, EvalConfig)
    p.add_argument("--novel-against", metavar="WORLD_JSON_OR_SEED",
                   help="also report every figure over the queries whose answer image's meaning (Scene.signature) is "
                   "in no training scene of this world: a generated world's folder or world.json, or a world seed "
                   "whose scenes are sampled (nothing rendered) at --novel-against-n-train/-n-val; 100 is the shipped "
                   "checkpoints' training world; a seed's world is of the kind of the world beside --annotations. Needs "
                   "the sample world's world.json beside --annotations")
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
    from edje.evaluation.novelty import parse_reference, world_kind_beside
    from edje.evaluation.rerank_eval import evaluate  # here: --compare needs neither torch models nor FAISS
    try:
        against = parse_reference(a.novel_against, a.novel_against_n_train, a.novel_against_n_val,
                                  a.novel_against_held_out, world_kind_beside(a.annotations)) if a.novel_against else None
    except ValueError as e:
        p.error(str(e))
    cfg = from_args(EvalConfig, a, novel_against=against)
    from edje.storage.hub import CheckpointNotFound

    try:
        evaluate(cfg)
    except CheckpointNotFound as e:  # the tables' backbone cannot be had: one line naming it and why
        raise SystemExit(f"[evaluate] {e}") from None
    print((Path(a.output) / "metrics.md").read_text())


if __name__ == "__main__":
    main()
