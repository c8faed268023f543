"""ELIP re-ranking baseline (Zhan et al., "ELIP: Enhanced Visual-Language Foundation Models for Image
Retrieval"): text-guided visual prompts for a frozen dual encoder.

An MLP maps the query's text embedding to `num_prompts` vectors in the image tower's token space;
they are prepended to the image's tokens after patch and position embedding, before the first
transformer block (VPT-shallow), and the first stage's top k are re-encoded per query. The score
is the cosine of the prompted image embedding with the query's text embedding. The backbone stays
frozen: only the mapping network trains (research/elip_training.py).

The prompted pass re-runs the timm trunk's own pieces in `VisionTransformer.forward_features`
order (patch_embed, _pos_embed, patch_drop, norm_pre | blocks, norm) and then its own
`forward_head` and open_clip's head, so with no prompts it *is* the backbone's image embedding.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from edje.model.backbone import VisionBackbone
from edje.schemas.config import BackboneConfig

WEIGHTS = "mapper.safetensors"
CONFIG = "elip.json"


@dataclass(frozen=True)
class ELIPConfig:
    """The frozen backbone and the mapping network's shape."""

    backbone: str = "edje-tiny-convvit"
    pretrained: Optional[str] = "checkpoints/edje-tiny-convvit-sw.safetensors"
    num_prompts: int = 10  # ELIP's choice (its Table 5: 10 prompts beat 1, 2 and 5)
    hidden_dim: int = 512
    # ELIP maps the text alone, so a query's candidates all get the same prompts and their cosines move
    # together; per candidate, the mapper reads [t, v, t * v] with v the candidate's unprompted embedding.
    per_candidate: bool = False

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")

    def backbone_config(self) -> BackboneConfig:
        """The backbone as the rest of the project names it."""
        return BackboneConfig(self.backbone, self.pretrained, feature_layer="final")


def timm_trunk(backbone: VisionBackbone) -> nn.Module:
    """The timm VisionTransformer inside an open_clip timm tower; TypeError for other towers."""
    trunk = getattr(backbone.visual, "trunk", None)
    if trunk is None or not all(hasattr(trunk, a) for a in ("patch_embed", "_pos_embed", "blocks", "forward_head")):
        raise TypeError(f"ELIP prompting needs an open_clip timm ViT tower, got {type(backbone.visual).__name__}")
    if getattr(trunk, "dynamic_img_size", False) or getattr(trunk, "grad_checkpointing", False):
        # forward_features would take other paths (pos-embed resampling, checkpoint_seq) than the ones re-run here
        raise TypeError("ELIP prompting supports fixed-size timm ViTs without gradient checkpointing")
    return trunk


def patch_tokens(backbone: VisionBackbone, images: torch.Tensor) -> torch.Tensor:
    """Tokens entering the first block [N, n, d]: patch embed + position embed (+ prefix tokens), per image.

    They do not depend on the query, so a reranker computes them once per image."""
    trunk = timm_trunk(backbone)
    x = backbone._model_input(images).to(backbone._mean.dtype)
    return trunk.norm_pre(trunk.patch_drop(trunk._pos_embed(trunk.patch_embed(x))))


def encode_prompted(backbone: VisionBackbone, tokens: torch.Tensor, prompts: Optional[torch.Tensor]) -> torch.Tensor:
    """Normalised image embedding [B, e] of tokens [B, n, d] with prompts [B, P, d] prepended (None: no prompts)."""
    trunk = timm_trunk(backbone)
    x = tokens if prompts is None else torch.cat([prompts.to(tokens.dtype), tokens], dim=1)
    x = trunk.norm(trunk.blocks(x))
    if prompts is not None:
        # The prompts act through attention only: their outputs are dropped before pooling, as ELIP reads
        # CLIP's class token. Under this tower's mean pooling they would otherwise write text into the embedding.
        x = x[:, prompts.shape[1]:]
    return F.normalize(backbone.visual.head(trunk.forward_head(x)).float(), dim=-1)


