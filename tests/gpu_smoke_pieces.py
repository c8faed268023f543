"""What the GPU smoke's stages (tests/test_gpu_smoke.py) share: the work folder with its sample world and what each
stage leaves for the next, EncodeBatch over the world's splits into tables, and stored tokens against a CPU fp32
reference within the stated bound.

Bound, checked per value: |stored - reference| <= codec bound(reference) + compute slack x absmax of the token.
Codec bound: fp16 2^-11 |x| + 2^-25 (half an fp16 ulp); int8 half a step, absmax / 127 / 2 x (1 + 2^-10) (the fp16
scale is rounded up by at most one fp16 ulp). Compute slack (how far the device's arithmetic may move a token from
the CPU fp32 one before it is stored): CPU 2^-20, CUDA fp32 2^-12, bf16 2^-4 (the encode actor's `compute_dtype`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
import torch

# Slack of the device's arithmetic against the CPU fp32 reference, as a share of a token's absmax.
COMPUTE_SLACK = {"cpu": 2.0 ** -20, "cuda": 2.0 ** -12, "bf16": 2.0 ** -4}
# The sample world and torch CPU threads per device: the CPU runs the small one (what a CI machine affords).
SIZES = {"cpu": dict(train=32, test=16, image_size=64, threads=1),
         "cuda": dict(train=64, test=32, image_size=128, threads=4)}
ENCODE_BATCH = 16  # images per EncodeBatch call
TRAIN_STEPS = 20
# The joint encoder the smoke trains: a 2-layer, 64-wide BERT (random weights), small enough for the CPU.
SMALL_BERT = (("hidden_size", 64), ("num_hidden_layers", 2), ("num_attention_heads", 2), ("intermediate_size", 128))


@dataclass
class SmokeWork:
    """The stages' folder, device and sample world, and what each stage leaves for the next (None until it has)."""

    root: Path
    device: torch.device
    compute_dtype: str
    threads: int
    world: Any
    raw_tables: Optional[List[str]] = None
    checkpoint: Optional[str] = None
    int8_table: Optional[str] = None

    @property
    def slack(self) -> float:
        """The compute slack of this device and arithmetic (see the module's docstring)."""
        return COMPUTE_SLACK["bf16" if self.compute_dtype == "bf16" else self.device.type]

    def need(self, name: str, stage: str):
        """An earlier stage's output; skips, naming that stage, when it failed or did not run."""
        value = getattr(self, name)
        if value is None:
            pytest.skip(f"needs the {name.replace('_', ' ')} of {stage}, which failed before leaving it or did not run")
        return value


def make_work(root: Path, device: torch.device, compute_dtype: str) -> SmokeWork:
    """A work folder with a small sample world sized for the device."""
    from edje.sampleworld.world import WorldConfig, generate

    size = SIZES[device.type]
    world = generate(WorldConfig(seed=17, n_train=size["train"], n_val=0, n_test=size["test"],
                                 image_size=size["image_size"]), root / "world")
    return SmokeWork(root, device, compute_dtype, size["threads"], world)


def encoder_spec(work: SmokeWork, adapter: Optional[str], quant: str):
    """The encode actor's spec: the shipped small backbone [+ an adapter checkpoint], a codec, the arithmetic."""
    from edje.pipeline.encode import EncoderSpec

    return EncoderSpec(shipped_backbone(), adapter, quant, None, torch_threads=work.threads,
                       compute_dtype=work.compute_dtype)


def shipped_backbone():
    """The shipped small backbone (checkpoints/edje-tiny-convvit-sw.safetensors) at its default feature layer."""
    from edje.model.backbone import default_feature_layer
    from edje.schemas.config import BackboneConfig
    from edje.schemas.shipped import DEFAULT_BACKBONE
    from edje.schemas.weights import find_weights

    return BackboneConfig(DEFAULT_BACKBONE, find_weights(backbone=DEFAULT_BACKBONE), default_feature_layer(DEFAULT_BACKBONE))


def split_images(work: SmokeWork, split: str, size: int, resize_mode: str):
    """(image ids, first captions, decoded uint8 images [N, S, S, 3]) of a split, as the decode stage makes them."""
    from edje.model.image_decode import decode_image

    recs = [r for r in work.world.images if r.split == split]
    pixels = np.stack([decode_image((work.world.root / r.image).read_bytes(), size, resize_mode) for r in recs])
    return [r.image_id for r in recs], [r.captions[0] for r in recs], pixels


