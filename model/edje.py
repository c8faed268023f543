"""The trainable EDJE model: adapter + joint encoder, and its checkpoint (safetensors + JSON config)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from typing import Optional

import fsspec
import torch
from safetensors.torch import load, save
from torch import nn

from edje.model.adapters import build_adapter
from edje.model.checkpoint_files import CONFIG, TOKENIZER, WEIGHTS, CheckpointError, local_tokenizer, read_checkpoint_config
from edje.model.joint_encoder import JointEncoder
from edje.schemas.config import EDJEConfig, from_dict, to_json


class EDJEModel(nn.Module):
    """Adapter (backbone tokens -> LM tokens) followed by the joint encoder."""

    def __init__(self, cfg: EDJEConfig, load_language_model: bool = True):
        super().__init__()
        self.config = cfg
        if cfg.adapter.kind == "compressed" and cfg.adapter.num_queries != cfg.encoder.num_image_tokens:
            raise ValueError(f"adapter emits {cfg.adapter.num_queries} tokens but the joint encoder takes "
                             f"{cfg.encoder.num_image_tokens}")
        if cfg.encoder.pointer and not cfg.adapter.cell_grid:
            raise ValueError("the pointer reads the image tokens as a grid of image cells: it needs a local adapter or "
                             "a compressed one on a query grid")
        self.adapter = build_adapter(cfg.adapter)
        self.encoder = JointEncoder(cfg.encoder, load_weights=load_language_model)
        if cfg.adapter.output_dim != self.encoder.hidden_size:
            raise ValueError(f"adapter output_dim {cfg.adapter.output_dim} != joint encoder width {self.encoder.hidden_size}")

    def score_backbone_tokens(self, texts, backbone_tokens: torch.Tensor) -> torch.Tensor:
        """ITM logits for (text, raw backbone tokens) pairs: adapter then joint encoder."""
        return self.encoder.score(texts, self.adapter(backbone_tokens))

    def adapter_hash(self) -> str:
        """Content hash of the adapter weights, stored in compressed token tables."""
        return state_hash(self.adapter)


def state_hash(module: nn.Module) -> str:
    """sha256 (16 hex) over a module's sorted parameter names, shapes and fp32 bytes."""
    return hash_state(module.state_dict())


