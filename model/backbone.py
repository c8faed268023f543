"""Frozen vision backbone over open_clip: per-patch tokens, pooled image embedding, text embedding.

Works for both open_clip tower kinds: the native VisionTransformer and timm-based towers
(SigLIP2), through open_clip's own `forward_intermediates`. The project's small configs in
`model/configs/` are registered with open_clip on import, so they are created by name like
any built-in model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edje.model.backbone_registry import open_clip_registry
from edje.model.backbone_weights import model_config, resolve
from edje.schemas.config import BackboneConfig


def default_feature_layer(name: str, revision: Optional[str] = None) -> str:
    """Which tokens EDJE reads by default: "penultimate" for towers that pool a class token
    (CLIP: the final patch outputs are never trained under class-token pooling, as the paper
    notes), "final" for towers that pool over all tokens (SigLIP2's MAP head, mean pooling).
    An hf-hub name is judged by its repository's open_clip_config.json, fetched as the environment allows."""
    return feature_layer_of(model_config(name, revision))


def feature_layer_of(cfg: dict) -> str:
    """The default token layer of an open_clip model config (see default_feature_layer)."""
    vision = cfg.get("vision_cfg", {})
    if "timm_model_name" in vision:
        pool = vision.get("timm_pool", "avg")
        if pool in ("", None):  # the trunk's own pooling
            import timm

            open_clip_registry()  # registers the project's timm towers by name
            pool = getattr(timm.create_model(vision["timm_model_name"], pretrained=False), "global_pool", "avg")
        return "penultimate" if pool == "token" else "final"
    if not vision:
        return "final"  # no open_clip config at all: SigLIP2-style towers read final tokens
    pooled_tokens = vision.get("attentional_pool", False) or vision.get("pool_type", "tok") in ("avg", "none")
    return "final" if pooled_tokens else "penultimate"


def is_hf_text(clip: nn.Module) -> bool:
    """Whether an open_clip model's text tower is a Hugging Face transformer (open_clip's HFTextEncoder)."""
    from open_clip.hf_model import HFTextEncoder

    return isinstance(getattr(clip, "text", None), HFTextEncoder)


def trim_padding(clip: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Token ids [B, L] without the trailing columns every row pads, for an HF text tower (its attention mask is read
    from the pad id, so each embedding is the same): a batch then costs its longest caption, not the context length.
    Other text towers' ids come back as they are (theirs pool at a fixed position and a causal mask of full length)."""
    if not is_hf_text(clip) or ids.ndim != 2:
        return ids
    used = (ids != clip.text.config.pad_token_id).any(0).nonzero()
    return ids[:, :int(used.max()) + 1] if len(used) else ids[:, :1]


def text_embeddings_of_ids(clip: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Normalised float text embeddings [B, e] of token ids through an open_clip model, its padding trimmed first."""
    return F.normalize(clip.encode_text(trim_padding(clip, ids)).float(), dim=-1)


@dataclass(frozen=True)
class PreprocessConfig:
    """What the model expects of an image: square size, normalisation, resize mode."""

    size: int
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"


class VisionBackbone(nn.Module):
    """A frozen open_clip model exposing `encode_tokens`, `encode_image`, `encode_text`."""

    def __init__(self, clip: nn.Module, cfg: BackboneConfig, open_clip_name: Optional[str] = None):
        super().__init__()
        self.config = cfg
        # The name open_clip knows the model by here (an hf-hub repository's local snapshot): its tokenizer's source.
        self.open_clip_name = open_clip_name or cfg.name
        self.clip = clip.eval().requires_grad_(False)
        self.visual = clip.visual
        self.is_timm = hasattr(self.visual, "trunk")
        open_clip = open_clip_registry()
        pp = open_clip.get_model_preprocess_cfg(clip)
        size = pp.get("size", 224)
        size = size[0] if isinstance(size, (tuple, list)) else size
        self.preprocess = PreprocessConfig(
            size=int(size), mean=tuple(pp.get("mean", open_clip.OPENAI_DATASET_MEAN)),
            std=tuple(pp.get("std", open_clip.OPENAI_DATASET_STD)),
            interpolation=pp.get("interpolation", "bicubic"), resize_mode=pp.get("resize_mode", "shortest"),
        )
        self._tokenizer = None
        self._query_towers: list = []  # (VisionBackbone, weight): see join_query_towers
        blocks = self.visual.trunk.blocks if self.is_timm else self.visual.transformer.resblocks
        self.num_blocks = len(blocks)
        # Buffers and the probe live where the weights already are: open_clip.create_model(device=...)
        # has moved them, and a CPU probe against CUDA weights crashed every GPU encode worker.
        device = next(clip.parameters()).device
        self.register_buffer("_mean", torch.tensor(self.preprocess.mean, device=device).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("_std", torch.tensor(self.preprocess.std, device=device).view(1, 3, 1, 1),
                             persistent=False)
        with torch.no_grad():
            probe = self.encode(torch.zeros(1, 3, self.preprocess.size, self.preprocess.size, device=device))
        self.num_tokens, self.width = probe[0].shape[1:]
        self.embed_dim = probe[1].shape[1]
        self.eval()

    def train(self, mode: bool = True) -> "VisionBackbone":
        """Frozen: stays in eval mode whatever a surrounding trainer asks."""
        return super().train(False)

    @classmethod
    def create(cls, cfg: BackboneConfig, device: str | torch.device = "cpu") -> "VisionBackbone":
        """Build from what `cfg` names (a registry name with a tag or a local file, an hf-hub repository, or random
        weights), at its recorded hub commit and checked against its recorded sha256 (model/backbone_weights.py)."""
        r = resolve(cfg)
        open_clip = open_clip_registry()
        if r.weights_file is None or r.open_clip_name.startswith("local-dir:"):
            # Random weights are random: no tower's weights are fetched (open_clip would load an HF text tower's
            # by default), and a repository's weights are the resolved file, not whatever its folder holds.
            clip = open_clip.create_model(r.open_clip_name, load_weights=False, pretrained_text=False,
                                          force_preprocess_cfg=r.preprocess or None, device=device)
            if r.weights_file is not None:
                open_clip.load_checkpoint(clip, r.weights_file)
        else:
            clip = open_clip.create_model(r.open_clip_name, pretrained=r.weights_file,
                                          force_preprocess_cfg=r.preprocess or None, device=device)
        return cls(clip, cfg, r.open_clip_name).to(device)

    @property
    def token_shape(self) -> Tuple[int, int]:
        """(n, d) of one image's token matrix."""
        return int(self.num_tokens), int(self.width)

    @property
    def tokenizer(self):
        # Lazy: SigLIP2 tokenizers come from a hub; timing the image tower must not need one.
        if self._tokenizer is None:
            self._tokenizer = open_clip_registry().get_tokenizer(self.open_clip_name)
        return self._tokenizer

    # ------------------------------------------------------------ images
    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] or float [B, 3, H, W] in [0, 1] -> normalised float [B, 3, S, S]."""
        x = self._check_images(images)
        return self._normalize(x)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.permute(0, 3, 1, 2).float().div_(255.0)
        s = self.preprocess.size
        if x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bicubic", align_corners=False).clamp_(0, 1)
        return (x - self._mean) / self._std

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One pass: (tokens [B, n, d] at the configured layer, normalised pooled embedding [B, e])."""
        x = self._model_input(images)
        final = self.config.feature_layer == "final"
        index = self.num_blocks - 1 if final else self.num_blocks - 2
        out = self.visual.forward_intermediates(
            x.to(self._mean.dtype), indices=[index], normalize_intermediates=final,
            output_fmt="NLC", output_extra_tokens=True,
        )
        tokens = out["image_intermediates"][0]
        prefix = out.get("image_intermediates_prefix")
        if prefix is not None and prefix[0] is not None and prefix[0].shape[1]:
            tokens = torch.cat([prefix[0], tokens], dim=1)
        return tokens, F.normalize(out["image_features"].float(), dim=-1)

    def encode_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Per-patch tokens [B, n, d] (final post-norm by default, or the penultimate block)."""
        return self.encode(images)[0]

    @torch.no_grad()
    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised pooled image embedding [B, e] (the first stage)."""
        x = self._model_input(images)
        return F.normalize(self.clip.encode_image(x.to(self._mean.dtype)).float(), dim=-1)

    @torch.no_grad()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """Normalised text embedding [B, e] (the recovery target and the first-stage query)."""
        if isinstance(texts, str) or any(not isinstance(t, str) for t in texts):
            raise TypeError("encode_text takes a list of strings")
        own = text_embeddings_of_ids(self.clip, self.tokenizer(list(texts)).to(self._mean.device))
        if not self._query_towers:
            return own
        return F.normalize(own + sum(w * t.encode_text(texts).to(own.device) for t, w in self._query_towers), dim=-1)

    def join_query_towers(self, towers: Sequence, checkpoint: Optional[str] = None) -> "VisionBackbone":
        """This backbone with other text towers (model/ranking.py QueryTower) joining its text embeddings:
        normalise(own + the sum of each tower's weight x its unit embedding). A tower must share this image tower
        (as `edje distill-text-tower`'s students do), checked on a probe image; its own copy is then dropped.
        Weight files are found as every job finds them (beside `checkpoint` first)."""
        if not towers:
            return self
        size = self.preprocess.size
        probe = (torch.arange(size * size * 3) * 7919 % 251).to(torch.uint8).view(1, size, size, 3)
        mine = self.encode_image(probe)
        for t in towers:
            tower = VisionBackbone.create(t.backbone_config(checkpoint), device=self._mean.device)
            if tower.embed_dim != self.embed_dim or not torch.allclose(tower.encode_image(probe), mine, atol=1e-4):
                raise ValueError(f"query tower {t.name} ({t.pretrained}) embeds images otherwise than the backbone "
                                 f"{self.config.name} ({self.config.pretrained}): a query tower must share its image "
                                 f"tower, as a student of `edje distill-text-tower` does")
            tower.clip.visual = tower.visual = None  # only its text tower is read
            self._query_towers.append((tower, float(t.weight)))
        return self

    def _model_input(self, images) -> torch.Tensor:
        """uint8 [B, H, W, 3] images are normalised here; float [B, 3, S, S] are taken as already normalised."""
        x = self._check_images(images)
        if x.dtype == torch.uint8:
            return self._normalize(x)
        s = self.preprocess.size
        if tuple(x.shape[-2:]) != (s, s):
            raise ValueError(f"normalised float images must be [B, 3, {s}, {s}], got {list(x.shape)}")
        return x

    def _check_images(self, images) -> torch.Tensor:
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(images)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise ValueError(f"images must be a 4-d tensor, got {getattr(images, 'shape', type(images).__name__)}")
        if images.dtype == torch.uint8:
            if images.shape[-1] != 3:
                raise ValueError(f"uint8 images must be [B, H, W, 3], got {list(images.shape)}")
        elif images.is_floating_point():
            if images.shape[1] != 3:
                raise ValueError(f"float images must be [B, 3, H, W], got {list(images.shape)}")
        else:
            raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")
        return images.to(self._mean.device)

