"""Raw token tables straight from an annotation file (in-process, no Ray): for evaluation sets and
small training sets. The encode pipeline (jobs/encode_cc12m.py) is the distributed writer; this one
exists for annotation files whose images are already on disk, and can write one row per caption.

`--scene-tokens WORLD` writes the sample world's perfect scene tokens (its kind's painter,
sampleworld/scene_token_grid.py; a diagnostic ceiling) in place of the backbone's; embeddings stay
the backbone's, so the first stage is unchanged, and the metadata names the token source so no job
mistakes one for the other. `--backbone` defaults to the one shipped for the sample world's kind (world.json
beside the annotation file): an open world's tables are its own backbone's without naming it.

  python -m edje.evaluation.tables --annotations world/flickr30k_test.json --backbone edje-tiny-convvit \
      --pretrained checkpoints/edje-tiny-convvit-sw.safetensors --output runs/test_raw.parquet
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal, Optional

import fsspec
import numpy as np
import torch

from edje.model.backbone import VisionBackbone, default_feature_layer
from edje.model.backbone_weights import pin
from edje.model.image_decode import load_image_files
from edje.model.token_encoder import TokenEncoder
from edje.sampleworld.registry import world_kind
from edje.sampleworld.scene_token_grid import SCENE_TOKENS_BACKBONE, SceneTokenConfig
from edje.sampleworld.world import WORLD_JSON, load_world, load_world_config
from edje.schemas.annotations import load_annotations
from edje.schemas.config import BackboneConfig, CodecConfig
from edje.schemas.shipped import WORLD_BACKBONES
from edje.schemas.token_table import TableMetadata, build_table, write_token_table
from edje.schemas.weights import find_weights, weights_sha256


def encode_annotations(annotations: str, backbone: VisionBackbone, output: str,
                       rows: Literal["image", "caption"] = "image", batch_size: int = 128,
                       scene_tokens: Optional[str] = None) -> int:
    """Write a raw token table (fp16 tokens, embeddings, caption + text embedding); returns its row count.

    rows="image": one row per image with its first caption; rows="caption": one row per caption.
    scene_tokens: a sample world's directory; its perfect scene tokens replace the backbone's.
    """
    ann = load_annotations(annotations)
    n, d = backbone.token_shape
    b = backbone.config
    meta = TableMetadata(kind="raw", backbone=b.name, pretrained=b.pretrained,
                         feature_layer=b.feature_layer, num_tokens=n, width=d,
                         quantization="fp16", embed_dim=backbone.embed_dim,
                         pretrained_sha256=b.weights_sha256 or weights_sha256(b.pretrained),
                         backbone_revision=b.revision, backbone_random_weights=b.random_weights)
    encoder = TokenEncoder(backbone, None, CodecConfig("fp16"), torch.device("cpu"))
    tokens, embs = [], []
    for i in range(0, ann.num_images, batch_size):
        t, e = encoder.tokens(torch.from_numpy(load_image_files(ann.image_paths[i:i + batch_size])))
        tokens.append(t.numpy())
        embs.append(e.numpy())
    tokens, embs = np.concatenate(tokens), np.concatenate(embs)
    if scene_tokens is not None:
        tokens, meta = perfect_tokens(scene_tokens, ann.image_ids, backbone)
    if rows == "image":
        caption_rows = np.array([caps[0] for caps in ann.image_to_captions()])
    elif rows == "caption":
        caption_rows = np.arange(len(ann.captions))
    else:
        raise ValueError(f"rows must be 'image' or 'caption', got {rows!r}")
    image_rows = ann.caption_image[caption_rows]
    captions = [ann.captions[j] for j in caption_rows]
    text = np.concatenate([backbone.encode_text(captions[i:i + 512]).numpy() for i in range(0, len(captions), 512)])
    table = build_table(meta, [ann.image_ids[i] for i in image_rows], tokens[image_rows], embs[image_rows],
                        captions=captions, text_embeddings=text)
    fs, root = fsspec.core.url_to_fs(output)
    fs.makedirs(fs._parent(root), exist_ok=True)
    write_token_table(table, output)
    return table.num_rows


def perfect_tokens(world: str, image_ids, backbone: VisionBackbone, cfg: SceneTokenConfig = SceneTokenConfig()):
    """(scene tokens [N, grid*grid, width], their table metadata) for images of a sample world of any kind."""
    manifest = load_world(world)
    by_id = manifest.by_id()
    missing = [i for i in image_ids if i not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} images are not in the world at {world} (e.g. {missing[:3]})")
    tokenizer = world_kind(manifest.config.kind).scene_tokenizer(cfg)
    meta = TableMetadata(kind="raw", backbone=SCENE_TOKENS_BACKBONE, pretrained=tokenizer.pretrained_tag,
                         feature_layer="final", num_tokens=cfg.num_tokens, width=cfg.width, quantization="fp16",
                         embed_dim=backbone.embed_dim, embedding_backbone=backbone.config.name,
                         embedding_pretrained=backbone.config.pretrained)
    return tokenizer.batch([by_id[i].scene for i in image_ids]), meta


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description="Raw token table from a Karpathy-style annotation file")
    p.add_argument("--annotations", required=True)
    p.add_argument("--backbone", default=None, help="default: the backbone shipped for the kind of sample world "
                   "whose world.json sits beside --annotations, else the shapes world's")
    p.add_argument("--pretrained", default=None,
                   help="backbone weights (default: the repository's shipped weights of --backbone; 'none': random, "
                        "on purpose)")
    p.add_argument("--feature-layer", choices=["final", "penultimate"], help="default: the backbone kind's")
    p.add_argument("--rows", default="image", choices=["image", "caption"])
    p.add_argument("--output", required=True)
    p.add_argument("--scene-tokens", metavar="WORLD", help="diagnostic: the sample world's perfect scene tokens "
                   "(from WORLD/world.json) in place of the backbone's; embeddings stay the backbone's")
    a = p.parse_args(argv)
    a.backbone = a.backbone or world_backbone(a.annotations)
    random = a.pretrained is not None and a.pretrained.lower() == "none"
    bb = VisionBackbone.create(pin(BackboneConfig(a.backbone, _weights(a.backbone, a.pretrained),
                                                  a.feature_layer or default_feature_layer(a.backbone),
                                                  random_weights=random)))
    print(f"wrote {encode_annotations(a.annotations, bb, a.output, a.rows, scene_tokens=a.scene_tokens)} rows to {a.output}")


def world_backbone(annotations: str) -> str:
    """The backbone shipped for the kind of sample world an annotation file belongs to (its world.json beside it);
    the shapes world's for any other annotation file."""
    folder = Path(annotations).parent
    kind = load_world_config(folder).kind if (folder / WORLD_JSON).exists() else "shapes"
    return WORLD_BACKBONES[kind]


def _weights(backbone: str, pretrained: Optional[str]) -> Optional[str]:
    """The weights to encode with: a table of an untrained backbone's tokens is noise that trains and evaluates
    without an error, so it is only made when asked for by name."""
    if pretrained is not None:
        return None if pretrained.lower() == "none" else pretrained
    if backbone.startswith("hf-hub:"):
        return None  # the repository's own weights
    weights = find_weights(backbone=backbone)
    if weights is None:
        raise SystemExit(f"{backbone}: the repository ships no weights for it; give --pretrained PATH "
                         "(or --pretrained none for an untrained backbone)")
    return weights


if __name__ == "__main__":
    main()
