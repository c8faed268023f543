"""Contrastive (CLIP) training of a small open_clip backbone on a Karpathy-style caption set.

Used for the embedded default: the project's own tiny backbone, trained on the sample
world. Plain PyTorch on purpose: the model is a few MB, one process trains it in minutes,
and the run is reproducible bit for bit from its config on the same thread count. Given a
storage path, a run checkpoints every few steps and a rerun resumes where it stood, taking the
same batches from there on as a run that was never stopped.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from edje.model.backbone import is_hf_text, text_embeddings_of_ids
from edje.model.backbone_registry import open_clip_registry
from edje.model.image_decode import load_image_files
from edje.model.recall import embedding_recall
from edje.model.text_augment import ALL_OPERATIONS, OPERATIONS, augment_batch, check_text_augment
from edje.sampleworld.captions import colour_caption, shape_caption
from edje.sampleworld.registry import scene_from_json
from edje.sampleworld.scene import Scene
from edje.schemas.annotations import Annotations, load_annotations
from edje.schemas.cli_options import option
from edje.training.hard_batches import mixed_batches, neighbour_clusters, same_words_mask
from edje.training.mirror_pairs import add_mirrors, mirror_pair_mask, mirror_rows, mirrored_captions
from edje.training.orientation_negatives import OrientationNegatives

open_clip = open_clip_registry()  # backbone training builds open_clip models by the project's config names


def device_option():
    """The `--device` option of a trainer: auto (cuda when visible, else cpu) or a torch device."""
    return option(None, cli_default="auto", help="auto (cuda when visible, else cpu), cpu, cuda, cuda:N")


def storage_path_option():
    """The `--storage-path` option of a resumable trainer."""
    return option(None, help="folder that keeps the run's checkpoint; rerunning the same command resumes from it, with "
                  "the same batches from there on as a run never stopped")


def run_name_option():
    """The `--name` option of a resumable trainer: its subfolder of the storage path."""
    return option(None, help="the run's subfolder of --storage-path (default: the --output file's stem)")


def checkpoint_every_option():
    """The `--checkpoint-every` option of a resumable trainer."""
    return option(100, help="steps between checkpoints (with --storage-path; also one at the end)")


@dataclass(frozen=True)
class BackboneTrainConfig:
    """What to train on, for how long, and where the fp16 safetensors checkpoint goes."""

    train_annotations: str = option(flag="--train", required=True,
                                    help="train annotation JSON (images relative to its folder)")
    output: str = option(required=True, help="output .safetensors path (a .json record is written beside it)")
    eval_annotations: Optional[str] = option(None, flag="--eval", help="annotation JSON to report zero-shot recall on")
    model: str = option("edje-tiny-convvit", help="open_clip model name (model/configs/*.json)")
    init: Optional[str] = option(None, help="start from this backbone checkpoint (.safetensors of the same --model, or "
                                 "with --lock-image of one with the same image tower): more epochs on more data, or a "
                                 "fine-tune (a resumed run's own checkpoint wins)")
    epochs: int = option(12)
    batch_size: int = option(256)
    lr: float = option(1e-3)
    weight_decay: float = option(0.1)
    warmup_steps: int = option(50)
    seed: int = option(0)
    eval_every: int = option(4)  # epochs; a checkpoint is written at each evaluation
    stop_after: Optional[int] = option(None, help="train only this many epochs of the --epochs-long LR schedule")
    # ELIP-style hard batches (training/hard_batches.py): this share of each batch is made of
    # clusters of `cluster_size` near neighbours in the current image embedding, from epoch
    # `neighbour_start` on (before that the embedding is too young to say what is similar).
    neighbour_fraction: float = option(0.0, help="share of each batch made of clusters of near neighbours (ELIP hard "
                                       "batches)")
    cluster_size: int = option(8, help="images per neighbour cluster")
    neighbour_start: int = option(2, help="first epoch (1-based) with neighbour batches")
    mask_same_words: bool = option(False, help="leave captions with the same bag of words (binding twins) out of each "
                                   "other's softmax")
    # A sample world's world.json, for two training-only levers: images of one family (binding
    # twins, whose captions share every word) are left out of each other's softmax, as duplicates
    # are in CLIP training; and `shape_caption_rate` of the captions are replaced by ones that name
    # only the scene's shapes (every image with that shape set is then a positive), `colour_caption_rate`
    # by ones that name only its colours (positives: the same colour set). Shape-only captions alone
    # trade colour for shape (BENCHMARKS.md): colour-only ones beside them keep colour in the embedding.
    world: Optional[str] = option(None, help="a sample world's world.json: a family's images are not each other's "
                                  "negatives")
    shape_caption_rate: float = option(0.0, help="share of captions replaced by training-only ones naming only the "
                                       "shapes (needs --world)")
    # The shape rate moves linearly from `shape_caption_rate` (first epoch) to this (last epoch of the
    # schedule); None keeps it constant. High early teaches shape; lower late gives full captions back.
    shape_caption_rate_end: Optional[float] = option(None, help="shape-caption rate at the last epoch (linear from "
                                                     "--shape-caption-rate; default: constant)")
    colour_caption_rate: float = option(0.0, help="share of captions replaced by training-only ones naming only the "
                                        "colours (needs --world)")
    # training/mirror_pairs.py: the mirror and its reversed caption are a hard negative of the original on facing and
    # sides, which a world's family mask (--world) would otherwise never show the contrastive loss.
    mirror_fraction: float = option(0.0, help="share of each batch added again mirrored left-right with the caption's "
                                    "horizontal words reversed (left-facing <-> right-facing), as the original's hard "
                                    "negative; only images whose caption has a horizontal word")
    # training/orientation_negatives.py: a negative that differs from the true caption in the way things face alone.
    orientation_negatives: bool = option(False, help="add each caption's orientation flip (left-facing <-> "
                                         "right-facing, the sides of place kept) as a false caption of its image, "
                                         "balanced so that a blind model of those words is at chance")
    # Both towers start blind to which way things face, and each learns it only from the other's difference: a
    # saddle (B128o's first epoch: the caption and its flip at cosine 0.9999). A text-side push breaks it.
    orientation_text_margin: Optional[float] = option(None, help="with --orientation-negatives: also push the text "
                                                      "embeddings of a caption and its orientation flip below this "
                                                      "cosine (e.g. 0.9)")
    # Where to train: None/"auto" = cuda when visible, else cpu (model/device.py). Runs are reproducible
    # bit for bit per device and thread count, not across devices.
    device: Optional[str] = device_option()
    # Resumable runs: given storage_path, everything the rest of the run depends on (weights, optimiser,
    # LR schedule, RNG states, epoch, step and the epoch's batch plan) is written atomically to
    # storage_path/name every `checkpoint_every` steps and at the end, and a rerun of the same config
    # there resumes from it. name defaults to the output file's stem.
    storage_path: Optional[str] = storage_path_option()
    name: Optional[str] = run_name_option()
    checkpoint_every: int = checkpoint_every_option()
    # LiT (Zhai et al., 2022): the image tower stays as --init wrote it, so tables encoded with it stay valid, and its
    # embeddings are computed once (in eval mode, as serving computes them): a step costs the text tower alone.
    lock_image: bool = option(False, help="train the text tower alone on the --init image tower, left unchanged "
                              "(LiT); image embeddings are computed once")
    # LiT found a pretrained text tower best trained too; training its top layers alone spares most of the backward
    # pass and keeps the lower layers' reading of words the training captions never show.
    unlocked_text_layers: Optional[int] = option(None, help="with a pretrained (HF) text tower: train only its top N "
                                                 "layers and the projection; the rest stays as pretrained (default: "
                                                 "all of it trains)")
    # model/text_augment.py: EDA's and AEDA's word-level operations, for a text tower that reads past phrasing.
    text_augment: float = option(0.0, help="share of the batch's captions rewritten each step by a random swap, "
                                 "deletion or punctuation insertion (EDA, AEDA)")
    text_augment_ops: Tuple[str, ...] = option(OPERATIONS, nargs="+", choices=list(ALL_OPERATIONS), convert=tuple,
                                               help="the rewrites --text-augment draws from (function_words: each "
                                               "function word dropped with probability one half)")

    def __post_init__(self):
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if not 0.0 <= self.mirror_fraction <= 1.0:
            raise ValueError(f"mirror_fraction must be in [0, 1], got {self.mirror_fraction}")
        if self.orientation_text_margin is not None and not self.orientation_negatives:
            raise ValueError("orientation_text_margin works on the orientation negatives: set orientation_negatives")
        check_text_augment(self.text_augment, self.text_augment_ops)
        if self.lock_image and not self.init:
            raise ValueError("lock_image keeps the image tower of --init: give init=<backbone .safetensors>")
        if self.mirror_fraction > 0 and (self.shape_caption_rate or self.colour_caption_rate
                                         or self.shape_caption_rate_end):
            raise ValueError("mirror pairs and the shape- or colour-only captions do not combine: a partial caption "
                             "has no mirrored form")


# What a resumed run may change: where it writes and what it evaluates, never what it trains on or how.
RESUME_MAY_CHANGE = frozenset({"output", "eval_annotations", "eval_every", "stop_after", "device", "storage_path",
                               "name", "checkpoint_every"})
CHECKPOINT = "checkpoint.pt"


def run_folder(cfg: BackboneTrainConfig) -> Optional[Path]:
    """Folder of a resumable run's checkpoint (storage_path/name), or None when the run keeps none."""
    if cfg.storage_path is None:
        return None
    return Path(cfg.storage_path) / (cfg.name or Path(cfg.output).stem)