def hash_state(state: dict) -> str:
    """The hash of `state_hash`, over a state dict (tensors of any float dtype, hashed as fp32)."""
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save_checkpoint(model: EDJEModel, path: str, extra: Optional[dict] = None,
                    dtype: Optional[torch.dtype] = None) -> None:
    """Write `config.json`, `model.safetensors` and the tokenizer to a directory (any fsspec path).

    `dtype=torch.float16` halves the file (for checkpoints shipped in the repository); loading casts
    back to the model's fp32 parameters.
    """
    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    state = {k: _cast(v.detach().cpu(), dtype).contiguous() for k, v in model.state_dict().items()}
    with fs.open(f"{root}/{WEIGHTS}", "wb") as f:
        f.write(save(_drop_tied(model, state)))
    # The hash of the weights as stored (and so as loaded): fp16 storage rounds them.
    adapter_hash = hash_state({k[len("adapter."):]: v for k, v in state.items() if k.startswith("adapter.")})
    # The tokenizer travels inside the checkpoint: record it relative to the checkpoint, never as
    # this machine's path (a venv path in a shipped config.json would name a folder nobody else has).
    meta = {"config": json.loads(to_json(_portable(model.config))), "adapter_hash": adapter_hash,
            # The BERT shape itself, so loading never needs the language model it started from.
            "bert_config": model.encoder.bert.config.to_dict(), **(extra or {})}
    with fs.open(f"{root}/{CONFIG}", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    if "file" in fs.protocol:
        model.encoder.tokenizer.save_pretrained(os.path.join(root, TOKENIZER))
    else:  # tokenizers write to local dirs only; stage and upload
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            model.encoder.tokenizer.save_pretrained(tmp)
            fs.put(tmp + "/", f"{root}/{TOKENIZER}", recursive=True)


def load_checkpoint(path: str, expected: Optional[EDJEConfig] = None, map_location: str = "cpu") -> EDJEModel:
    """Rebuild an EDJEModel from a checkpoint dir; raise CheckpointError naming any mismatch."""
    meta = read_checkpoint_config(path)
    cfg = from_dict(EDJEConfig, meta["config"])
    if expected is not None and _portable(cfg) != _portable(expected):
        raise CheckpointError(f"checkpoint {path} config differs from the expected one: {_diff(cfg, expected)}")
    fs, root = fsspec.core.url_to_fs(path)
    tokenizer_dir = local_tokenizer(fs, root)
    enc = cfg.encoder
    # Weights come from the checkpoint, so BERT is built from its config, not its pretrained files.
    bert_cfg = meta.get("bert_config") or enc.bert_config
    if bert_cfg is None:  # checkpoints written before bert_config was recorded
        from transformers import BertConfig
        bert_cfg = BertConfig.from_pretrained(enc.language_model).to_dict()
    local = EDJEConfig(cfg.backbone, cfg.adapter, replace(enc, language_model=None, tokenizer=tokenizer_dir, bert_config=bert_cfg))
    model = EDJEModel(local, load_language_model=False)
    # In memory the tokenizer is the checkpoint's own copy on this machine (a student built from this
    # encoder's config, as distillation does, loads it from there).
    model.config = replace(cfg, encoder=replace(cfg.encoder, tokenizer=tokenizer_dir))
    with fs.open(f"{root}/{WEIGHTS}", "rb") as f:
        state = load(f.read())
    load_state(model, state, path)
    return model.to(map_location).eval()


def load_state(module: nn.Module, state: dict, where: str) -> None:
    """load_state_dict(strict) with a message that names the missing, unexpected or misshapen key."""
    own = module.state_dict()
    # A tied weight (BERT's MLM decoder = its word embeddings) is stored once, under its first name.
    tied = {k for group in _tied_groups(module) for k in group[1:] if group[0] in state}
    missing = sorted(set(own) - set(state) - tied)
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{where}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    for k, v in sorted(state.items()):  # sorted: the same key is named every time
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(f"{where}: {k} has shape {list(v.shape)}, the config expects {list(own[k].shape)}")
    module.load_state_dict(state, strict=False)  # every key was checked above; tied ones follow their twin


def _cast(t: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def _tied_groups(module: nn.Module) -> list:
    """Names of state-dict entries that share one storage, each group in state-dict order."""
    groups: dict = {}
    for k, v in module.state_dict(keep_vars=True).items():
        groups.setdefault((v.data_ptr(), v.numel(), tuple(v.shape)), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def _drop_tied(model: nn.Module, state: dict) -> dict:
    # safetensors refuses shared storage, and a copy would double the largest matrix: keep the first name.
    drop = {k for group in _tied_groups(model) for k in group[1:]}
    return {k: v for k, v in state.items() if k not in drop}


def _portable(cfg: EDJEConfig) -> EDJEConfig:
    """The config as stored: the tokenizer is the checkpoint's own copy, the language model only named."""
    lm = cfg.encoder.language_model
    if lm and os.path.isabs(lm):
        lm = os.path.basename(os.path.normpath(lm))
    return replace(cfg, encoder=replace(cfg.encoder, tokenizer=TOKENIZER, language_model=lm))


def _diff(a: EDJEConfig, b: EDJEConfig) -> str:
    da, db = json.loads(to_json(a)), json.loads(to_json(b))
    diffs = []
    for part in da:
        for k in set(da[part]) | set(db[part]):
            if da[part].get(k) != db[part].get(k):
                diffs.append(f"{part}.{k}: {da[part].get(k)!r} != {db[part].get(k)!r}")
    return "; ".join(diffs)
