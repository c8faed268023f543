"""Typed configuration of a Ray Train EDJE job (pretraining, fine-tuning, distillation)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional, Tuple

from edje.training.sampler import CurriculumConfig

Objective = Literal["itm", "mlm", "recovery", "distill", "ground", "flip", "pointer"]
OBJECTIVES: Tuple[str, ...] = ("itm", "mlm", "recovery", "distill", "ground", "flip", "pointer")
NegativeSource = Literal["in-batch", "miner"]

PRETRAIN_OBJECTIVES: Tuple[str, ...] = ("itm", "mlm", "recovery")


@dataclass(frozen=True)
class ModelSpec:
    """How to build the EDJE model when no checkpoint is given to start from."""

    adapter: Literal["local", "compressed"] = "compressed"
    num_queries: int = 64
    adapter_hidden: int = 8192
    adapter_heads: int = 8
    adapter_position: Literal["none", "2d"] = "none"  # AdapterConfig.position
    adapter_position_gain: float = 1.0  # AdapterConfig.position_gain: the 2-D table's initial gain
    language_model: Optional[str] = None  # BERT dir (weights + tokenizer); None = the packaged all-MiniLM-L6-v2
    encoder_layers: Optional[int] = None  # keep only the first N layers of the language model (CPU budgets)
    # Random-init BERT of this shape (BertConfig fields) with the language model's tokenizer, instead
    # of its weights: for CPU-only budgets where even a 384-wide encoder is too slow.
    bert_config: Optional[Tuple[Tuple[str, int], ...]] = None
    max_text_tokens: int = 64
    word_context: int = 0  # JointEncoderConfig.word_context: neighbouring caption words folded into each word's input
    itm_input: Literal["tokens", "global"] = "tokens"  # JointEncoderConfig.itm_input: "global" = one pooled image vector
    # Relations (JointEncoderConfig's fields of the same names). Unlike the fields above they also apply
    # to a run that starts from a checkpoint: its weights are kept and the new parts start at 0.
    image_positions: Literal["after_text", "fixed"] = "after_text"
    relation_roles: bool = False
    # Where the roles come from: "vocabulary", a parse by the sample world's words (a diagnostic; recorded in the
    # checkpoint as role_vocabulary); "english", the rule of English (model/relation_spans.py), no word list. None:
    # "vocabulary" for a new model, and a checkpoint's own roles for --init.
    role_parse: Optional[Literal["vocabulary", "english"]] = None
    route_layer: int = 0
    ground_layer: int = 0
    pointer: bool = False  # JointEncoderConfig.pointer (the pointer objective trains it)


@dataclass(frozen=True)
class TrainJobConfig:
    """Everything a training run needs; the run's identity is storage_path/name (rerun = resume)."""

    tables: List[str]  # raw token table files or folders, any fsspec path
    storage_path: str
    name: str
    model: ModelSpec = field(default_factory=ModelSpec)
    init_checkpoint: Optional[str] = None  # start from this EDJE checkpoint (fine-tuning)
    init_encoder_from: Optional[str] = None  # copy only the joint encoder from this checkpoint (distillation)
    teacher_checkpoint: Optional[str] = None  # frozen teacher (distillation)
    # Annotation files whose entries carry `grounding` (word index, object centre per grounded word), read by
    # the ground objective; rows are matched by (image id, caption).
    grounding: Tuple[str, ...] = ()
    objectives: Tuple[str, ...] = PRETRAIN_OBJECTIVES
    # The flip objective's negatives. "caption": each positive against its caption reversed on one axis, same
    # image. "square": a caption with horizontal spatial words makes a square with the image's mirrored copy
    # ((I, c) and (mirror I, flip c) true, (I, flip c) and (mirror I, c) false: every string and image true once
    # and false once, so the spatial words alone tell nothing); vertical ones (no mirror keeps their labels)
    # stay caption-side, weighted so that each key of spatial words is as often true as flipped (FlipBalance).
    flip_mode: Literal["caption", "square"] = "caption"
    # Raw tables encoded with --augment hflip whose mirrored rows give the square its mirrored images, matched by
    # image id; () = the training tables themselves. Mirrored rows are never training rows of their own.
    mirror_tables: Tuple[str, ...] = ()
    pointer_k: float = 10.0  # sharpness of the pointer's order loss softplus(k * signed difference)
    # MLM starts near ln(30k) = 10 nats from a random head; at weight 1 it dominates the clipped
    # gradient and Adam's moments on the shared encoder, so it weighs less than ITM.
    loss_weights: Tuple[Tuple[str, float], ...] = (("itm", 1.0), ("mlm", 0.3), ("recovery", 1.0), ("distill", 1.0))
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    batch_size: int = 32  # per worker
    epochs: int = 1
    max_steps: Optional[int] = None  # stop after this many optimizer steps in total (all epochs)
    lr: float = 3e-4
    weight_decay: float = 0.05
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine decay ends at this share of lr
    k: int = 4  # hard negatives per sample and direction
    # MLM masking: "random" = BERT's (mlm_probability of caption wordpieces); "groups" = every word
    # of one attribute group per caption (training/masking.py), so the image must supply the binding.
    mlm_masking: Literal["random", "groups"] = "random"
    mlm_groups: Optional[str] = None  # JSON {group: [words]}; None = the sample world's caption vocabulary
    # Relative odds of each group being the one masked in a caption (groups not named: 1), e.g. relation 4:
    # a relation word is one word in ten of a caption, and its read-out is what relations are learned from.
    mlm_group_weights: Tuple[Tuple[str, float], ...] = ()
    mining: Literal["topk", "sample"] = "topk"
    mining_temperature: float = 0.05
    negatives: NegativeSource = "in-batch"
    miner_url: Optional[str] = None
    # "planned": each worker holds its shard and composes batches (shuffled, then a growing share
    # of near-neighbour clusters: training/sampler.py); "stream": Ray Data streaming with a local
    # shuffle buffer, for shards larger than a worker's memory.
    batching: Literal["planned", "stream"] = "planned"
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    shuffle_buffer: int = 8192  # rows, stream batching only
    checkpoint_every: int = 200  # steps; a checkpoint is also written at each epoch's end
    log_every: int = 10
    keep_checkpoints: int = 2
    # Worker-group failures survived by restarting from the newest checkpoint (a week-long job loses
    # at most checkpoint_every steps to a dead node or a worker killed under load); -1: unlimited.
    max_failures: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.objectives) - set(OBJECTIVES)
        if unknown:
            raise ValueError(f"unknown objectives {sorted(unknown)}; choose from {', '.join(OBJECTIVES)}")
        if "flip" in self.objectives and "itm" not in self.objectives:
            raise ValueError("the flip objective compares ITM logits: it needs the itm objective")
        if self.flip_mode not in ("caption", "square"):
            raise ValueError(f"flip_mode must be 'caption' or 'square', got {self.flip_mode!r}")
        if self.flip_mode == "square" and "flip" not in self.objectives:
            raise ValueError("flip_mode='square' shapes the flip objective's negatives: add the flip objective")
        if self.flip_mode == "square" and self.batching != "planned":
            raise ValueError("the flip square needs batching='planned' (mirrored rows are set apart per worker)")
        # The grounding head itself may come from an --init checkpoint: the model checks it is there.
        if "ground" in self.objectives and not self.grounding:
            raise ValueError("the ground objective needs grounding annotation files")
        if "distill" in self.objectives and not self.teacher_checkpoint:
            raise ValueError("the distill objective needs teacher_checkpoint")
        if self.negatives == "miner" and not self.miner_url:
            raise ValueError("negatives='miner' needs miner_url")
        if self.negatives not in ("in-batch", "miner"):
            raise ValueError(f"negatives must be 'in-batch' or 'miner', got {self.negatives!r}")
        if self.batching not in ("planned", "stream"):
            raise ValueError(f"batching must be 'planned' or 'stream', got {self.batching!r}")
        if self.batching == "stream" and self.curriculum.max_fraction > 0:
            raise ValueError("neighbour-cluster batches need batching='planned'")
        if self.mlm_masking not in ("random", "groups"):
            raise ValueError(f"mlm_masking must be 'random' or 'groups', got {self.mlm_masking!r}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be at least 2 (negatives come from the batch)")

    def weight(self, objective: str) -> float:
        """Loss weight of one objective."""
        return dict(self.loss_weights).get(objective, 1.0)
