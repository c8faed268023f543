"""Does a checkpoint's word alignment tell noun twins apart where its ITM head does not? A probe.

The `word_align` objective trains each content word's input embedding (the mean of its wordpieces) to find its best
adapter token in the caption's own image. This runs jobs/evaluate.py's whole evaluation with the ITM logit replaced by
that alignment score (the mean over the caption's content words of the best cosine over the image's tokens, divided
by the objective's temperature), so its twins and recall read beside the ITM head's. A probe of what a checkpoint's
parts know, not a ranking rule the product ships.

  python -m edje.research.word_alignment_rerank --checkpoint CK --annotations runs/open/w300/flickr30k_val.json \
      --tokens runs/open/s300/val.parquet --k 10 --max-queries-per-image 1 --add-first-stage-similarity 0 --output OUT
"""
from __future__ import annotations

import argparse
import types
from typing import Sequence

import torch

from edje.evaluation import rerank_eval
from edje.evaluation.eval_config import EvalConfig
from edje.model.edje import load_checkpoint
from edje.schemas.cli_options import add_options, from_args


def alignment_scorer(model, temperature: float):
    """`encoder.score` replaced: (texts[i], image_tokens[i]) -> mean best cosine of its content words / temperature."""
    def score(self, texts: Sequence[str], image_tokens: torch.Tensor) -> torch.Tensor:
        return self.word_alignment(texts, image_tokens) / temperature
    model.encoder.score = types.MethodType(score, model.encoder)
    return model


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_options(p, EvalConfig)
    p.add_argument("--temperature", type=float, default=0.05, help="the word_align objective's temperature")
    a = p.parse_args(argv)
    cfg = from_args(EvalConfig, a)
    rerank_eval.load_checkpoint = lambda path, **kw: alignment_scorer(load_checkpoint(path, **kw), a.temperature)
    rerank_eval.evaluate(cfg)


if __name__ == "__main__":
    main()
