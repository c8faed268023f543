"""Binding ceiling: EDJE trained and evaluated on PERFECT scene tokens, through the project's own jobs.

Perfect tokens (sampleworld/scene_tokens.py) carry each object's colour, shape and size in the cells
it covers, plus the cell's position, so binding is exactly in the tokens. What the joint encoder
learns from them is the ceiling of what any backbone's tokens could give it; the first stage stays
the real backbone's embeddings. Stages are the project's commands, timed, skipped when their
output exists (rerun to resume):

  1. python -m edje.sampleworld generate            (a world: train + val; the val split selects recipes;
                                                and the curriculum's one-object world)
  2. python -m edje.evaluation.tables --scene-tokens (raw tables of perfect tokens; embeddings from the backbone)
  3. python jobs/pretrain.py                    (Ray Train: the curriculum's first phase, MLM on one-object
                                                scenes; then --init from it, the recipe on the main world)
  4. python jobs/evaluate.py                    (first stage, reranking, within-family accuracy)

  python benchmarks/binding_ceiling.py --seed 100 --workdir runs/ceiling --steps 1200
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_recall import PY, stage

# The recipe that learned binding on perfect tokens (BENCHMARKS.md, "Binding"): a small BERT from
# scratch without dropout and with word context; first MLM over whole attribute groups on one-object
# scenes (reading attributes), then ITM against near-neighbour twins + the same MLM.
MODEL = ["--word-context", "3", "--adapter", "local", "--adapter-hidden", "512",
         "--random-bert", "hidden_size=128", "num_hidden_layers=4", "num_attention_heads=4", "intermediate_size=512",
         "hidden_dropout_prob=0", "attention_probs_dropout_prob=0"]
PHASE1 = ["--objectives", "mlm", "--mlm-masking", "groups", "--loss-weight", "mlm", "1.0", "--k", "1", *MODEL]
RECIPE = ["--objectives", "itm", "mlm", "--mlm-masking", "groups", "--loss-weight", "mlm", "1.0", "--k", "3",
          "--mining", "topk", "--cluster-fraction", "0.75", "--cluster-start", "0", "--cluster-end", "0",
          "--cluster-size", "4"]


def main(argv=None) -> dict:
    """CLI entry point; returns the evaluation's metrics."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=100, help="world seed (train + val; select on val, never on a test seed)")
    p.add_argument("--n-train", type=int, default=12000)
    p.add_argument("--n-val", type=int, default=500)
    p.add_argument("--n-single", type=int, default=4000, help="images of the one-object curriculum world")
    p.add_argument("--phase1-steps", type=int, default=200, help="MLM steps on one-object scenes (0: no curriculum)")
    p.add_argument("--phase1-batch-size", type=int, default=64)
    p.add_argument("--workdir", default="runs/ceiling")
    p.add_argument("--pretrained", default="checkpoints/edje-tiny-convvit-sw.safetensors",
                   help="the backbone whose embeddings are the first stage")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--cpus", type=float, default=2.0, help="CPUs of the one training worker")
    p.add_argument("--tokens", choices=["scene", "backbone"], default="scene",
                   help="scene: perfect tokens (the ceiling); backbone: the same recipe on the backbone's own tokens")
    p.add_argument("--init-encoder-from", default=None,
                   help="start the joint encoder from this EDJE checkpoint (a fresh adapter for these tables' tokens; "
                        "no curriculum phase): how a reranker is retrained on a new backbone's tokens")
    p.add_argument("--recipe", nargs=argparse.REMAINDER, default=None,
                   help="replace the recipe's pretrain.py options (everything after this flag)")
    a = p.parse_args(argv)
    if a.init_encoder_from:
        a.phase1_steps = 0  # the encoder has been through the curriculum already
    work = Path(a.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    world, single, tables = work / "world", work / "world1", work / "tables"
    source = ["--scene-tokens", world] if a.tokens == "scene" else []
    source1 = ["--scene-tokens", single] if a.tokens == "scene" else []

    def log(msg: str) -> None:
        print(msg, flush=True)

    stage(work, "world", [PY, "-m", "sampleworld", "generate", "--seed", a.seed, "--n-train", a.n_train,
                          "--n-val", a.n_val, "--n-test", 0, "--out", world], world / "world.json", log)
    if a.phase1_steps:
        stage(work, "world1", [PY, "-m", "sampleworld", "generate", "--seed", a.seed + 1000, "--n-train", a.n_single,
                               "--n-val", 0, "--n-test", 0, "--family-size", 1, "--min-objects", 1, "--max-objects", 1,
                               "--out", single], single / "world.json", log)
        stage(work, "world1_tables", [PY, "-m", "edje.evaluation.tables", "--annotations", single / "flickr30k_train.json",
                                      "--rows", "caption", "--pretrained", a.pretrained, *source1,
                                      "--output", tables / "train1" / "train.parquet"], tables / "train1" / "train.parquet", log)
    stage(work, "train_tables", [PY, "-m", "edje.evaluation.tables", "--annotations", world / "flickr30k_train.json",
                                 "--rows", "caption", "--pretrained", a.pretrained, *source,
                                 "--output", tables / "train" / "train.parquet"], tables / "train" / "train.parquet", log)
    stage(work, "val_tables", [PY, "-m", "edje.evaluation.tables", "--annotations", world / "flickr30k_val.json",
                               "--pretrained", a.pretrained, *source, "--output", tables / "val.parquet"],
          tables / "val.parquet", log)
    common = ["--storage-path", work / "train", "--num-workers", 1, "--cpus-per-worker", a.cpus, "--epochs", 1000,
              "--lr", a.lr, "--warmup-steps", a.warmup_steps, "--log-every", 20]
    start = ["--init-encoder-from", Path(a.init_encoder_from).resolve()] if a.init_encoder_from else []
    if a.phase1_steps:
        phase1 = work / "model_phase1"
        stage(work, "pretrain_phase1", [PY, "jobs/pretrain.py", "--tables", tables / "train1", "--name", "phase1",
                                        "--batch-size", a.phase1_batch_size, "--max-steps", a.phase1_steps,
                                        "--checkpoint-every", a.phase1_steps, "--export", phase1, *common, *PHASE1],
              phase1 / "config.json", log)
        start = ["--init", phase1]
    model = work / "model"
    stage(work, "pretrain", [PY, "jobs/pretrain.py", "--tables", tables / "train", "--name", "ceiling",
                             "--batch-size", a.batch_size, "--max-steps", a.steps,
                             "--checkpoint-every", max(50, min(100, a.steps // 4)), "--export", model, *common, *start,
                             *(a.recipe if a.recipe is not None else RECIPE + ([] if a.phase1_steps else MODEL))],
          model / "config.json", log)
    out = work / "eval"
    stage(work, "evaluate", [PY, "jobs/evaluate.py", "--annotations", world / "flickr30k_val.json",
                             "--tokens", tables / "val.parquet", "--checkpoint", model, "--k", 10,
                             "--max-queries-per-image", 1, "--output", out], out / "metrics.json", log)
    metrics = json.loads((out / "metrics.json").read_text())
    times = json.loads((work / "times.json").read_text())
    for d in ("t2i", "i2t"):
        m = metrics[d]
        log(f"{d}: R@1 first stage {m['first_stage']['r1']} -> reranked {m['reranked']['r1']}; within-family "
            f"{m['within_family']['first_stage']['accuracy']} -> {m['within_family']['reranked']['accuracy']}")
    log(f"wall s: {json.dumps(times)}")
    return metrics


if __name__ == "__main__":
    main()
