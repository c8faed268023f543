"""Build the EDJE model a training run starts from: a checkpoint, or a fresh adapter over (real) MiniLM weights."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from transformers import BertConfig, BertForMaskedLM

from edje.model.adapters import grid_position
from edje.model.edje import EDJEModel, load_checkpoint, load_state
from edje.model.joint_encoder import extend_position_embeddings
from edje.sampleworld.scene_token_grid import SCENE_TOKENS_BACKBONE
from edje.schemas.config import AdapterConfig, EDJEConfig, JointEncoderConfig
from edje.schemas.token_table import TableMetadata
from edje.training.config import ModelSpec
from edje.training.language_model import resolve_language_model


def edje_config(spec: ModelSpec, meta: TableMetadata) -> EDJEConfig:
    """The EDJEConfig for a raw table's backbone and a model spec; the BERT config is stored in full,
    so checkpoints load without the language model's files. The language model is a folder or a hub id
    (resolved here, as the environment allows); the config's tokenizer is its local folder."""
    lm = resolve_language_model(spec.language_model).folder
    bert = BertConfig.from_pretrained(lm)
    if spec.bert_config is not None:
        bert = BertConfig(**{**_plain(bert.to_dict()), **dict(spec.bert_config)})
    if spec.encoder_layers is not None:
        if not 1 <= spec.encoder_layers <= bert.num_hidden_layers:
            raise ValueError(f"encoder_layers must be in 1..{bert.num_hidden_layers}, got {spec.encoder_layers}")
        bert.num_hidden_layers = spec.encoder_layers
    m = spec.num_queries if spec.adapter == "compressed" else meta.num_tokens
    return EDJEConfig(
        backbone=meta.backbone_config(),
        adapter=AdapterConfig(kind=spec.adapter, input_dim=meta.width, output_dim=bert.hidden_size,
                              hidden_dim=spec.adapter_hidden, num_queries=spec.num_queries, num_heads=spec.adapter_heads,
                              position=spec.adapter_position, position_gain=spec.adapter_position_gain,
                              position_out_std=spec.adapter_position_out, recover_cells=spec.adapter_recover_cells,
                              query_grid=spec.adapter_query_grid),
        encoder=JointEncoderConfig(tokenizer=lm, bert_config=_plain(bert.to_dict()), max_text_tokens=spec.max_text_tokens,
                                   num_image_tokens=m, text_embed_dim=meta.embed_dim, word_context=spec.word_context,
                                   itm_input=spec.itm_input, **grown_fields(spec)),
    )


