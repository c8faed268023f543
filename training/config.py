"""Typed configuration of a Ray Train EDJE job (pretraining, fine-tuning, distillation); each field's command-line
option (training/launch.py) is written on it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Literal, Optional, Tuple

from edje.model.text_augment import ALL_OPERATIONS, check_text_augment
from edje.schemas.cli_options import option
from edje.training.sampler import CurriculumConfig

Objective = Literal["itm", "mlm", "recovery", "distill", "ground", "flip", "pointer", "route_distill", "route_mirror",
                    "word_align", "cell_recovery", "noun_swap", "orientation", "attribute_swap"]
OBJECTIVES: Tuple[str, ...] = ("itm", "mlm", "recovery", "distill", "ground", "flip", "pointer", "route_distill",
                               "route_mirror", "word_align", "cell_recovery", "noun_swap", "orientation",
                               "attribute_swap")
NegativeSource = Literal["in-batch", "miner"]

PRETRAIN_OBJECTIVES: Tuple[str, ...] = ("itm", "mlm", "recovery")
# MLM starts near ln(30k) = 10 nats from a random head; at weight 1 it dominates the clipped
# gradient and Adam's moments on the shared encoder, so it weighs less than ITM.
LOSS_WEIGHTS: Tuple[Tuple[str, float], ...] = (("itm", 1.0), ("mlm", 0.3), ("recovery", 1.0), ("distill", 1.0))

# Argument groups of the training jobs' --help.
MODEL_GROUP = "model (ignored with --init)"
RELATIONS_GROUP = "relations (also applied to --init: its weights kept, the new parts starting at 0)"


def absolute_path(path: Optional[str]) -> Optional[str]:
    """A local path made absolute: Ray Train workers run in another working directory than the driver."""
    if path is None or "://" in path:
        return path
    return os.path.abspath(path)


def bert_fields(items: Optional[List[str]]) -> Optional[tuple]:
    """--random-bert's FIELD=INT items as sorted (field, int) pairs (None when not given)."""
    if not items:
        return None
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"--random-bert takes FIELD=INT items, got {item!r}")
        out.append((key, int(value)))
    return tuple(sorted(out))


def _loss_weights(pairs: List[List[str]]) -> Tuple[Tuple[str, float], ...]:
    """--loss-weight pairs over the default weights, sorted by objective."""
    return tuple(sorted({**dict(LOSS_WEIGHTS), **{k: float(v) for k, v in pairs}}.items()))


def _group_weights(pairs: List[List[str]]) -> Tuple[Tuple[str, float], ...]:
    return tuple((g, float(w)) for g, w in pairs)


def _absolute_all(paths: List[str]) -> Tuple[str, ...]:
    return tuple(absolute_path(p) for p in paths)


