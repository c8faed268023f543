"""Encode a CC12M-style list of (url, caption) pairs, or images already held, into Parquet token tables on Ray Data.

    python jobs/encode_cc12m.py --output runs/enc                      # the embedded sample world
    python jobs/encode_cc12m.py --input urls.tsv --output s3://b/enc --adapter ckpt/ --quant int8
    python jobs/encode_cc12m.py --input s3://b/laion-wds/ --output s3://b/raw --keep-columns similarity,punsafe
    ray job submit --working-dir . -- python jobs/encode_cc12m.py --input ... --output ...

Without --adapter the tables are *raw* (backbone tokens, pooled image embedding, caption,
caption text embedding: training input); with it they are *compressed* (adapter output,
quantized: serving input). Running the same command again resumes: committed shards are
skipped, partial ones redone. `<output>/summary.json` holds the counts, failures by reason,
bytes per image, images per second and the table paths.
"""
from __future__ import annotations

import argparse
import os
import sys

# Runs as a script (python jobs/encode_cc12m.py, ray job submit): make the repo importable.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.schemas.cli_options import add_options, from_args
from edje.schemas.encode_job import EncodeJobConfig
from edje.schemas.shipped import DEFAULT_BACKBONE
from edje.schemas.weights import find_weights


class WeightsError(ValueError):
    """The backbone would run with random weights without being asked to."""


def build_parser() -> argparse.ArgumentParser:
    """The command line: EncodeJobConfig's options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, EncodeJobConfig)
    return p


def weights_from_flags(backbone: str | None, pretrained: str | None, adapter: str | None, random_weights: bool) -> str | None:
    """The flags checked against each other; where the weights are is find_weights's to say."""
    if random_weights and (pretrained or adapter):
        raise WeightsError("--random-weights contradicts --pretrained / --adapter, which name weights")
    if backbone and backbone.startswith("hf-hub:") and pretrained:
        raise WeightsError(f"{backbone} carries its own weights: drop --pretrained {pretrained}")
    if pretrained or adapter:
        return pretrained  # an adapter checkpoint records its backbone's weights (pipeline.encode.resolve_backbone)
    if random_weights:
        return None
    name = backbone or DEFAULT_BACKBONE
    if name.startswith("hf-hub:"):
        return None  # the repository's own weights
    weights = find_weights(backbone=name)
    if weights is None:
        raise WeightsError(f"backbone {name!r} has no weights: give --pretrained (an open_clip tag or a checkpoint "
                           f"path), name an open_clip hub repository (--backbone hf-hub:ORG/NAME), or "
                           f"--random-weights to encode with random initialisation on purpose")
    return weights


def config_from_args(argv=None) -> EncodeJobConfig:
    """Parse the command line into an EncodeJobConfig (backbone weights checked by weights_from_flags)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        pretrained = weights_from_flags(args.backbone, args.pretrained, args.adapter, args.random_weights)
    except WeightsError as e:
        parser.error(str(e))
    return from_args(EncodeJobConfig, args, pretrained=pretrained)


def main(argv=None) -> int:
    """Run the job; exit status 0 when every shard is committed, 1 otherwise (rerun to finish), 2 when a model
    cannot be had (one line says which and why)."""
    cfg = config_from_args(argv)
    from edje.pipeline.job import IncompleteJobError, run_encode_job
    from edje.storage.hub import CheckpointNotFound

    try:
        run_encode_job(cfg)
    except IncompleteJobError as e:
        print(f"[encode] incomplete: {e}", file=sys.stderr)
        return 1
    except CheckpointNotFound as e:  # a model that cannot be had: one line that names it and says why
        print(f"[encode] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