def save_training_state(folder: Path, state: Dict) -> Path:
    """Write a training checkpoint atomically: a write killed halfway leaves the previous checkpoint whole."""
    folder.mkdir(parents=True, exist_ok=True)
    path, tmp = folder / CHECKPOINT, folder / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(folder, os.O_RDONLY)  # the rename itself survives a crash only once the folder is synced
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_training_state(folder: Path, cfg, may_change: frozenset = RESUME_MAY_CHANGE) -> Optional[Dict]:
    """The run's checkpoint, or None when it has none; ValueError when it was written by a different recipe (an
    option of the config dataclass ``cfg``, other than those in ``may_change``, set otherwise)."""
    path = folder / CHECKPOINT
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    now = asdict(cfg)
    saved = state["config"]
    # An option newer than the checkpoint: its run had the option's default.
    defaults = {f.name: f.default for f in fields(type(cfg))}
    differ = [f"{k}: {saved.get(k, defaults[k])!r} there, {v!r} now" for k, v in now.items()
              if k not in may_change and saved.get(k, defaults[k]) != v]
    if differ:
        raise ValueError(f"{path} was written by a different run ({'; '.join(differ)}); "
                         "use another storage path or name to start afresh")
    return state


def trainer_state(model: torch.nn.Module, opt, sched, rng: np.random.Generator, device: torch.device) -> Dict:
    """The weights, optimiser, schedule and every RNG state a resumed run needs to go on as if never stopped."""
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else []}