@dataclass(frozen=True)
class ModelSpec:
    """How to build the EDJE model when no checkpoint is given to start from."""

    adapter: Literal["local", "compressed"] = option("compressed", group=MODEL_GROUP)
    num_queries: int = option(64, group=MODEL_GROUP)
    adapter_hidden: int = option(8192, group=MODEL_GROUP)
    adapter_heads: int = option(8, group=MODEL_GROUP)
    # AdapterConfig.position
    adapter_position: Literal["none", "2d"] = option(
        "none", group=MODEL_GROUP, help="2d: add a fixed sine-cosine (row, column) embedding to the backbone's square "
        "token grid (also added to an --init checkpoint's adapter)")
    # AdapterConfig.position_out_std
    adapter_position_out: float = option(0.0, group=MODEL_GROUP, help="compressed: each token also carries a linear "
                                         "map, started at this std, of the grid cell centre its query attends to "
                                         "(0: none; needs a square token grid)")
    # AdapterConfig.recover_cells
    adapter_recover_cells: int = option(0, group=MODEL_GROUP, help="compressed: a training head that rebuilds this "
                                        "many cells of a local teacher's tokens from the compressed ones (the "
                                        "cell_recovery objective; 0: none)")
    # AdapterConfig.query_grid
    adapter_query_grid: float = option(0.0, group=MODEL_GROUP, help="compressed: put the queries on a square grid, "
                                       "each attending near its own region (a Gaussian bias of this width in query-grid "
                                       "steps), so the tokens are a coarse cell grid the pointer can read (0: free "
                                       "queries)")
    # AdapterConfig.position_gain: the 2-D table's initial gain
    adapter_position_gain: float = option(1.0, group=MODEL_GROUP, help="initial gain of the 2-D table (unit norm per "
                                          "cell; backbone tokens are ~17 long)")
    language_model: Optional[str] = option(
        None, group=MODEL_GROUP, help="BERT-family language model: a hub id (e.g. microsoft/MiniLM-L12-H384-uncased, "
        "the paper's) or a folder; resolved once on the driver and shipped to every worker (default: the packaged "
        "all-MiniLM-L6-v2)")
    encoder_layers: Optional[int] = option(None, group=MODEL_GROUP, help="keep only the first N language-model layers")
    # Random-init BERT of this shape (BertConfig fields) with the language model's tokenizer, instead
    # of its weights: for CPU-only budgets where even a 384-wide encoder is too slow.
    bert_config: Optional[Tuple[Tuple[str, int], ...]] = option(
        None, flag="--random-bert", group=MODEL_GROUP, convert=bert_fields, nargs="+", metavar="FIELD=INT",
        help="random-init BERT of this shape (e.g. hidden_size=128 num_hidden_layers=4 num_attention_heads=4 "
        "intermediate_size=512) with the language model's tokenizer")
    max_text_tokens: int = option(64, group=MODEL_GROUP)
    # JointEncoderConfig.word_context: neighbouring caption words folded into each word's input
    word_context: int = option(0, group=MODEL_GROUP, help="odd kernel width of a convolution folding neighbouring "
                               "caption words into each word's input embedding (0 = plain BERT)")
    # JointEncoderConfig.itm_input: "global" = one pooled image vector
    itm_input: Literal["tokens", "global"] = option(
        "tokens", group=MODEL_GROUP, help="tokens: BERT over caption + image tokens (EDJE); global: BERT over the "
        "caption alone and the image as one vector (mean of the adapter's tokens) fused with the text [CLS] (a "
        "baseline)")
    # Relations (JointEncoderConfig's fields of the same names). Unlike the fields above they also apply
    # to a run that starts from a checkpoint: its weights are kept and the new parts start at 0.
    image_positions: Literal["after_text", "fixed"] = option(
        "after_text", group=RELATIONS_GROUP, help="fixed: image token i keeps one BERT position whatever the "
        "caption's length")
    relation_roles: bool = option(False, group=RELATIONS_GROUP, help="relation / subject / object role embeddings "
                                  "from a parse of spatial prepositions")
    # Where the roles come from: "english", the rule of English (model/relation_spans.py), no word list;
    # "vocabulary", a parse by the sample world's words (a diagnostic; recorded in the checkpoint as
    # role_vocabulary). None: "english" for a new model, and a checkpoint's own roles for --init.
    role_parse: Optional[Literal["vocabulary", "english"]] = option(
        None, group=RELATIONS_GROUP, help="where the roles come from. vocabulary: a parse by the sample world's words "
        "(a diagnostic, recorded as role_vocabulary); english: a rule of English, no word list of any world (default: "
        "english for a new model, the --init checkpoint's own roles)")
    route_layer: int = option(0, group=RELATIONS_GROUP, help="after this many layers, each relation word receives "
                              "P(subject - object) (0: off)")
    ground_layer: int = option(0, group=RELATIONS_GROUP, help="after this many layers, a head regresses grounded "
                               "words' object centres (0: off; the ground objective and --grounding train it)")
    # JointEncoderConfig.word_alignment
    word_alignment: float = option(0.0, group=RELATIONS_GROUP, help="add g x the word alignment (the mean over the "
                                   "caption's content words of each one's best cosine over the image tokens, on the "
                                   "encoder's input word embeddings) to the ITM logit, g learned from this start (0: "
                                   "none; the word_align objective teaches the alignment)")
    # JointEncoderConfig.pointer (the pointer objective trains it)
    pointer: bool = option(False, group=RELATIONS_GROUP, help="the pointer: each relation's subject and object "
                           "phrase, from its own words, points at the image cells; its expected cell joins the "
                           "phrase's states where the route reads them (needs --role-parse english, --route-layer and "
                           "a local adapter or --adapter-query-grid; the pointer objective trains it)")


