"""Contrastive (CLIP) training of a small open_clip backbone on a Karpathy-style caption set.

Used for the embedded default: the project's own tiny backbone, trained on the sample
world. Plain PyTorch on purpose: the model is a few MB, one process trains it in minutes,
and the run is reproducible bit for bit from its config on the same thread count.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import edje.model.backbone  # noqa: F401  registers the project's open_clip configs
from edje.model.image_decode import load_image_files
from edje.model.recall import embedding_recall
from edje.sampleworld.captions import colour_caption, shape_caption
from edje.sampleworld.scene import Scene
from edje.schemas.annotations import Annotations, load_annotations
from edje.training.hard_batches import mixed_batches, neighbour_clusters, same_words_mask


@dataclass(frozen=True)
class BackboneTrainConfig:
    """What to train on, for how long, and where the fp16 safetensors checkpoint goes."""

    train_annotations: str
    output: str
    eval_annotations: Optional[str] = None
    model: str = "edje-tiny-convvit"
    epochs: int = 12
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 50
    seed: int = 0
    eval_every: int = 4  # epochs; a checkpoint is written at each evaluation
    stop_after: Optional[int] = None  # train only this many epochs of the `epochs`-long schedule
    # ELIP-style hard batches (training/hard_batches.py): this share of each batch is made of
    # clusters of `cluster_size` near neighbours in the current image embedding, from epoch
    # `neighbour_start` on (before that the embedding is too young to say what is similar).
    neighbour_fraction: float = 0.0
    cluster_size: int = 8
    neighbour_start: int = 2
    mask_same_words: bool = False  # leave captions with the same bag of words out of each other's softmax
    # A sample world's world.json, for two training-only levers: images of one family (binding
    # twins, whose captions share every word) are left out of each other's softmax, as duplicates
    # are in CLIP training; and `shape_caption_rate` of the captions are replaced by ones that name
    # only the scene's shapes (every image with that shape set is then a positive), `colour_caption_rate`
    # by ones that name only its colours (positives: the same colour set). Shape-only captions alone
    # trade colour for shape (BENCHMARKS.md): colour-only ones beside them keep colour in the embedding.
    world: Optional[str] = None
    shape_caption_rate: float = 0.0
    # The shape rate moves linearly from `shape_caption_rate` (first epoch) to this (last epoch of the
    # schedule); None keeps it constant. High early teaches shape; lower late gives full captions back.
    shape_caption_rate_end: Optional[float] = None
    colour_caption_rate: float = 0.0
    # Where to train: None/"auto" = cuda when visible, else cpu (model/device.py). Runs are reproducible
    # bit for bit per device and thread count, not across devices.
    device: Optional[str] = None


def preprocess(clip: torch.nn.Module, images_u8: np.ndarray) -> torch.Tensor:
    """uint8 [N, S, S, 3] -> normalised float [N, 3, S, S] with the model's own mean/std."""
    pp = open_clip.get_model_preprocess_cfg(clip)
    mean = torch.tensor(pp.get("mean", open_clip.OPENAI_DATASET_MEAN)).view(1, 3, 1, 1)
    std = torch.tensor(pp.get("std", open_clip.OPENAI_DATASET_STD)).view(1, 3, 1, 1)
    x = torch.from_numpy(images_u8).permute(0, 3, 1, 2).float().div_(255.0)
    return (x - mean) / std


def image_size(clip: torch.nn.Module) -> int:
    """Square input size of the model's image tower."""
    size = open_clip.get_model_preprocess_cfg(clip).get("size", 224)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


@torch.no_grad()
def zero_shot_recall(clip: torch.nn.Module, tokenizer, ann: Annotations, images: torch.Tensor, batch: int = 512) -> Dict:
    """T2I and I2T R@1/5/10 of the model's own embeddings on an annotation set."""
    clip.eval()
    img = torch.cat([F.normalize(clip.encode_image(images[i:i + batch]), dim=-1) for i in range(0, len(images), batch)])
    txt = torch.cat([F.normalize(clip.encode_text(tokenizer(ann.captions[i:i + batch]).to(images.device)), dim=-1)
                     for i in range(0, len(ann.captions), batch)])
    return embedding_recall(txt.cpu().numpy(), img.cpu().numpy(), ann.caption_image)


