"""The encoder stage: frozen backbone (+ adapter) + quantization, as a callable class for an actor pool.

One backbone pass gives tokens and the pooled image embedding. Raw tables (no adapter) keep
the backbone tokens and add the backbone's text embedding of each caption; compressed tables
run the EDJE adapter over the tokens. Tokens are quantized on the device with the table's
codec, so only the stored bytes leave the actor. With an augment (raw tables only), each decoded
image is also encoded so transformed, in the same backbone call; its tokens and embedding travel in
the row's AUGMENTED_COLUMNS and become a row of their own at the commit (pipeline/write.py).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import pyarrow as pa
import torch

from edje.model.backbone import default_feature_layer
from edje.model.backbone_weights import pin
from edje.model.device import pick_device
from edje.model.token_encoder import COMPUTE_DTYPES
from edje.pipeline.write import AUGMENTED_COLUMNS
from edje.schemas.config import BackboneConfig, CodecConfig, from_dict
from edje.schemas.shipped import DEFAULT_BACKBONE
from edje.schemas.token_table import TableMetadata
from edje.schemas.weights import weights_sha256

OK = "ok"


@dataclass(frozen=True)
class EncoderSpec:
    """What the encoder actors build: backbone, optional adapter checkpoint, codec."""

    backbone: BackboneConfig
    adapter: Optional[str]
    quant: str
    group_size: Optional[int]
    torch_threads: int = 0
    # The arithmetic, the same on every device (ARCHITECTURE.md, "Precision"): "fp32" makes a
    # GPU-written table equal a CPU-written one within the codec's bound; "bf16" trades that for speed.
    compute_dtype: str = "fp32"
    augment: Optional[str] = None  # EncodeJobConfig.augment

    def __post_init__(self) -> None:
        if self.augment is not None and self.adapter:
            raise ValueError("augmented rows are training rows: an encoder with an adapter (serving tables) has none")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")


@dataclass(frozen=True)
class ModelInfo:
    """What the driver needs to know of the model before any actor starts."""

    image_size: int
    resize_mode: str
    meta: TableMetadata


def resolve_backbone(name: Optional[str], pretrained: Optional[str], feature_layer: Optional[str],
                     adapter: Optional[str], random_weights: bool = False) -> BackboneConfig:
    """The backbone to run: the flags, completed from (and checked against) the adapter checkpoint, and pinned to
    the hub commit and weights' sha256 they resolve to (every encoder actor then loads the same bytes)."""
    if not adapter:
        name = name or DEFAULT_BACKBONE
        return pin(BackboneConfig(name, pretrained, feature_layer or default_feature_layer(name),
                                  random_weights=random_weights))
    from edje.model.edje import read_checkpoint_config
    from edje.schemas.config import EDJEConfig

    ck = from_dict(EDJEConfig, read_checkpoint_config(adapter)["config"]).backbone
    for flag, value, want in (("--backbone", name, ck.name), ("--pretrained", pretrained, ck.pretrained),
                              ("--feature-layer", feature_layer, ck.feature_layer)):
        same = _same_weights(value, want, ck.weights_sha256) if flag == "--pretrained" else value == want
        if value is not None and not same:
            raise ValueError(f"{flag} {value!r} does not match the adapter checkpoint {adapter}, "
                             f"which was trained on {want!r}")
    # The flag names the weights where they lie on this machine; the checkpoint may record another path.
    return pin(dataclasses.replace(ck, pretrained=pretrained) if pretrained else ck)


def _same_weights(given: Optional[str], recorded: Optional[str], recorded_sha256: Optional[str] = None) -> bool:
    """Same tag, or the same weights: one file reached by another path (relative to here or to the
    repository, as shipped checkpoints record them), or a byte-identical copy, checked against the digest the
    checkpoint recorded when it has one (the recorded path may only exist on the machine that trained it)."""
    if given == recorded or given is None or recorded is None:
        return given == recorded or given is None
    digest = weights_sha256(given)
    return digest is not None and digest == (recorded_sha256 or weights_sha256(recorded))


def describe_model(spec: EncoderSpec) -> ModelInfo:
    """Build the model once (on CPU) to learn its input size and the output table's metadata."""
    from edje.model.backbone import VisionBackbone

    backbone = VisionBackbone.create(spec.backbone)
    n, d = backbone.token_shape
    adapter_hash = None
    if spec.adapter:
        adapter, adapter_hash = _load_adapter(spec.adapter)
        if adapter.config.input_dim != d:
            raise ValueError(f"adapter {spec.adapter} takes {adapter.config.input_dim}-wide tokens, "
                             f"backbone {spec.backbone.name} gives {d}")
        n, d = adapter.config.output_tokens(n), adapter.config.output_dim
    meta = TableMetadata(
        kind="compressed" if spec.adapter else "raw", backbone=spec.backbone.name,
        pretrained=spec.backbone.pretrained, feature_layer=spec.backbone.feature_layer,
        num_tokens=int(n), width=int(d), quantization=spec.quant, embed_dim=int(backbone.embed_dim),
        group_size=spec.group_size, adapter_hash=adapter_hash, compute_dtype=spec.compute_dtype,
        pretrained_sha256=spec.backbone.weights_sha256 or weights_sha256(spec.backbone.pretrained),
        backbone_revision=spec.backbone.revision, backbone_random_weights=spec.backbone.random_weights,
        augment=spec.augment,
    )
    meta.codec  # noqa: B018 - raises CodecError now if the quantization does not fit the width
    return ModelInfo(backbone.preprocess.size, backbone.preprocess.resize_mode, meta)