def restore_trainer_state(state: Dict, model: torch.nn.Module, opt, sched, rng: np.random.Generator,
                          device: torch.device) -> None:
    """Put back what `trainer_state` saved."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    rng.bit_generator.state = state["numpy_rng"]
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and state["cuda_rng"]:
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def adamw_warmup_cosine(model: torch.nn.Module, lr: float, weight_decay: float, warmup_steps: int, total: int):
    """AdamW over the trainable parameters (no decay on biases, norms and embeddings) and its schedule: a linear
    warm-up, then a cosine to zero at step ``total``."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in trained if not (p.ndim >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup_steps)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    return opt, sched


def preprocess(clip: torch.nn.Module, images_u8) -> torch.Tensor:
    """uint8 [N, S, S, 3] (array or tensor) -> normalised float [N, 3, S, S] with the model's own mean/std."""
    pp = open_clip.get_model_preprocess_cfg(clip)
    x = torch.as_tensor(images_u8).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(pp.get("mean", open_clip.OPENAI_DATASET_MEAN), device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(pp.get("std", open_clip.OPENAI_DATASET_STD), device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def load_init(clip: torch.nn.Module, path: str, model: str, lock_image: bool = False) -> Optional[str]:
    """Load a backbone checkpoint's weights into ``clip`` (ValueError when it was written for another model). With
    ``lock_image``, weights of another model whose image tower is ``model``'s give that tower alone, and the text
    tower starts fresh; returns the other model's name then."""
    with safe_open(path, framework="pt") as f:
        written_for = (f.metadata() or {}).get("model")
    state = {k: v.float() for k, v in load_file(path).items()}
    if written_for is None or written_for == model:
        clip.load_state_dict(state)
        return None
    if not lock_image:
        raise ValueError(f"{path} holds weights of {written_for}, not {model} (with --lock-image its image tower "
                         "can start a new text tower)")
    # LiT with a text tower of another size: the image tower, bit for bit, is all that carries over.
    own = {k: v for k, v in clip.state_dict().items() if k.startswith("visual.")}
    image = {k: v for k, v in state.items() if k.startswith("visual.")}
    differ = sorted(set(own) ^ set(image)) + [k for k in own if k in image and own[k].shape != image[k].shape]
    if differ:
        raise ValueError(f"{path} holds weights of {written_for}, whose image tower is not {model}'s ({differ[0]})")
    clip.load_state_dict(image, strict=False)
    return written_for


def lock_lower_text_layers(clip: torch.nn.Module, unlocked: int) -> None:
    """Freeze an HF text tower's embeddings and all but its top `unlocked` encoder layers (open_clip's own lock knows
    no layer list for BERT); the pooler and projection above them train."""
    encoder = getattr(clip.text.transformer, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None or not 0 <= unlocked <= len(layers):
        raise ValueError(f"--unlocked-text-layers {unlocked}: the text tower is not a BERT-style encoder with that "
                         "many layers")
    for module in [clip.text.transformer.embeddings, *layers[:len(layers) - unlocked]]:
        module.requires_grad_(False)


def image_size(clip: torch.nn.Module) -> int:
    """Square input size of the model's image tower."""
    size = open_clip.get_model_preprocess_cfg(clip).get("size", 224)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


@torch.no_grad()
def zero_shot_recall(clip: torch.nn.Module, tokenizer, ann: Annotations, images: torch.Tensor, batch: int = 512) -> Dict:
    """T2I and I2T R@1/5/10 of the model's own embeddings on an annotation set (``images``: uint8 [N, S, S, 3])."""
    img = image_embeddings(clip, images, batch)
    return embedding_recall(text_embeddings(clip, tokenizer, ann.captions, batch), img, ann.caption_image)


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


def epoch_plan(cfg: BackboneTrainConfig, epoch: int, n: int, embeddings: Callable[[], np.ndarray], per_image,
               rng: np.random.Generator) -> tuple:
    """(caption index per image [N], batches of image indices) of a 0-based epoch: all its sampling (``embeddings``:
    the N images' current embeddings, asked for only when the epoch has neighbour batches)."""
    # One caption per image per epoch, drawn at random: every caption is seen over the run.
    caption_pick = np.array([rng.choice(per_image[i]) for i in range(n)])
    if cfg.neighbour_fraction > 0 and epoch + 1 >= cfg.neighbour_start:
        clusters = neighbour_clusters(embeddings(), cfg.cluster_size, rng)
        return caption_pick, mixed_batches(n, cfg.batch_size, cfg.neighbour_fraction, clusters, rng)
    order = rng.permutation(n)
    return caption_pick, [order[b * cfg.batch_size:(b + 1) * cfg.batch_size] for b in range(math.ceil(n / cfg.batch_size))]


def world_records(world_json: str, image_ids) -> tuple:
    """(family id [N], scene) of each image, from a sample world's world.json (KeyError naming unknown images)."""
    records = {r["image_id"]: r for r in json.loads(Path(world_json).read_text())["images"]}
    missing = [i for i in image_ids if i not in records]
    if missing:
        raise KeyError(f"{world_json} does not list images {missing[:3]}")
    family = np.array([records[i]["family_id"] for i in image_ids], dtype=np.int64)
    return family, [scene_from_json(records[i]) for i in image_ids]


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against a multi-positive target (each row's positives share its mass equally)."""
    target = target / target.sum(dim=1, keepdim=True)
    logp = torch.log_softmax(logits, dim=1)
    return -(target * logp.masked_fill(target == 0, 0.0)).sum(dim=1).mean()


def with_orientation_negatives(clip: torch.nn.Module, img: torch.Tensor, txt: torch.Tensor, by_image: torch.Tensor,
                               target: torch.Tensor, negatives: OrientationNegatives, caption_rows: np.ndarray,
                               captions: list, source: torch.Tensor, rng: np.random.Generator,
                               groups: Optional[torch.Tensor], text_margin: Optional[float] = None) -> tuple:
    """The image->text logits and targets [image, caption] with the drawn orientation flips of the batch's original
    rows added as columns: false for their own image and its family, true where one is a row's own caption; and the
    text-side term: how far each drawn caption and its flip (`txt`: the batch's caption embeddings) sit above
    `text_margin` in cosine, on average, times the logit scale (0 without a margin)."""
    take = negatives.draw(caption_rows, rng)
    if not len(take):
        return by_image, target, img.new_zeros(())
    flipped = text_embeddings_of_ids(clip, negatives.token_ids(caption_rows[take]))
    extra = clip.logit_scale.exp() * img @ flipped.T
    margin = img.new_zeros(())
    if text_margin is not None:  # in logit units, as the contrastive loss counts (the scale itself left alone)
        cos = (txt[torch.from_numpy(take).to(txt.device)] * flipped).sum(-1)
        margin = clip.logit_scale.exp().detach() * F.relu(cos - text_margin).mean()
    match = torch.from_numpy(negatives.matches(caption_rows[take], captions)).to(img.device)
    if groups is not None:  # the family's other images may show the flipped caption: neither a negative nor a target
        rows = torch.from_numpy(take).to(img.device)
        g = groups[source]
        other = (g[:, None] == groups[rows][None, :]) & (source[:, None] != rows[None, :])
        extra = extra.masked_fill(other & ~match, float("-inf"))
    return torch.cat([by_image, extra], 1), torch.cat([target, match.float()], 1), margin


@torch.no_grad()
def image_embeddings(clip: torch.nn.Module, images: torch.Tensor, batch: int = 512, mirrored: bool = False) -> np.ndarray:
    """Normalised image embeddings of uint8 images [N, S, S, 3] (each mirrored left-right first if ``mirrored``), in
    eval mode."""
    clip.eval()
    chunks = (images[i:i + batch] for i in range(0, len(images), batch))
    return torch.cat([F.normalize(clip.encode_image(preprocess(clip, c.flip(2) if mirrored else c)), dim=-1)  # 2: width
                      for c in chunks]).cpu().numpy()


class LockedImageTower:
    """The image tower frozen (LiT): every image's embedding, and its mirror's, computed once, served by batch row."""

    def __init__(self, clip: torch.nn.Module, images: torch.Tensor, with_mirrors: bool):
        for p in clip.visual.parameters():
            p.requires_grad_(False)
        self.plain = torch.from_numpy(image_embeddings(clip, images)).to(images.device)
        self.mirror = (torch.from_numpy(image_embeddings(clip, images, mirrored=True)).to(images.device)
                       if with_mirrors else None)

    def batch(self, idx: np.ndarray, again: Optional[np.ndarray]) -> torch.Tensor:
        """Embeddings of a batch's rows: images ``idx``, then the rows ``again`` of it mirrored (as `add_mirrors`)."""
        rows = [self.plain[torch.from_numpy(idx)]]
        if again is not None and len(again):
            rows.append(self.mirror[torch.from_numpy(idx[again])])
        return torch.cat(rows)


@torch.no_grad()
def text_embeddings(clip: torch.nn.Module, tokenizer, captions: list, batch: int = 512) -> np.ndarray:
    """Normalised text embeddings of captions, in eval mode."""
    clip.eval()
    device = next(clip.parameters()).device
    return torch.cat([text_embeddings_of_ids(clip, tokenizer(captions[i:i + batch]).to(device))
                      for i in range(0, len(captions), batch)]).cpu().numpy()


def train_backbone(cfg: BackboneTrainConfig, log: Callable[[str], None] = print) -> Dict:
    """Train (from storage_path/name's checkpoint when it holds one), evaluate, write `cfg.output` (fp16) and its JSON record."""
    from edje.model.device import pick_device

    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    clip = open_clip.create_model(cfg.model).to(device)  # initialised on the CPU: the same start on every device
    tokenizer = open_clip.get_tokenizer(cfg.model)
    size = image_size(clip)
    train = load_annotations(cfg.train_annotations)
    if cfg.init:
        other = load_init(clip, cfg.init, cfg.model, cfg.lock_image)
        if other:
            start = "a pretrained" if is_hf_text(clip) else "a fresh"
            log(f"the image tower of {other} from {cfg.init}, locked; {start} {cfg.model} text tower")
    if cfg.unlocked_text_layers is not None:
        if not is_hf_text(clip):
            raise ValueError(f"--unlocked-text-layers keeps a pretrained text tower's lower layers: {cfg.model}'s text "
                             "tower is not one (its config names no hf_model_name)")
        lock_lower_text_layers(clip, cfg.unlocked_text_layers)
    # Pixels stay uint8 until a batch needs them: a quarter of the memory of a preprocessed float copy.
    images = torch.from_numpy(load_image_files(train.image_paths, size)).to(device)
    # Captions are pre-tokenised once: the tokenizer is slower than the tiny text tower.
    text_ids = tokenizer(train.captions).to(device)
    mirror_ids = mirrorable = flipped = None
    if cfg.mirror_fraction > 0:
        flipped, mirrorable = mirrored_captions(train.captions)
        mirror_ids = tokenizer(flipped).to(device)
    negatives = OrientationNegatives(train.captions, tokenizer, device) if cfg.orientation_negatives else None
    per_image = train.image_to_captions()
    locked = LockedImageTower(clip, images, cfg.mirror_fraction > 0) if cfg.lock_image else None
    groups = scenes = None
    partial_rates = [caption_rates(cfg, e) for e in range(cfg.epochs)]  # checks every epoch's rates up front
    if cfg.world:
        groups_np, scenes = world_records(cfg.world, train.image_ids)
        if any(sum(r) > 0 for r in partial_rates) and any(sc.kind != Scene.kind for sc in scenes):
            # Their captions name shapes and colours, which an open world's things do not have.
            raise ValueError(f"{cfg.world} is an open world: the shape- and colour-only caption rates are levers of "
                             "the shapes world; train on the open world with both at 0")
        groups = torch.from_numpy(groups_np).to(device)
        shape_sets, colour_sets = (attribute_set_ids(scenes, a, device) for a in ("shape", "colour"))
    if any(sum(r) > 0 for r in partial_rates) and scenes is None:
        raise ValueError("shape/colour captions need the world's scenes: give world=<world.json>")
    evaluation = None
    if cfg.eval_annotations:
        ev = load_annotations(cfg.eval_annotations)
        evaluation = (ev, torch.from_numpy(load_image_files(ev.image_paths, size)).to(device))
    steps_per_epoch = math.ceil(train.num_images / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt, sched = adamw_warmup_cosine(clip, cfg.lr, cfg.weight_decay, cfg.warmup_steps, total)
    log(f"training {cfg.model}: {train.num_images} images, {len(train.captions)} captions, "
        f"{steps_per_epoch} steps/epoch x {cfg.epochs} epochs")
    history, start, step, wall_before, record = [], time.time(), 0, 0.0, None
    first_epoch, batches_done, plan, losses = 0, 0, None, []
    folder = run_folder(cfg)
    resume = load_training_state(folder, cfg) if folder else None
    if resume is not None:
        restore_trainer_state(resume, clip, opt, sched, rng, device)
        history, step, wall_before = resume["history"], resume["step"], resume["wall_s"]
        first_epoch, batches_done, losses = resume["epoch"], resume["batch"], resume["losses"]
        if resume["plan"] is not None:
            plan = (resume["plan"]["caption_pick"].numpy(), [b.numpy() for b in resume["plan"]["batches"]])
        log(f"resumed from {folder / CHECKPOINT} at step {step} (epoch {first_epoch + 1}, batch {batches_done})")
        if resume["torch_threads"] != torch.get_num_threads():
            log(f"note: the checkpoint was written at {resume['torch_threads']} torch threads, this run has "
                f"{torch.get_num_threads()}: it is bit-for-bit an unstopped run's only at the same count")

    def checkpoint(epoch: int, batch: int, plan, losses: list) -> None:
        """Everything the rest of the run depends on, at `batch` batches into 0-based `epoch` (plan None: not drawn)."""
        save_training_state(folder, {
            "config": asdict(cfg), **trainer_state(clip, opt, sched, rng, device),
            "epoch": epoch, "batch": batch, "step": step, "losses": list(losses), "history": history,
            "plan": None if plan is None else {"caption_pick": torch.from_numpy(plan[0]),
                                               "batches": [torch.from_numpy(b) for b in plan[1]]},
            "wall_s": wall_before + time.time() - start, "torch_threads": torch.get_num_threads()})

    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    for epoch in range(first_epoch, last):
        if plan is None:
            embeddings = ((lambda: locked.plain.cpu().numpy()) if locked is not None
                          else (lambda: image_embeddings(clip, images)))
            plan, losses = epoch_plan(cfg, epoch, len(images), embeddings, per_image, rng), []
        caption_pick, batches = plan
        clip.train()
        # About ten lines an epoch: an epoch of a large set takes minutes with nothing else to show.
        report_every, seen, epoch_start = max(1, len(batches) // 10), 0, time.time()
        checkpoint_due = False
        for b, idx in enumerate(batches, 1):
            if b <= batches_done:  # a resumed epoch: these batches were trained before the stop
                continue
            tidx = torch.from_numpy(idx).to(device)
            ids = text_ids[caption_pick[idx]]
            shape_rows = colour_rows = None
            if sum(partial_rates[epoch]) > 0:
                ids, shape_rows, colour_rows = partial_captions(ids, idx, partial_rates[epoch], scenes, tokenizer, rng)
            pixels, captions = images[idx], [train.captions[j] for j in caption_pick[idx]]
            if cfg.text_augment > 0:
                captions, rewritten = augment_batch(captions, cfg.text_augment, rng, ops=cfg.text_augment_ops)
                if rewritten:
                    ids = ids.clone()
                    ids[rewritten] = tokenizer([captions[r] for r in rewritten]).to(device)
            source = torch.arange(len(idx), device=device)  # each row's row among the batch's originals
            again = None
            if mirror_ids is not None:
                again = mirror_rows(mirrorable[caption_pick[idx]], cfg.mirror_fraction, rng)
                rows = caption_pick[idx[again]]
                pixels, ids, captions, source = add_mirrors(pixels, ids, captions, again, mirror_ids[rows],
                                                            [flipped[j] for j in rows])
            if locked is not None:
                img = locked.batch(idx, again)
            else:
                img = F.normalize(clip.encode_image(preprocess(clip, pixels)), dim=-1)
            txt = text_embeddings_of_ids(clip, ids)
            logits = clip.logit_scale.exp() * txt @ img.T  # [caption, image]
            eye = torch.eye(len(source), dtype=torch.bool, device=device)
            positive = eye.clone()
            if shape_rows is not None:  # a shape (colour) caption fits every image with its shape (colour) set
                for rows, sets in ((shape_rows, shape_sets), (colour_rows, colour_sets)):
                    positive |= rows[:, None] & (sets[tidx][:, None] == sets[tidx][None, :])
            # An image and its mirror are each other's negatives even where a mask below would hide them.
            keep = positive | mirror_pair_mask(source)
            if cfg.mask_same_words:
                same = torch.from_numpy(same_words_mask(captions)).to(device)
                logits = logits.masked_fill(same & ~keep, float("-inf"))
            if groups is not None:
                g = groups[tidx][source]
                logits = logits.masked_fill((g[:, None] == g[None, :]) & ~keep, float("-inf"))
            target = positive.float()
            by_image, image_target, text_margin = logits.T, target.T, 0.0
            if negatives is not None:
                by_image, image_target, text_margin = with_orientation_negatives(
                    clip, img, txt, by_image, image_target, negatives, caption_pick[idx], captions, source, rng,
                    None if groups is None else groups[tidx], cfg.orientation_text_margin)
            loss = (soft_cross_entropy(logits, target) + soft_cross_entropy(by_image, image_target)) / 2 + text_margin
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                clip.logit_scale.clamp_(0, math.log(100))
            losses.append(loss.item())
            step += 1
            seen += len(source)
            if folder and step % cfg.checkpoint_every == 0:
                if b < len(batches):
                    checkpoint(epoch, b, plan, losses)
                else:  # after the epoch's row, so a resumed run does not evaluate it again
                    checkpoint_due = True
            if b % report_every == 0 and b < len(batches):  # the epoch's own line covers its last batch
                spent = time.time() - epoch_start
                done_here = b - batches_done
                log(f"epoch {epoch + 1}/{last} batch {b}/{len(batches)}: running loss {np.mean(losses):.4f}, "
                    f"{seen / max(spent, 1e-9):.0f} images/s, epoch eta {spent / done_here * (len(batches) - b):.0f} s")
        row = {"epoch": epoch + 1, "step": step, "loss": round(float(np.mean(losses)), 4),
               "caption_rates": [round(r, 3) for r in partial_rates[epoch]],
               "elapsed_s": round(wall_before + time.time() - start, 1)}
        if evaluation and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == last):
            row["recall"] = zero_shot_recall(clip, tokenizer, *evaluation)
        history.append(row)
        log(json.dumps(row))
        plan, batches_done = None, 0
        if folder and (checkpoint_due or epoch + 1 == last):
            checkpoint(epoch + 1, 0, None, [])
        if "recall" in row or epoch + 1 == last:  # a usable checkpoint early; the last overwrites it
            record = save_backbone(clip, cfg, history, wall_before + time.time() - start, done=epoch + 1 == last)
    if record is None:  # resumed after its last epoch: nothing left to train, the weights are the checkpoint's
        record = save_backbone(clip, cfg, history, wall_before, done=True)
    return record


def save_backbone(clip: torch.nn.Module, cfg, history: list, wall: float, done: bool) -> Dict:
    """Write the fp16 safetensors checkpoint of a training config's ``output`` and its JSON record (config, wall time,
    recall history)."""
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