def encode_splits(work: SmokeWork, spec, shards: Dict[int, str], output: Path):
    """EncodeBatch over the shards' images (shard id -> split), written and committed by pipeline/write.py:
    (the actor, shard id -> (ids, pixels), committed table paths)."""
    import edje.pipeline.encode as encode_module
    from edje.model.device import pick_device
    from edje.pipeline.write import commit_shard, write_parts

    info = encode_module.describe_model(spec)
    with pytest.MonkeyPatch.context() as mp:
        # EncodeBatch runs on the GPU its Ray actor was given (pick_device(None): cuda whenever one is visible, as
        # Ray hides the rest). In-process nothing hides a GPU, so the smoke's device stands in for those resources.
        mp.setattr(encode_module, "pick_device", lambda name=None: pick_device(work.device if name is None else name))
        actor = encode_module.EncodeBatch(spec)
    placed = next(actor.encoder.backbone.parameters()).device
    assert placed.type == work.device.type, f"EncodeBatch's backbone on {placed}, expected {work.device}"
    data, tables = {}, []
    for sid, split in shards.items():
        ids, caps, pixels = split_images(work, split, info.image_size, info.resize_mode)
        data[sid] = (ids, pixels)
        parts = []
        for lo in range(0, len(ids), ENCODE_BATCH):
            n = len(ids[lo:lo + ENCODE_BATCH])
            batch = {"status": np.array(["ok"] * n, dtype=object), "image": pixels[lo:lo + n],
                     "caption": np.array(caps[lo:lo + n], dtype=object), "shard": np.full(n, sid, np.int32),
                     "row": np.arange(lo, lo + n, dtype=np.int32), "image_id": np.array(ids[lo:lo + n], dtype=object),
                     "url": np.array([f"file://{i}" for i in ids[lo:lo + n]], dtype=object),
                     "detail": np.array([""] * n, dtype=object)}
            parts += write_parts(actor(batch), str(output)).column("part").to_pylist()
        stats = commit_shard(str(output), sid, parts, len(ids), info.meta.to_bytes().decode())
        assert stats["images_ok"] == len(ids), f"shard {sid}: {stats['images_ok']} of {len(ids)} rows committed"
        tables.append(stats["table"])
    return actor, data, tables


def assert_near_reference(work: SmokeWork, table_path: str, ids, pixels, adapter=None) -> str:
    """Stored tokens and embeddings vs a CPU fp32 reference (backbone [+ adapter]) within the stated bound; a line
    of detail."""
    from edje.model.backbone import VisionBackbone
    from edje.schemas.token_table import decode_tokens, read_token_table, vector_matrix

    table, meta = read_token_table(table_path)
    order = {x: i for i, x in enumerate(table.column("image_id").to_pylist())}
    rows = np.array([order[i] for i in ids])
    stored = decode_tokens(table, meta)[rows]
    emb = vector_matrix(table.column("image_embedding"))[rows]
    with torch.no_grad():
        ref, ref_emb = VisionBackbone.create(shipped_backbone(), device="cpu").encode(torch.from_numpy(pixels))
        if adapter is not None:
            ref = adapter(ref)
    ref, ref_emb = ref.float().numpy(), ref_emb.numpy()
    absmax = np.abs(ref).max(axis=-1, keepdims=True)
    assert meta.quantization in ("fp16", "int8"), f"no stated bound for {meta.quantization} here"
    if meta.quantization == "fp16":
        codec = np.abs(ref) * 2.0 ** -11 + 2.0 ** -25
    else:
        codec = absmax / 127 / 2 * (1 + 2.0 ** -10) + absmax * 2.0 ** -20
    bound = codec + work.slack * absmax
    err = np.abs(stored - ref)
    excess = float((err - bound).max())
    assert excess <= 0, f"{meta.quantization} tokens off the CPU reference by {excess:.3g} beyond the bound"
    emb_err = float(np.abs(emb - ref_emb).max())
    assert emb_err <= work.slack * 4, f"image embeddings off the CPU reference by {emb_err:.3g}"
    return (f"{len(ids)} images, {meta.num_tokens}x{meta.width} {meta.quantization}, worst err/bound "
            f"{float((err / bound).max()):.3f}, embedding err {emb_err:.2g}")