def build_model(spec: ModelSpec, meta: TableMetadata, init_checkpoint: Optional[str] = None,
                init_encoder_from: Optional[str] = None, new_backbone: bool = False) -> EDJEModel:
    """A checkpoint's model (`new_backbone`: moved onto the tables' backbone weights), or a fresh one whose BERT
    starts from the language model's weights."""
    if init_checkpoint:
        model = with_relations(load_checkpoint(init_checkpoint), spec)
        check_backbone(model.config, meta, init_checkpoint, same_weights=not new_backbone)
        if new_backbone:
            model = on_backbone(model, meta)
        return model.train()
    cfg = edje_config(spec, meta)
    if init_encoder_from:
        source = load_checkpoint(init_encoder_from)
        # Only the encoder is copied and the adapter is fresh: other weights of the same backbone are
        # exactly the case this serves (a retrained backbone's reranker), so the weights are not compared.
        check_backbone(source.config, meta, init_encoder_from, same_weights=False)
        # The encoder is copied whole, so its BERT shape and tokenizer are the source's.
        enc = source.config.encoder
        # The adapter feeds that encoder, so its output width is the source's hidden size, whatever
        # the command line's BERT flags say.
        itm_input = spec.itm_input if spec.itm_input != ModelSpec().itm_input else enc.itm_input
        cfg = replace(cfg, adapter=replace(cfg.adapter, output_dim=source.encoder.hidden_size),
                      encoder=replace(cfg.encoder, tokenizer=enc.tokenizer, language_model=None,
                                      bert_config=enc.bert_config or cfg.encoder.bert_config,
                                      max_text_tokens=enc.max_text_tokens, itm_input=itm_input,
                                      word_context=enc.word_context, **grown_fields(spec)))
        model = EDJEModel(cfg, load_language_model=False)
        state = source.encoder.state_dict()
        if not cfg.encoder.pointer:  # a student without the pointer (a compressed adapter keeps no cell grid)
            state = {k: v for k, v in state.items() if not k.startswith("pointer.")}
        if itm_input != enc.itm_input:
            # Another ITM input (the global-vector baseline from a token model's BERT): the heads that
            # read the image differ, so they start fresh, and parts the other mode cannot have (the relation
            # parts need image tokens in BERT) are left behind; BERT and the word context are copied.
            fresh = ("itm_head.", "mlm_fusion.")
            own = model.encoder.state_dict()
            state = {**{k: v for k, v in state.items() if k in own and not k.startswith(fresh)},
                     **{k: v for k, v in own.items() if k.startswith(fresh)}}
        load_state(model.encoder, _with_new_parts(model.encoder, state), init_encoder_from)
    elif spec.bert_config is not None:
        model = EDJEModel(cfg, load_language_model=False)  # random init by request
    else:
        model = EDJEModel(cfg, load_language_model=False)
        # from_pretrained with a truncated config keeps the first N layers of the real weights; the config's
        # tokenizer is the language model's resolved folder.
        pretrained = BertForMaskedLM.from_pretrained(cfg.encoder.tokenizer, config=BertConfig(**cfg.encoder.bert_config))
        extend_position_embeddings(pretrained, model.encoder.max_length)
        missing, unexpected = model.encoder.bert.load_state_dict(pretrained.state_dict(), strict=False)
        if missing or unexpected:
            raise RuntimeError(f"language model weights do not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.train()


# Encoder options that also grow an --init checkpoint (with_relations): the relation parts and the word-alignment term.
GROWN_FIELDS = ("image_positions", "relation_roles", "route_layer", "ground_layer", "pointer", "word_alignment")


def grown_fields(spec: ModelSpec) -> dict:
    """The spec's relation options and word-alignment term, as JointEncoderConfig fields (with the role parse's word
    list when roles are on and the diagnostic vocabulary parse is asked for)."""
    vocabulary = spec.relation_roles and spec.role_parse == "vocabulary"
    return {**{f: getattr(spec, f) for f in GROWN_FIELDS}, **_role_vocabulary(vocabulary)}


def _role_vocabulary(relation_roles: bool) -> dict:
    """The diagnostic role parse reads noun phrases by the sample world's attribute and shape words; the
    checkpoint records them, so that scoring it needs nothing from the sample world."""
    if not relation_roles:
        return {}
    from edje.sampleworld.grounding import NOUN_WORDS

    return {"role_vocabulary": tuple(sorted(NOUN_WORDS))}


def with_relations(model: EDJEModel, spec: ModelSpec) -> EDJEModel:
    """`model` with the relation options and the word-alignment term the spec turns on that it lacks (and 2-D
    positions on its adapter's input): its weights kept, each new part at 0 (the alignment's scale at the spec's
    start; the position table at its usual gain of 1, about a tenth of a
    ViT token's norm: at 0 a scalar gain would take thousands of steps to matter; the pointer's map of x_hat at
    its random start). Options the spec leaves at their defaults keep the checkpoint's."""
    default = ModelSpec()
    asked = {f: getattr(spec, f) for f in GROWN_FIELDS if getattr(spec, f) != getattr(default, f)}
    had_roles = model.config.encoder.relation_roles
    if spec.role_parse == "vocabulary":
        asked.update(_role_vocabulary(True))
    elif spec.role_parse == "english" or (asked.get("relation_roles") and not had_roles):
        asked["role_vocabulary"] = None
    position = spec.adapter_position if spec.adapter_position != default.adapter_position else model.config.adapter.position
    if all(getattr(model.config.encoder, f) == v for f, v in asked.items()) and position == model.config.adapter.position:
        return model
    cfg = replace(model.config, encoder=replace(model.config.encoder, **asked),
                  adapter=replace(model.config.adapter, position=position))
    grown = EDJEModel(cfg, load_language_model=False)
    load_state(grown, _with_new_parts(grown, model.state_dict()), "the --init checkpoint with relation parts")
    if asked.get("image_positions") == "fixed" and model.config.encoder.image_positions != "fixed":
        seed_image_positions(grown)
    return grown


# Norm of the 2-D table written into fixed image positions: about a word embedding's (2.2 in the shipped
# encoders), so a cell's row and column weigh in from the first step.
IMAGE_POSITION_NORM = 2.0


def seed_image_positions(model: EDJEModel) -> None:
    """Add a 2-D sine-cosine table (row and column of each cell) to the BERT position rows that fixed image
    positions use, when the adapter keeps a square grid of tokens. Those rows were trained, if at all, for
    caption words; as learned from there, the cell signal was about 6 % of a token's norm and grounding did
    not start within 500 steps (BENCHMARKS.md, "Relations on the backbone's tokens")."""
    enc = model.encoder
    m, hidden = enc.config.num_image_tokens, enc.hidden_size
    if model.config.adapter.kind != "local" or int(round(m ** 0.5)) ** 2 != m or hidden % 4:
        return
    start = enc.config.max_text_tokens + 2
    table = enc.bert.bert.embeddings.position_embeddings.weight
    with torch.no_grad():
        table[start:start + m] += IMAGE_POSITION_NORM * grid_position(m, hidden).to(table.dtype)


def _with_new_parts(module, state: dict) -> dict:
    """`state` completed with the module's own (zero or fresh) weights of parts the state lacks: the relation
    modules and adapter position a warm start adds, so a strict load still names every other missing key."""
    new = ("role_embedding.", "route.", "ground_head.", "position.gain", "pointer.", "alignment_scale")
    own = module.state_dict()
    return {**{k: v for k, v in own.items() if k not in state and any(p in k for p in new)}, **state}


def on_backbone(model: EDJEModel, meta: TableMetadata) -> EDJEModel:
    """`model`, its weights all kept, recorded as reading the tables' backbone (the same architecture and layer,
    other weights): what it is trained on from here, and what its checkpoints must name for serving to check."""
    moved = EDJEModel(replace(model.config, backbone=meta.backbone_config()), load_language_model=False)
    load_state(moved, model.state_dict(), "the --init checkpoint on the tables' backbone")
    return moved


def check_backbone(cfg: EDJEConfig, meta: TableMetadata, where: str, same_weights: bool = True) -> None:
    """Refuse a checkpoint whose adapter reads tokens of another width, count or layer than the tables (same_weights:
    also of another backbone, or of the same backbone with other recorded weights)."""
    if cfg.adapter.input_dim != meta.width:
        raise ValueError(f"{where}: adapter reads {cfg.adapter.input_dim}-wide tokens, the tables hold {meta.width}")
    # Another architecture with tokens of the same shape (a deeper tower grown from the one trained on) is the user's
    # to start on, as other weights are.
    renamed = cfg.backbone.name != meta.backbone and same_weights
    if renamed or cfg.backbone.feature_layer != meta.feature_layer:
        raise ValueError(f"{where}: trained on {cfg.backbone.name}/{cfg.backbone.feature_layer} tokens, "
                         f"the tables hold {meta.backbone}/{meta.feature_layer}")
    if cfg.adapter.kind == "local" and cfg.encoder.num_image_tokens != meta.num_tokens:
        raise ValueError(f"{where}: adapter reads {cfg.encoder.num_image_tokens} tokens an image, the tables hold "
                         f"{meta.num_tokens}")
    if same_weights and cfg.backbone.name == SCENE_TOKENS_BACKBONE and cfg.backbone.pretrained != meta.pretrained:
        # Scene tokens have no weights to hash: their tag names the world kind's tokenizer and its layout.
        raise ValueError(f"{where}: trained on scene tokens {cfg.backbone.pretrained}, the tables hold "
                         f"{meta.pretrained}")
    mine, theirs = cfg.backbone.weights_sha256, meta.pretrained_sha256
    if same_weights and mine and theirs and mine != theirs:
        raise ValueError(f"{where}: trained on backbone weights sha256 {mine[:16]}..., the tables were encoded with "
                         f"{theirs[:16]}... ({meta.pretrained}): a retrained backbone needs a retrained adapter")


def _plain(d: dict) -> dict:
    # BertConfig.to_dict() carries bookkeeping keys that BertConfig(**d) would reject or warn about.
    drop = {"transformers_version", "architectures", "_name_or_path", "model_type", "torch_dtype", "dtype",
            "gradient_checkpointing", "output_attentions", "output_hidden_states", "return_dict"}
    return {k: v for k, v in d.items() if k not in drop and not k.startswith("_")}