def _load_adapter(path: str):
    from edje.model.edje import load_checkpoint

    model = load_checkpoint(path)
    adapter = model.adapter.eval().requires_grad_(False)
    return adapter, model.adapter_hash()


class EncodeBatch:
    """Ray Data callable class: decoded images -> quantized token blobs + embeddings (pyarrow)."""

    def __init__(self, spec: EncoderSpec):
        from edje.model.token_encoder import TokenEncoder

        started = time.time()
        threads = spec.torch_threads or _assigned_cpus()
        torch.set_num_threads(max(1, threads))
        adapter = _load_adapter(spec.adapter)[0] if spec.adapter else None
        self.encoder = TokenEncoder.create(spec.backbone, adapter, CodecConfig(spec.quant, spec.group_size),
                                           pick_device(None), spec.compute_dtype)
        self.with_text = adapter is None  # raw tables carry captions and their text embeddings
        self.augment = spec.augment
        self.init_window = (started, time.time())

    @torch.no_grad()
    def encode_rows(self, images: np.ndarray, captions: Optional[list]) -> tuple:
        """(blob [n, bytes] uint8, scales or None, image embeddings, text embeddings or None) of ok rows; with an
        augment, of the n images and then of their n transformed copies."""
        if self.augment is not None:
            images = np.concatenate([images, augmented(images, self.augment)])
        rows = self.encoder.encode(images)
        temb = self.encoder.encode_text(captions) if self.with_text else None
        return rows.blob, rows.scales, rows.embeddings, temb

    def __call__(self, batch: Dict[str, np.ndarray]) -> pa.Table:
        """Encode the rows whose status is 'ok'; failed rows pass through with null tokens."""
        t_start = time.time()
        status = np.asarray(batch["status"], dtype=object)
        ok = np.flatnonzero(status == OK)
        b = len(status)
        blobs = [None] * b
        scales = [None] * b
        img_emb = [None] * b
        txt_emb = [None] * b
        blobs_aug, scales_aug, emb_aug = [None] * b, [None] * b, [None] * b
        if len(ok):
            texts = [str(c) for c in np.asarray(batch["caption"], dtype=object)[ok]] if self.with_text else None
            # All rows ok (the common case): the batch's array as it is, not a copy (113 MB at 256 x 384^2).
            images = batch["image"] if len(ok) == b else batch["image"][ok]
            blob, scale, emb, temb = self.encode_rows(images, texts)
            for j, i in enumerate(ok):
                blobs[i] = blob[j].tobytes()
                scales[i] = scale[j].tobytes() if scale is not None else None
                img_emb[i] = emb[j]
                if temb is not None:
                    txt_emb[i] = temb[j]
            for j, i in enumerate(ok if self.augment is not None else [], start=len(ok)):  # the copies follow
                blobs_aug[i] = blob[j].tobytes()
                scales_aug[i] = scale[j].tobytes() if scale is not None else None
                emb_aug[i] = emb[j]
        out = {k: pa.array(np.asarray(batch[k]).tolist(), t) for k, t in
               (("shard", pa.int32()), ("row", pa.int32()), ("image_id", pa.string()), ("url", pa.string()),
                ("caption", pa.string()), ("status", pa.string()), ("detail", pa.string()))}
        out["tokens"] = pa.array(blobs, pa.binary())
        out["token_scales"] = pa.array(scales, pa.binary())
        out["image_embedding"] = pa.array([None if e is None else e.tolist() for e in img_emb], pa.list_(pa.float32()))
        out["text_embedding"] = pa.array([None if e is None else e.tolist() for e in txt_emb], pa.list_(pa.float32()))
        if self.augment is not None:
            out[AUGMENTED_COLUMNS[0]] = pa.array(blobs_aug, pa.binary())
            out[AUGMENTED_COLUMNS[1]] = pa.array(scales_aug, pa.binary())
            out[AUGMENTED_COLUMNS[2]] = pa.array([None if e is None else e.tolist() for e in emb_aug],
                                                 pa.list_(pa.float32()))
        # When the encoder worked on this batch: the job's throughput over the encoder's busy window.
        out["encode_start"] = pa.array(np.full(b, t_start))
        out["encode_end"] = pa.array(np.full(b, time.time()))
        # When this actor was built: start-up is part of the job's end-to-end time.
        out["actor_init_start"] = pa.array(np.full(b, self.init_window[0]))
        out["actor_init_end"] = pa.array(np.full(b, self.init_window[1]))
        return pa.table(out)


def augmented(images: np.ndarray, augment: str) -> np.ndarray:
    """Decoded images [B, H, W, 3] so transformed: "hflip" mirrors each left-right."""
    if augment != "hflip":
        raise ValueError(f"unknown augment {augment!r}")
    return np.ascontiguousarray(images[:, :, ::-1])


def _assigned_cpus() -> int:
    """CPUs Ray gave this actor (Ray also sets OMP_NUM_THREADS to it); 1 outside Ray."""
    try:
        import ray

        if not ray.is_initialized():  # asking the runtime context would start a local Ray instance
            raise RuntimeError("not in Ray")
        return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)) or 1
    except Exception:
        return int(os.environ.get("OMP_NUM_THREADS", "1"))