def caption_rates(cfg: BackboneTrainConfig, epoch: int) -> tuple:
    """(shape-only, colour-only) caption rates of a 0-based epoch under the config's schedule."""
    end = cfg.shape_caption_rate if cfg.shape_caption_rate_end is None else cfg.shape_caption_rate_end
    shape = cfg.shape_caption_rate + (end - cfg.shape_caption_rate) * epoch / max(1, cfg.epochs - 1)
    if not (0 <= shape and 0 <= cfg.colour_caption_rate and shape + cfg.colour_caption_rate <= 1):
        raise ValueError(f"caption rates must be >= 0 and sum to <= 1: shape {shape:.3f}, "
                         f"colour {cfg.colour_caption_rate} at epoch {epoch + 1}")
    return shape, cfg.colour_caption_rate


def attribute_set_ids(scenes, attribute: str, device) -> torch.Tensor:
    """One id per image for the set of values of an attribute ("shape" / "colour") in its scene."""
    sets = {}
    return torch.tensor([sets.setdefault(frozenset(getattr(o, attribute) for o in sc.objects), len(sets))
                         for sc in scenes], device=device)


def partial_captions(ids: torch.Tensor, idx: np.ndarray, rates: tuple, scenes, tokenizer,
                     rng: np.random.Generator) -> tuple:
    """Replace a share of a batch's caption ids by shape-only and colour-only captions.

    Returns (ids, shape rows [B] bool, colour rows [B] bool)."""
    shape_rate, colour_rate = rates
    u = rng.random(len(idx))
    rows = {"shape": u < shape_rate, "colour": (u >= shape_rate) & (u < shape_rate + colour_rate)}
    ids = ids.clone()
    for kind, make in (("shape", shape_caption), ("colour", colour_caption)):
        picked = np.flatnonzero(rows[kind]).tolist()
        if picked:
            ids[picked] = tokenizer([make(scenes[idx[r]], rng) for r in picked]).to(ids.device)
    return ids, *(torch.from_numpy(rows[k]).to(ids.device) for k in ("shape", "colour"))


