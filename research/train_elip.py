"""Train the ELIP re-ranking baseline's mapping network (text embedding -> visual prompts) over a frozen backbone.

  python research/train_elip.py --train runs/binding_backbone/world/flickr30k_train.json \
      --val runs/binding_backbone/world/flickr30k_val.json --output runs/elip
Writes mapper.safetensors and elip.json (config, validation history, the step kept) to --output;
evaluate with `python -m edje.research.elip_eval --checkpoint <output> ...`.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from edje.research.elip_model import ELIPConfig
from edje.research.elip_training import ELIPTrainConfig, train_elip


def main(argv=None) -> None:
    """CLI entry point."""
    d = ELIPTrainConfig("", "", "")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="train annotation JSON (images relative to its folder)")
    p.add_argument("--val", required=True, help="validation annotation JSON: the step kept is chosen on it")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--backbone", default=d.elip.backbone, help="open_clip model name (a timm ViT tower)")
    p.add_argument("--pretrained", default=d.elip.pretrained, help="backbone checkpoint")
    p.add_argument("--num-prompts", type=int, default=d.elip.num_prompts)
    p.add_argument("--hidden-dim", type=int, default=d.elip.hidden_dim)
    p.add_argument("--per-candidate", action="store_true",
                   help="prompts per (query, candidate): the mapper also reads the candidate's unprompted embedding")
    p.add_argument("--train-images", type=int, default=d.train_images, help="the first N training images")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--cluster-size", type=int, default=d.cluster_size)
    p.add_argument("--neighbour-fraction", type=float, default=d.neighbour_fraction)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--logit-scale", type=float, default=None, help="InfoNCE scale (default: the backbone's)")
    p.add_argument("--learn-scale", action="store_true", help="learn the InfoNCE scale (from --logit-scale)")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--val-queries", type=int, default=d.val_queries)
    p.add_argument("--k", type=int, default=d.k)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    a = p.parse_args(argv)
    elip = ELIPConfig(backbone=a.backbone, pretrained=a.pretrained, num_prompts=a.num_prompts, hidden_dim=a.hidden_dim,
                      per_candidate=a.per_candidate)
    cfg = ELIPTrainConfig(train_annotations=a.train, val_annotations=a.val, output=a.output, elip=elip,
                          train_images=a.train_images, batch_size=a.batch_size, cluster_size=a.cluster_size,
                          neighbour_fraction=a.neighbour_fraction, steps=a.steps, lr=a.lr,
                          weight_decay=a.weight_decay, warmup_steps=a.warmup_steps, logit_scale=a.logit_scale,
                          learn_scale=a.learn_scale,
                          eval_every=a.eval_every, val_queries=a.val_queries, k=a.k, seed=a.seed, threads=a.threads)
    record = train_elip(cfg)
    print(f"kept step {record['kept_step']} ({record['kept_on']}); wall {record['wall_s']} s -> {a.output}")


if __name__ == "__main__":
    main()
