"""Train the project's small open_clip backbone contrastively on a Karpathy-style train split.

The committed checkpoint (checkpoints/edje-tiny-convvit-sw.safetensors): its exact command is in
its .json record and in BENCHMARKS.md. Load it with VisionBackbone.create(BackboneConfig("edje-tiny-convvit", pretrained=<output>)).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch

from edje.training.backbone import BackboneTrainConfig, train_backbone


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="train annotation JSON (images relative to its folder)")
    p.add_argument("--eval", default=None, help="annotation JSON to report zero-shot recall on")
    p.add_argument("--output", required=True, help="output .safetensors path (a .json record is written beside it)")
    p.add_argument("--model", default="edje-tiny-convvit", help="open_clip model name (model/configs/*.json)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--stop-after", type=int, help="train only this many epochs of the --epochs-long LR schedule")
    p.add_argument("--neighbour-fraction", type=float, default=0.0,
                   help="share of each batch made of clusters of near neighbours (ELIP hard batches)")
    p.add_argument("--cluster-size", type=int, default=8, help="images per neighbour cluster")
    p.add_argument("--neighbour-start", type=int, default=2, help="first epoch (1-based) with neighbour batches")
    p.add_argument("--mask-same-words", action="store_true",
                   help="leave captions with the same bag of words (binding twins) out of each other's softmax")
    p.add_argument("--world", help="a sample world's world.json: a family's images are not each other's negatives")
    p.add_argument("--shape-caption-rate", type=float, default=0.0,
                   help="share of captions replaced by training-only ones naming only the shapes (needs --world)")
    p.add_argument("--shape-caption-rate-end", type=float, default=None,
                   help="shape-caption rate at the last epoch (linear from --shape-caption-rate; default: constant)")
    p.add_argument("--colour-caption-rate", type=float, default=0.0,
                   help="share of captions replaced by training-only ones naming only the colours (needs --world)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are reproducible per count)")
    p.add_argument("--device", default="auto", help="auto (cuda when visible, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--storage-path", help="folder that keeps the run's checkpoint; rerunning the same command resumes "
                   "from it, with the same batches from there on as a run never stopped")
    p.add_argument("--name", help="the run's subfolder of --storage-path (default: the --output file's stem)")
    p.add_argument("--checkpoint-every", type=int, default=BackboneTrainConfig.checkpoint_every,
                   help="steps between checkpoints (with --storage-path; also one at the end)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = BackboneTrainConfig(
        train_annotations=a.train, output=a.output, eval_annotations=a.eval, model=a.model, epochs=a.epochs,
        batch_size=a.batch_size, lr=a.lr, weight_decay=a.weight_decay, warmup_steps=a.warmup_steps, seed=a.seed,
        eval_every=a.eval_every, stop_after=a.stop_after, neighbour_fraction=a.neighbour_fraction,
        cluster_size=a.cluster_size, neighbour_start=a.neighbour_start, mask_same_words=a.mask_same_words,
        world=a.world, shape_caption_rate=a.shape_caption_rate,
        shape_caption_rate_end=a.shape_caption_rate_end, colour_caption_rate=a.colour_caption_rate, device=a.device,
        storage_path=a.storage_path, name=a.name, checkpoint_every=a.checkpoint_every)
    record = train_backbone(cfg)
    print(f"wrote {a.output} ({record['bytes']} bytes) in {record['wall_s']} s; recall {record['final_recall']}")


if __name__ == "__main__":
    main()