def world_records(world_json: str, image_ids) -> tuple:
    """(family id [N], scene) of each image, from a sample world's world.json (KeyError naming unknown images)."""
    records = {r["image_id"]: r for r in json.loads(Path(world_json).read_text())["images"]}
    missing = [i for i in image_ids if i not in records]
    if missing:
        raise KeyError(f"{world_json} does not list images {missing[:3]}")
    family = np.array([records[i]["family_id"] for i in image_ids], dtype=np.int64)
    return family, [Scene.from_json(records[i]) for i in image_ids]


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against a multi-positive target (each row's positives share its mass equally)."""
    target = target / target.sum(dim=1, keepdim=True)
    logp = torch.log_softmax(logits, dim=1)
    return -(target * logp.masked_fill(target == 0, 0.0)).sum(dim=1).mean()


@torch.no_grad()
def image_embeddings(clip: torch.nn.Module, images: torch.Tensor, batch: int = 512) -> np.ndarray:
    """Normalised image embeddings of preprocessed images, in eval mode (for neighbour batches)."""
    clip.eval()
    return torch.cat([F.normalize(clip.encode_image(images[i:i + batch]), dim=-1)
                      for i in range(0, len(images), batch)]).cpu().numpy()


def train_backbone(cfg: BackboneTrainConfig, log: Callable[[str], None] = print) -> Dict:
    """Train, evaluate, and write `cfg.output` (fp16 safetensors) plus a JSON record next to it."""
    from edje.model.device import pick_device

    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    clip = open_clip.create_model(cfg.model).to(device)  # initialised on the CPU: the same start on every device
    tokenizer = open_clip.get_tokenizer(cfg.model)
    size = image_size(clip)
    train = load_annotations(cfg.train_annotations)
    images = preprocess(clip, load_image_files(train.image_paths, size)).to(device)
    # Captions are pre-tokenised once: the tokenizer is slower than the tiny text tower.
    text_ids = tokenizer(train.captions).to(device)
    per_image = train.image_to_captions()
    groups = scenes = None
    partial_rates = [caption_rates(cfg, e) for e in range(cfg.epochs)]  # checks every epoch's rates up front
    if cfg.world:
        groups_np, scenes = world_records(cfg.world, train.image_ids)
        groups = torch.from_numpy(groups_np).to(device)
        shape_sets, colour_sets = (attribute_set_ids(scenes, a, device) for a in ("shape", "colour"))
    if any(sum(r) > 0 for r in partial_rates) and scenes is None:
        raise ValueError("shape/colour captions need the world's scenes: give world=<world.json>")
    evaluation = None
    if cfg.eval_annotations:
        ev = load_annotations(cfg.eval_annotations)
        evaluation = (ev, preprocess(clip, load_image_files(ev.image_paths, size)).to(device))
    steps_per_epoch = math.ceil(train.num_images / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    decay = [p for n, p in clip.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in clip.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    log(f"training {cfg.model}: {train.num_images} images, {len(train.captions)} captions, "
        f"{steps_per_epoch} steps/epoch x {cfg.epochs} epochs")
    history, start, step = [], time.time(), 0
    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    for epoch in range(last):
        # One caption per image per epoch, drawn at random: every caption is seen over the run.
        caption_pick = np.array([rng.choice(per_image[i]) for i in range(train.num_images)])
        clustered = cfg.neighbour_fraction > 0 and epoch + 1 >= cfg.neighbour_start
        if clustered:
            emb = image_embeddings(clip, images)
            clusters = neighbour_clusters(emb, cfg.cluster_size, rng)
            batches = mixed_batches(train.num_images, cfg.batch_size, cfg.neighbour_fraction, clusters, rng)
        else:
            order = rng.permutation(train.num_images)
            batches = [order[b * cfg.batch_size:(b + 1) * cfg.batch_size] for b in range(steps_per_epoch)]
        clip.train()
        losses = []
        # About ten lines an epoch: an epoch of a large set takes minutes with nothing else to show.
        report_every, seen, epoch_start = max(1, len(batches) // 10), 0, time.time()
        for b, idx in enumerate(batches, 1):
            tidx = torch.from_numpy(idx).to(device)
            ids = text_ids[caption_pick[idx]]
            shape_rows = colour_rows = None
            if sum(partial_rates[epoch]) > 0:
                ids, shape_rows, colour_rows = partial_captions(ids, idx, partial_rates[epoch], scenes, tokenizer, rng)
            img = F.normalize(clip.encode_image(images[idx]), dim=-1)
            txt = F.normalize(clip.encode_text(ids), dim=-1)
            logits = clip.logit_scale.exp() * txt @ img.T  # [caption, image]
            eye = torch.eye(len(idx), dtype=torch.bool, device=device)
            positive = eye.clone()
            if shape_rows is not None:  # a shape (colour) caption fits every image with its shape (colour) set
                for rows, sets in ((shape_rows, shape_sets), (colour_rows, colour_sets)):
                    positive |= rows[:, None] & (sets[tidx][:, None] == sets[tidx][None, :])
            if cfg.mask_same_words:
                same = torch.from_numpy(same_words_mask([train.captions[j] for j in caption_pick[idx]])).to(device)
                logits = logits.masked_fill(same & ~positive, float("-inf"))
            if groups is not None:
                g = groups[tidx]
                logits = logits.masked_fill((g[:, None] == g[None, :]) & ~positive, float("-inf"))
            target = positive.float()
            loss = (soft_cross_entropy(logits, target) + soft_cross_entropy(logits.T, target.T)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                clip.logit_scale.clamp_(0, math.log(100))
            losses.append(loss.item())
            step += 1
            seen += len(idx)
            if b % report_every == 0 and b < len(batches):  # the epoch's own line covers its last batch
                spent = time.time() - epoch_start
                log(f"epoch {epoch + 1}/{last} batch {b}/{len(batches)}: running loss {np.mean(losses):.4f}, "
                    f"{seen / max(spent, 1e-9):.0f} images/s, epoch eta {spent / b * (len(batches) - b):.0f} s")
        row = {"epoch": epoch + 1, "step": step, "loss": round(float(np.mean(losses)), 4),
               "caption_rates": [round(r, 3) for r in partial_rates[epoch]],
               "elapsed_s": round(time.time() - start, 1)}
        if evaluation and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == last):
            row["recall"] = zero_shot_recall(clip, tokenizer, *evaluation)
        history.append(row)
        log(json.dumps(row))
        if "recall" in row or epoch + 1 == last:  # a usable checkpoint early; the last overwrites it
            record = _save(clip, cfg, history, time.time() - start, done=epoch + 1 == last)
    return record


def _save(clip: torch.nn.Module, cfg: BackboneTrainConfig, history: list, wall: float, done: bool) -> Dict:
    """Write the fp16 safetensors checkpoint and its JSON record (config, wall time, recall history)."""
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    # fp16 storage keeps the file under 10 MB; open_clip upcasts when it loads the state dict.
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in clip.state_dict().items()}
    save_file(state, str(out), metadata={"model": cfg.model})
    record = {"config": asdict(cfg), "complete": done, "wall_s": round(wall, 1),
              "torch_threads": torch.get_num_threads(), "history": history,
              "final_recall": history[-1].get("recall"), "bytes": out.stat().st_size}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    return record