@dataclass(frozen=True)
class TrainJobConfig:
    """Everything a training run needs; the run's identity is storage_path/name (rerun = resume)."""

    tables: List[str] = option(nargs="+", required=True, convert=list,
                               help="raw token tables: files or folders, any fsspec path")
    storage_path: str = option(required=True, help="where Ray Train keeps checkpoints (local dir or URI)")
    name: str = option(required=True, help="run name; rerunning the same name resumes from its newest checkpoint")
    model: ModelSpec = option(default_factory=ModelSpec, nested=True)
    init_checkpoint: Optional[str] = option(None, flag="--init", convert=absolute_path,
                                            help="start from this EDJE checkpoint")
    # A backbone trained on keeps its tokens' meaning roughly, so the whole reranker (its adapter too) is a better
    # start on the new tables than a fresh adapter under the old encoder; the check that refuses other weights is then
    # the user's to waive.
    init_on_new_backbone: bool = option(False, help="with --init: the checkpoint was trained on tokens of the same "
                                        "backbone with other weights (the backbone trained on since), or of another "
                                        "tower whose tokens have the same count and width (a deeper one grown from "
                                        "it); its adapter starts from its own weights on the tables' tokens, and the "
                                        "run's checkpoints name the tables' backbone and weights")
    init_encoder_from: Optional[str] = option(None, convert=absolute_path,
                                              help="copy only the joint encoder from this EDJE checkpoint")
    teacher_checkpoint: Optional[str] = option(None, flag="--teacher", convert=absolute_path,
                                               help="frozen teacher EDJE checkpoint (distill, route_distill and route_mirror objectives)")
    # Annotation files whose entries carry `grounding` (word index, object centre per grounded word), read by
    # the ground objective; rows are matched by (image id, caption).
    grounding: Tuple[str, ...] = option((), group=RELATIONS_GROUP, nargs="+", cli_default=[], convert=_absolute_all,
                                        help="annotation files whose entries carry `grounding` (the ground objective)")
    # Each job sets its own default (training/launch.py's build_parser).
    objectives: Tuple[str, ...] = option(PRETRAIN_OBJECTIVES, nargs="+", choices=list(OBJECTIVES), convert=tuple)
    # The flip objective's negatives. "caption": each positive against its caption reversed on one axis, same
    # image, weighted so that each key of spatial words is as often true as flipped (FlipBalance, axis None).
    # "square": a caption with horizontal spatial words makes a square with the image's mirrored copy ((I, c)
    # and (mirror I, flip c) true, (I, flip c) and (mirror I, c) false: every string and image true once and
    # false once, so the spatial words alone tell nothing); vertical ones (no mirror keeps their labels) stay
    # caption-side, weighted so that each key of spatial words is as often true as flipped (FlipBalance).
    flip_mode: Literal["caption", "square"] = option(
        "caption", help="the flip objective's negatives. caption: each positive against its caption reversed on one "
        "axis, same image; square: horizontal captions make a square with the image's mirrored copy (tables encoded "
        "with --augment hflip), vertical ones stay caption-side; either way caption-side flips are weighted so that "
        "the spatial words alone tell true from flipped no better than chance")
    # Raw tables encoded with --augment hflip whose mirrored rows give the square its mirrored images, matched by
    # image id; () = the training tables themselves. Mirrored rows are never training rows of their own.
    mirror_tables: Tuple[str, ...] = option(
        (), nargs="+", cli_default=[], convert=tuple, help="raw tables encoded with --augment hflip that hold the "
        "training images' mirrored copies (--flip-mode square; default: the training tables)")
    pointer_k: float = option(10.0, help="sharpness of the pointer objective's order loss softplus(k * signed "
                              "difference)")
    align_temperature: float = option(0.05, help="temperature of the word_align objective's in-batch cross-entropy over "
                                      "the mean best cosine of a caption's content words to an image's tokens")
    # Served, a reranker is ranked by its ITM logit + w x the first stage's cosine. Trained on that sum, the ITM
    # loss of a pair the first stage already orders saturates, so the gradient goes to pairs the first stage misorders.
    itm_first_stage_weight: float = option(0.0, help="train the itm objective on each pair's logit + this x the first "
                                           "stage's cosine (the tables' embeddings; in-batch negatives; 0: the "
                                           "logit alone)")
    # Each --loss-weight OBJECTIVE WEIGHT replaces one of these (LOSS_WEIGHTS).
    loss_weights: Tuple[Tuple[str, float], ...] = option(
        LOSS_WEIGHTS, flag="--loss-weight", nargs=2, action="append", metavar=("OBJECTIVE", "WEIGHT"), cli_default=[],
        convert=_loss_weights, help="weight of one objective (default 1.0)")
    num_workers: int = option(2)
    use_gpu: bool = option(False)
    cpus_per_worker: float = option(1.0)
    batch_size: int = option(32, help="per worker")
    epochs: int = option(1)
    max_steps: Optional[int] = option(None, help="stop after this many steps in total")
    lr: float = option(3e-4)  # each job sets its own default
    weight_decay: float = option(0.05)
    warmup_steps: int = option(100)
    min_lr_ratio: float = option(0.1, help="cosine decay from lr after warm-up down to this share of lr at the last "
                                 "step")
    k: int = option(4, help="hard negatives per sample and direction")
    # MLM masking: "random" = BERT's (mlm_probability of caption wordpieces); "groups" = every word
    # of one attribute group per caption (training/masking.py), so the image must supply the binding;
    # "content" = one whole content word per caption by a rule of English (model/content_words.py).
    mlm_masking: Literal["random", "groups", "content"] = option(
        "random", help="random: BERT's random wordpieces; groups: all words of one attribute group per caption "
        "(colour, shape, size or spatial words), so that only the image can supply the binding; content: every "
        "piece of one content word per caption (any word outside English's closed classes of function words: no "
        "word list of any world)")
    mlm_groups: Optional[str] = option(None, help="JSON file {group: [words]} for --mlm-masking groups (default: the "
                                       "sample world's caption vocabulary)")
    # Relative odds of each group being the one masked in a caption (groups not named: 1), e.g. relation 4:
    # a relation word is one word in ten of a caption, and its read-out is what relations are learned from.
    mlm_group_weights: Tuple[Tuple[str, float], ...] = option(
        (), flag="--mlm-group-weight", nargs=2, action="append", metavar=("GROUP", "WEIGHT"), cli_default=[],
        convert=_group_weights, help="odds of GROUP being the one masked, relative to the others' 1 (--mlm-masking "
        "groups)")
    # A reranker trained on one corpus's wordings reads other wordings less well; rewriting a share of the captions
    # (model/text_augment.py) before the batch's negatives are drawn from them leaves rewritten and written captions
    # as often true as false.
    text_augment: float = option(0.0, help="share of each batch's captions rewritten each step, before its "
                                 "negatives are drawn (model/text_augment.py; 0: none)")
    text_augment_ops: Tuple[str, ...] = option(("function_words", "punctuate"), nargs="+", choices=list(ALL_OPERATIONS),
                                               convert=tuple, help="the rewrites --text-augment draws from "
                                               "(function_words: each function word dropped with probability one half)")
    mining: Literal["topk", "sample"] = option("topk")
    mining_temperature: float = option(0.05)
    negatives: NegativeSource = option("in-batch", help="in-batch: mined among the batch gathered across workers; "
                                       "miner: POST /v1/negatives")
    miner_url: Optional[str] = option(None, help="base url of the miner service (with --negatives miner)")
    # "planned": each worker holds its shard and composes batches (shuffled, then a growing share
    # of near-neighbour clusters: training/sampler.py); "stream": Ray Data streaming with a local
    # shuffle buffer, for shards larger than a worker's memory.
    batching: Literal["planned", "stream"] = option(
        "planned", help="planned: shuffled batches composed in each worker (with the cluster curriculum); stream: "
        "Ray Data streaming with a local shuffle buffer (shards beyond worker memory)")
    curriculum: CurriculumConfig = option(default_factory=CurriculumConfig, nested=True)
    shuffle_buffer: int = option(8192, help="rows (stream batching)")
    checkpoint_every: int = option(200)  # steps; a checkpoint is also written at each epoch's end
    log_every: int = option(10)
    keep_checkpoints: int = option(2)
    # Worker-group failures survived by restarting from the newest checkpoint (a week-long job loses
    # at most checkpoint_every steps to a dead node or a worker killed under load); -1: unlimited.
    max_failures: int = option(3, help="worker-group failures to survive by restarting from the newest checkpoint "
                               "(-1: any; default %(default)s)")
    seed: int = option(0)

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
        if self.init_on_new_backbone and not self.init_checkpoint:
            raise ValueError("init_on_new_backbone qualifies --init: give the checkpoint to start from")
        # The grounding head itself may come from an --init checkpoint: the model checks it is there.
        if "ground" in self.objectives and not self.grounding:
            raise ValueError("the ground objective needs grounding annotation files")
        for name in ("distill", "route_distill", "route_mirror", "cell_recovery"):  # each reads a frozen teacher's pass
            if name in self.objectives and not self.teacher_checkpoint:
                raise ValueError(f"the {name} objective needs teacher_checkpoint")
        for name in ("route_distill", "route_mirror"):
            # An --init checkpoint may carry its own route: the objectives check the built model then.
            if name in self.objectives and not self.init_checkpoint and not self.model.route_layer:
                raise ValueError(f"the {name} objective trains the route's inputs: build the model with route_layer")
        if "route_mirror" in self.objectives and self.flip_mode != "square":
            raise ValueError("the route_mirror objective reads the flip square's mirrored images: set flip_mode "
                             "'square'")
        if self.itm_first_stage_weight < 0:
            raise ValueError(f"itm_first_stage_weight must be >= 0, got {self.itm_first_stage_weight}")
        if self.itm_first_stage_weight and ("itm" not in self.objectives or self.negatives != "in-batch"
                                            or self.text_augment > 0):
            # The cosines come from the tables' embeddings of in-batch rows, of each caption as written.
            raise ValueError("itm_first_stage_weight shifts the itm objective by the first stage's cosines of in-batch "
                             "negatives: it needs the itm objective, negatives='in-batch' and no text_augment")
        if not self.align_temperature > 0:
            raise ValueError(f"align_temperature must be > 0, got {self.align_temperature}")
        if self.negatives == "miner" and not self.miner_url:
            raise ValueError("negatives='miner' needs miner_url")
        if self.negatives not in ("in-batch", "miner"):
            raise ValueError(f"negatives must be 'in-batch' or 'miner', got {self.negatives!r}")
        if self.batching not in ("planned", "stream"):
            raise ValueError(f"batching must be 'planned' or 'stream', got {self.batching!r}")
        if self.batching == "stream" and self.curriculum.max_fraction > 0:
            raise ValueError("neighbour-cluster batches need batching='planned'")
        if self.mlm_masking not in ("random", "groups", "content"):
            raise ValueError(f"mlm_masking must be 'random', 'groups' or 'content', got {self.mlm_masking!r}")
        check_text_augment(self.text_augment, self.text_augment_ops)
        if self.text_augment > 0 and "ground" in self.objectives:
            raise ValueError("the ground objective finds its grounding by the caption as written: drop text_augment")
        if self.batch_size < 2:
            raise ValueError("batch_size must be at least 2 (negatives come from the batch)")

    def weight(self, objective: str) -> float:
        """Loss weight of one objective."""
        return dict(self.loss_weights).get(objective, 1.0)
