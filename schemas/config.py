"""Typed configuration of every model part: backbone, adapter, joint encoder, codec."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal, Optional, Tuple, Type, TypeVar

FeatureLayer = Literal["final", "penultimate"]
AdapterKind = Literal["local", "compressed"]
Quantization = Literal["fp32", "fp16", "int8", "int4"]

T = TypeVar("T")


@dataclass(frozen=True)
class BackboneConfig:
    """A frozen open_clip model: a registry name with a pretrained tag or local checkpoint, or an `hf-hub:ORG/NAME`
    repository (which carries its own weights); its token layer; what exactly was loaded."""

    # open_clip registry name (weights from `pretrained`; none: random) or "hf-hub:ORG/NAME" (the repository's
    # open_clip_config.json and weights; `pretrained` must be None)
    name: str
    pretrained: Optional[str] = None
    # "final" = post-norm last-layer tokens (what EDJE uses for SigLIP2);
    # "penultimate" = output of the second-to-last block (CLIP-style towers).
    feature_layer: FeatureLayer = "final"
    # sha256 of the local weights file (None for a tag or random weights): VisionBackbone.create refuses
    # a file that no longer holds these weights (schemas/weights.py).
    weights_sha256: Optional[str] = None
    # The hub commit the weights (a tag's file, an hf-hub repository) were read from; given, it is the one loaded.
    revision: Optional[str] = None
    # The architecture alone, randomly initialised (tests, benchmarks); for an hf-hub name, its weights are skipped.
    random_weights: bool = False

    def __post_init__(self) -> None:
        if self.feature_layer not in ("final", "penultimate"):
            raise ValueError(f"feature_layer must be 'final' or 'penultimate', got {self.feature_layer!r}")
        if self.random_weights and self.pretrained:
            raise ValueError(f"backbone {self.name}: random_weights contradicts pretrained={self.pretrained!r}")
        if self.name.startswith("hf-hub:") and self.pretrained:
            raise ValueError(f"backbone {self.name} carries its own weights: give no pretrained tag or file "
                             f"(got {self.pretrained!r})")


@dataclass(frozen=True)
class AdapterConfig:
    """Local per-token MLP or token-compression adapter (the paper's local MLP and attention-pooling adapter)."""

    kind: AdapterKind
    input_dim: int  # d_v, the backbone's token width
    output_dim: int  # d_lm, the language model's width (384 for MiniLM)
    hidden_dim: int = 8192
    num_queries: int = 64  # m, only for kind == "compressed"
    num_heads: int = 8  # attention heads of the compression adapter
    layer_norm_eps: float = 1e-6
    # "2d": a fixed sine-cosine embedding of each token's (row, column) on the backbone's square grid
    # is added to the tokens first, so "left of" is a comparison the encoder can read linearly.
    position: Literal["none", "2d"] = "none"
    # Initial gain of the 2-D table (unit norm per cell); backbone tokens are ~17 long, so at 1 the table is a
    # whisper a fresh adapter takes long to hear. Learned from there; only the start is set here.
    position_gain: float = 1.0
    # Compressed only: each output token also carries a linear map of the expected grid cell centre that its query
    # attends to, started at this std (0: none). Queries that pool content have near-uniform attention and tokens
    # that barely change when the image is mirrored; this term gives where a query looked a first-order path to
    # the encoder, from the start.
    position_out_std: float = 0.0
    # Compressed only: a training head (learned cell queries over the compressed tokens) that rebuilds this many cells
    # of a local teacher's tokens, so the tokens must keep what is where (0: none). Scoring never runs it.
    recover_cells: int = 0
    # Compressed only: the queries sit on a square grid (row-major, num_queries a square) and each one's attention
    # logits over the backbone's cells get -d^2 / (2 (query_grid * step)^2), d the distance between the query's and
    # the cell's centres, step the query grid's spacing (0: free queries, the paper's). Query j then pools region j,
    # so the compressed tokens are a coarse cell grid, laid out as a local adapter's: they permute when the image is
    # mirrored, and the pointer can read them.
    query_grid: float = 0.0

    @property
    def cell_grid(self) -> bool:
        """Whether the output tokens are a square grid of image cells (local, or compressed on a query grid)."""
        return self.kind == "local" or self.query_grid > 0

    def __post_init__(self) -> None:
        if self.kind not in ("local", "compressed"):
            raise ValueError(f"adapter kind must be 'local' or 'compressed', got {self.kind!r}")
        if self.position not in ("none", "2d"):
            raise ValueError(f"adapter position must be 'none' or '2d', got {self.position!r}")
        if self.position_out_std < 0 or (self.position_out_std > 0 and self.kind != "compressed"):
            raise ValueError(f"position_out_std must be >= 0, and > 0 only for a compressed adapter, got "
                             f"{self.position_out_std} for {self.kind!r}")
        if self.recover_cells < 0 or (self.recover_cells > 0 and self.kind != "compressed"):
            raise ValueError(f"recover_cells must be >= 0, and > 0 only for a compressed adapter, got "
                             f"{self.recover_cells} for {self.kind!r}")
        if self.query_grid < 0 or (self.query_grid > 0 and (self.kind != "compressed"
                                                             or round(self.num_queries ** 0.5) ** 2 != self.num_queries)):
            raise ValueError(f"query_grid must be >= 0, and > 0 only for a compressed adapter with a square number of "
                             f"queries, got {self.query_grid} for {self.kind!r} with {self.num_queries} queries")
        if self.kind == "compressed" and self.input_dim % self.num_heads:
            raise ValueError(f"input_dim {self.input_dim} is not divisible by num_heads {self.num_heads}")

    def output_tokens(self, input_tokens: int) -> int:
        """Number of tokens this adapter emits for `input_tokens` backbone tokens."""
        return self.num_queries if self.kind == "compressed" else input_tokens


@dataclass(frozen=True)
class JointEncoderConfig:
    """BERT-family joint encoder: a local path / hub name, or an explicit BertConfig dict."""

    language_model: Optional[str] = None  # path or name of a BERT checkpoint (weights + tokenizer)
    tokenizer: Optional[str] = None  # defaults to language_model
    bert_config: Optional[dict] = None  # random init from this BertConfig when no language_model
    max_text_tokens: int = 64  # caption wordpieces kept (the paper's text max length)
    num_image_tokens: int = 64
    text_embed_dim: int = 512  # width of the backbone's text embedding (recovery head target)
    # Kernel width of a convolution that mixes each caption word's input embedding with its
    # neighbours' (0 = off, BERT as published). Binding is written in word order ("red circle"); a
    # small encoder from scratch did not learn to read it through attention alone (BENCHMARKS.md).
    word_context: int = 0
    # What the ITM head reads. "tokens" (EDJE): BERT over `[CLS] caption [SEP] <image>xm [SEP]`, the pooled
    # [CLS] of the pair. "global" (the feature fusion of ../shared/reference/004, the thesis chapter): BERT over
    # the caption alone; the image enters only as ONE vector, the mean of the adapter's output tokens, fused
    # with the text [CLS] by an MLP over [t, v, t*v, |t-v|]; MLM reads that vector at the LM head only.
    itm_input: Literal["tokens", "global"] = "tokens"
    # Initial scale g of the word-alignment term added to the ITM logit (0: none): g x the mean over the caption's
    # content words (a rule of English, no word list) of each word's best cosine over the image tokens, on the
    # encoder's own input word embeddings (FILIP's late interaction); g is learned. A small encoder from scratch learns
    # which word is which image token through word alignment long before its ITM head reads it (BENCHMARKS.md).
    word_alignment: float = 0.0
    # Where image tokens sit in BERT's position table. "after_text": right after the caption, so a token's
    # position id depends on the caption's length; "fixed": image token i always has position
    # max_text_tokens + 2 + i, so a local adapter's cell keeps one position whatever the caption.
    image_positions: Literal["after_text", "fixed"] = "after_text"
    # Relations ("A left of B"): role embeddings (relation / subject / object of each relation the caption states)
    # added to caption words, starting at 0. With role_vocabulary (a DIAGNOSTIC of the sample world, every
    # checkpoint with roles before the rule below), a parse finds noun phrases by that word list
    # (model/relation_roles.py), so it does not read open-vocabulary captions. Without it, the roles come from a rule
    # of English with no word list of any world (model/relation_spans.py: the closed class of spatial words, the
    # text before and after them).
    relation_roles: bool = False
    role_vocabulary: Optional[Tuple[str, ...]] = None
    # After this many BERT layers (0: off), each relation word receives P(mean of its subject's states minus
    # mean of its object's states), P starting at 0: a path from the nouns to the word that compares them.
    route_layer: int = 0
    # Training only (0: off): after this many layers, a head regresses each grounded word's object centre
    # (boxes in the annotations), so nouns carry where their object is before the route reads them.
    ground_layer: int = 0
    # The pointer (needs the rule's roles, the route and a square grid of image tokens: a local adapter): each
    # relation's subject and object phrase gets a query from its own input word embeddings (never the relation
    # word) that attends over the image cells; its expected cell centre x_hat on the grid, through a linear map,
    # is added to the phrase's states where the route reads them. Training gives it an order loss from the caption
    # (training/losses.py pointer_order_loss).
    pointer: bool = False
    pointer_dim: int = 64  # width of the pointer's queries and keys
    # The map of x_hat starts random with this std: at 0 it and the route, each waiting for the other, never start.
    pointer_inject_std: float = 1.0

    def __post_init__(self) -> None:
        if self.itm_input not in ("tokens", "global"):
            raise ValueError(f"itm_input must be 'tokens' or 'global', got {self.itm_input!r}")
        if self.image_positions not in ("after_text", "fixed"):
            raise ValueError(f"image_positions must be 'after_text' or 'fixed', got {self.image_positions!r}")
        if self.route_layer < 0 or self.ground_layer < 0:
            raise ValueError("route_layer and ground_layer count BERT layers (0: off)")
        if self.role_vocabulary is not None:
            object.__setattr__(self, "role_vocabulary", tuple(self.role_vocabulary))  # JSON gives a list
        if self.route_layer and not self.relation_roles:
            raise ValueError("route_layer needs relation_roles (the route reads the parse's roles)")
        if self.pointer and (not self.route_layer or self.role_vocabulary is not None):
            raise ValueError("the pointer needs route_layer and the roles of the rule of English (relation_roles "
                             "without role_vocabulary): it injects where the route reads the phrases")
        if (self.relation_roles or self.route_layer or self.ground_layer) and self.itm_input == "global":
            raise ValueError("relation roles, the route and grounding need image tokens in BERT (itm_input='tokens')")
        if self.language_model is None and self.bert_config is None:
            raise ValueError("JointEncoderConfig needs language_model or bert_config")
        if self.tokenizer is None and self.language_model is None:
            raise ValueError("JointEncoderConfig needs a tokenizer path when there is no language_model")
        if self.word_context < 0 or (self.word_context and self.word_context % 2 == 0):
            raise ValueError(f"word_context must be 0 (off) or an odd kernel width, got {self.word_context}")


@dataclass(frozen=True)
class CodecConfig:
    """How token matrices are stored: dtype and, for int4, the scale group size."""

    quantization: Quantization = "fp16"
    group_size: Optional[int] = None  # int4 only: None = one scale per token

    def __post_init__(self) -> None:
        if self.quantization not in ("fp32", "fp16", "int8", "int4"):
            raise ValueError(f"unknown quantization {self.quantization!r}")
        if self.group_size is not None and self.quantization != "int4":
            raise ValueError("group_size applies to int4 only")


@dataclass(frozen=True)
class EDJEConfig:
    """The trainable model: adapter + joint encoder, and the backbone it reads."""

    backbone: BackboneConfig
    adapter: AdapterConfig
    encoder: JointEncoderConfig


def to_json(cfg: Any) -> str:
    """Serialise a config dataclass to JSON."""
    return json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True)


def from_dict(cls: Type[T], data: dict) -> T:
    """Build a (possibly nested) config dataclass from a dict, rejecting unknown keys."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown config fields {sorted(unknown)}")
    kwargs = {}
    for key, value in data.items():
        sub = _NESTED.get((cls.__name__, key))
        kwargs[key] = from_dict(sub, value) if sub is not None and isinstance(value, dict) else value
    return cls(**kwargs)


_NESTED = {
    ("EDJEConfig", "backbone"): BackboneConfig,
    ("EDJEConfig", "adapter"): AdapterConfig,
    ("EDJEConfig", "encoder"): JointEncoderConfig,
}
