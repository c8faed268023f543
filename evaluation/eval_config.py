"""`EvalConfig`, one evaluation run's options, apart from the evaluation itself so that the job's command line
(jobs/evaluate.py, its --help and --compare) is built without torch or FAISS."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from edje.evaluation import novelty
from edje.schemas.cli_options import option


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run; each field's command-line option (jobs/evaluate.py) is written on it."""

    # The command line may leave these out (with --compare); the job then asks for them.
    annotations: str = option(help="Flickr30k/COCO Karpathy JSON; image paths relative to it")
    tokens: List[str] = option(nargs="+", help="token tables (raw or compressed): files or folders")
    output: str = option(required=True)
    checkpoint: Optional[str] = option(None, help="EDJE checkpoint dir (not needed with --backbone-only)")
    k: int = option(10, help="first-stage candidates reranked per query")
    backbone_only: bool = option(False, help="report the first stage alone")
    # None: the checkpoint's ranking rule (model/ranking.py); a number overrides it for this run.
    first_stage_weight: Optional[float] = option(
        None, flag="--add-first-stage-similarity", metavar="WEIGHT", help="rank by ITM logit + WEIGHT x first-stage "
        "cosine instead of the checkpoint's own rule (the served ranking is the checkpoint's: see "
        "--fit-first-stage-weight)")
    fit_first_stage_weight: bool = option(
        False, help="choose the fusion weight on these annotations (use a validation split) and record it in the "
        "checkpoint, where evaluation and serving read it (the score's calibration is refitted with it)")
    fit_confidence_switch: bool = option(
        False, help="with --fit-first-stage-weight: also fit a lower weight for the queries whose best candidate's "
        "first-stage cosine is below a fitted threshold (where the first stage is unsure of a query)")
    fit_caption_augment: float = option(
        0.0, metavar="SHARE", help="with --fit-first-stage-weight: rewrite this share of the captions by a random "
        "word swap, deletion or punctuation (EDA/AEDA) before fitting, so the fit meets wordings the first stage "
        "reads less well (the calibration fitted with it is then over those captions: refit it with "
        "--fit-calibration on the captions as written)")
    query_towers: List[str] = option(
        default_factory=list, flag="--query-tower", nargs="+", metavar="NAME[=WEIGHTS]",
        help="with --fit-first-stage-weight: text towers over the tables' image space (a student of `edje "
        "distill-text-tower`) whose query embeddings, each times --query-tower-weight, join the backbone's; "
        "recorded in the checkpoint's rule, where evaluation and serving read them")
    query_tower_weight: float = option(1.0, help="each --query-tower's weight beside the backbone's own text tower")
    # Fitting the weight always refits it: a calibration belongs to one weight.
    fit_calibration: bool = option(
        False, help="fit the Platt scaling of the checkpoint's ranking score on these annotations (use a validation "
        "split) and record it: the served relevance_score = sigmoid(a x score + b)")
    quant: Optional[str] = option(None, choices=["fp32", "fp16", "int8", "int4"],
                                  help="raw tables: round-trip the adapter output through this token codec")
    group_size: Optional[int] = option(None, help="int4 scale group size")
    backbone_pretrained: Optional[str] = option(None, help="override the backbone checkpoint path stored in the tables")
    batch_size: int = option(128, help="pairs per joint-encoder call")
    max_queries_per_image: Optional[int] = option(None, help="T2I: first N captions per image only")
    # Open worlds write test captions partly from held-out (test-only) templates; with one query an image, the first
    # caption is one for about a third of the images, too few for a split of their own, so these are added to it.
    held_out_template_queries: int = option(
        0, help="open worlds, with --max-queries-per-image: also query each image's first N captions written from a "
        "held-out (test-only) caption template where those are not among its first captions (default %(default)s); "
        "text→image figures over the held-out-template queries are reported apart whenever the world records "
        "caption templates")
    examples: int = option(4, help="queries in examples.png (0: no examples.png)")
    threads: Optional[int] = option(None, help="torch CPU threads")
    # backbone text tower, adapter and joint encoder; None/"auto": cuda if visible, else cpu
    device: Optional[str] = option(None, cli_default="auto", help="text tower, adapter and joint encoder: auto (cuda "
                                   "when visible, else cpu), cpu, cuda, cuda:N")
    # Also report every figure over the queries whose answer image's meaning is in no training scene of this world
    # (evaluation/novelty.py); needs the sample world's world.json beside the annotations.
    novel_against: Optional[novelty.ReferenceWorld] = None

    def __post_init__(self) -> None:
        if not self.backbone_only and not self.checkpoint:
            raise ValueError("evaluation needs --checkpoint unless --backbone-only")
        if self.held_out_template_queries < 0:
            raise ValueError(f"held_out_template_queries must be >= 0, got {self.held_out_template_queries}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.fit_first_stage_weight and self.first_stage_weight is not None:
            raise ValueError("give a first-stage weight or fit one, not both")
        if (self.fit_confidence_switch or self.fit_caption_augment) and not self.fit_first_stage_weight:
            raise ValueError("--fit-confidence-switch and --fit-caption-augment apply to --fit-first-stage-weight")
        if not 0.0 <= self.fit_caption_augment <= 1.0:
            raise ValueError(f"fit_caption_augment must be in [0, 1], got {self.fit_caption_augment}")
        if self.query_towers and not self.fit_first_stage_weight:
            raise ValueError("--query-tower applies to --fit-first-stage-weight (the rule is fitted with the towers)")
        if self.fit_calibration and self.first_stage_weight is not None:
            raise ValueError("calibration is fitted for the recorded (or fitted) weight, not a command-line override")