class PromptMapper(nn.Module):
    """ELIP's mapping network: three linear layers with a GELU between each two, text embedding -> prompts.

    Each prompt is RMS-normalised and scaled to the RMS of the image tokens beside it (`token_rms`, set from
    training images by `ELIPReranker.match_token_scale`). A plain MLP at PyTorch's default init gives prompts
    ~20x smaller than the tokens, and on a two-family batch its loss barely moved in 12 steps; at the tokens'
    scale it fell steadily (tests/test_elip.py)."""

    def __init__(self, text_dim: int, width: int, num_prompts: int, hidden_dim: int):
        super().__init__()
        self.num_prompts, self.width = num_prompts, width
        self.net = nn.Sequential(nn.Linear(text_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim),
                                 nn.GELU(), nn.Linear(hidden_dim, num_prompts * width))
        self.register_buffer("token_rms", torch.tensor(1.0))  # saved with the weights

    def forward(self, text_emb: torch.Tensor) -> torch.Tensor:
        """[Q, e] -> [Q, P, d]."""
        prompts = self.net(text_emb).view(-1, self.num_prompts, self.width)
        return F.rms_norm(prompts, (self.width,)) * self.token_rms


class ELIPReranker(nn.Module):
    """Frozen backbone + trainable mapping network: scores (query, image) pairs by prompted re-encoding."""

    def __init__(self, cfg: ELIPConfig, backbone: Optional[VisionBackbone] = None):
        super().__init__()
        self.config = cfg
        self.backbone = backbone if backbone is not None else VisionBackbone.create(cfg.backbone_config())
        timm_trunk(self.backbone)  # fail at construction, not at the first batch
        e = self.backbone.embed_dim
        self.mapper = PromptMapper(3 * e if cfg.per_candidate else e, self.backbone.width, cfg.num_prompts, cfg.hidden_dim)

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Query-independent input tokens of images (uint8 [N, H, W, 3] or normalised float)."""
        with torch.no_grad():
            return patch_tokens(self.backbone, images)

    @torch.no_grad()
    def match_token_scale(self, tokens: torch.Tensor) -> float:
        """Set the prompts' scale to the RMS of input tokens [N, n, d] of training images; returns it."""
        self.mapper.token_rms.fill_(tokens.float().pow(2).mean().sqrt().item())
        return float(self.mapper.token_rms)

    def prompted_embeddings(self, text_emb: torch.Tensor, tokens: torch.Tensor,
                            image_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Each query's prompted embedding of its candidates: text [Q, e], tokens [Q, C, n, d] -> [Q, C, e].
        `image_emb` [Q, C, e]: the candidates' unprompted embeddings, read by a per-candidate mapper (computed
        from the tokens when not given)."""
        q, c = tokens.shape[:2]
        if self.config.per_candidate:
            if image_emb is None:
                with torch.no_grad():
                    image_emb = encode_prompted(self.backbone, tokens.flatten(0, 1), None).view(q, c, -1)
            t = F.normalize(text_emb.float(), dim=-1).unsqueeze(1).expand(q, c, -1)
            v = image_emb.float()
            prompts = self.mapper(torch.cat([t, v, t * v], dim=-1).flatten(0, 1))
        else:
            prompts = self.mapper(text_emb).repeat_interleave(c, dim=0)  # one prompt set per (query, candidate)
        return encode_prompted(self.backbone, tokens.flatten(0, 1), prompts).view(q, c, -1)

    def score(self, text_emb: torch.Tensor, tokens: torch.Tensor, image_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        """ELIP's re-ranking score: cosine of text [Q, e] with its prompted candidates [Q, C, n, d] -> [Q, C]."""
        return torch.einsum("qe,qce->qc", F.normalize(text_emb.float(), dim=-1),
                            self.prompted_embeddings(text_emb, tokens, image_emb))

    def train(self, mode: bool = True) -> "ELIPReranker":
        """Only the mapper trains; the backbone stays in eval mode (its BatchNorm stem included)."""
        super().train(mode)
        self.backbone.train(False)
        return self

    def save(self, folder: str | Path, record: Optional[dict] = None) -> Path:
        """Write the mapper's weights (safetensors) and the config + run record (JSON) to `folder`."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.mapper.state_dict().items()}, str(out / WEIGHTS))
        (out / CONFIG).write_text(json.dumps({"config": asdict(self.config), **(record or {})}, indent=2) + "\n")
        return out


def load_elip(folder: str | Path, backbone: Optional[VisionBackbone] = None,
              pretrained: Optional[str] = None) -> ELIPReranker:
    """An ELIPReranker from a folder written by `ELIPReranker.save`; `pretrained` overrides the recorded backbone
    weights' path (a moved or frozen copy of the same backbone: the mapper was trained on that one)."""
    folder = Path(folder)
    cfg = ELIPConfig(**json.loads((folder / CONFIG).read_text())["config"])
    if pretrained:
        cfg = replace(cfg, pretrained=pretrained)
    model = ELIPReranker(cfg, backbone)
    model.mapper.load_state_dict(load_file(str(folder / WEIGHTS)))
    return model.eval()
